//! Structure-aware mutation fuzzing of the loader (issue 12, item 1): seeded from real synthetic
//! checkpoints (three recipes, one file and sharded with an index), each run applies 1–3
//! mutations — truncations, byte flips (anywhere or inside a shard's header), safetensors header
//! edits (offsets, dtypes, shapes, huge numbers, a duplicated or dropped name, a lying header
//! length), `config.json` / quantization-config edits (huge, negative, zero, fractional,
//! wrong-typed or missing fields, odd layer patterns), index edits (missing, foreign or huge
//! shard lists) — and loads the directory. Every outcome must be a load or a refusal: a panic is a
//! crash, and a load that takes longer than [`SLOW`] is reported too.
//!
//! CI runs a short seeded pass; a long one is `NEMOTRON_FUZZ_SECONDS=600 NEMOTRON_FUZZ_SEED=S
//! cargo test --release -p nemotron-loader --test fuzz -- --nocapture` (see docs/RELIABILITY.md).
//! No coverage-guided fuzzer is used: cargo-fuzz needs a nightly toolchain, which this project's
//! machines do not have.

use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron_loader::Checkpoint;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A load slower than this is reported (a refusal must not cost in proportion to a claim).
const SLOW: Duration = Duration::from_secs(5);

/// splitmix64, seeded per run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Numbers a hostile file would claim.
fn hostile_number(r: &mut Rng) -> Value {
    match r.below(12) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1u64 << 40),
        3 => json!(1_000_000_000u64),
        4 => json!(u64::MAX),
        5 => json!(1.5),
        6 => json!("12"),
        7 => json!(null),
        8 => json!(1e300),
        9 => json!(r.below(64)),
        10 => json!(-1e9),
        _ => json!([1, 2]),
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("fuzz dir")
        .map(|e| e.expect("entry").path())
        .collect();
    v.sort();
    v
}

/// A shard's header JSON and the bytes after it.
fn split_shard(bytes: &[u8]) -> Option<(Value, Vec<u8>)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let h = bytes.get(8..8usize.checked_add(n)?)?;
    Some((serde_json::from_slice(h).ok()?, bytes[8 + n..].to_vec()))
}

fn join_shard(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Edits one tensor entry of a safetensors header (or the header length itself).
fn mutate_header(r: &mut Rng, bytes: &[u8]) -> Option<Vec<u8>> {
    let (mut h, data) = split_shard(bytes)?;
    let obj = h.as_object_mut()?;
    let names: Vec<String> = obj
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let name = r.pick(&names).clone();
    let mut duplicate = None;
    match r.below(9) {
        0 => {
            let i = r.below(2);
            *obj.get_mut(&name)?.get_mut("data_offsets")?.get_mut(i)? = hostile_number(r)
        }
        1 => {
            let o = obj.get(&name)?.get("data_offsets")?.clone();
            *obj.get_mut(&name)?.get_mut("data_offsets")? = json!([o[1], o[0]]);
        }
        2 => {
            *obj.get_mut(&name)?.get_mut("dtype")? =
                json!(r.pick(&["F8_E4M3", "U8", "BF16", "F32", "F16", "I64", "F4", "bogus", ""]))
        }
        3 => {
            let shape = obj.get_mut(&name)?.get_mut("shape")?.as_array_mut()?;
            if shape.is_empty() {
                shape.push(hostile_number(r));
            } else {
                let i = r.below(shape.len());
                shape[i] = hostile_number(r);
            }
        }
        4 => {
            let shape = obj.get_mut(&name)?.get_mut("shape")?.as_array_mut()?;
            match r.below(3) {
                0 => shape.push(json!(1)),
                1 => {
                    shape.pop();
                }
                _ => shape.reverse(),
            }
        }
        5 => {
            obj.remove(&name);
        }
        6 => duplicate = Some(name.clone()),
        7 => {
            let other = r.pick(&names).clone();
            let v = obj.get(&other)?.clone();
            obj.insert(name.clone(), v);
        }
        _ => {
            // The header length claims more or less than it holds.
            let s = h.to_string();
            let mut out = join_shard(&s, &data);
            let n = match r.below(3) {
                0 => u64::MAX,
                1 => s.len() as u64 + 1 + r.below(1 << 20) as u64,
                _ => r.below(s.len()) as u64,
            };
            out[..8].copy_from_slice(&n.to_le_bytes());
            return Some(out);
        }
    }
    let mut s = h.to_string();
    if let Some(n) = duplicate {
        // JSON with the same key twice (serde_json objects cannot hold it): splice a copy in.
        let key = format!("\"{n}\":");
        let at = s.find(&key)?;
        let end = at + key.len() + s[at + key.len()..].find('}')? + 1;
        let entry = s[at..end].to_string();
        s.insert_str(1, &format!("{entry},"));
    }
    Some(join_shard(&s, &data))
}

/// A random leaf path of a JSON value.
fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                path.push(k.clone());
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) if !a.is_empty() && a.len() <= 64 => {
            for (i, x) in a.iter().enumerate() {
                path.push(i.to_string());
                leaves(x, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

fn at_path<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Object(m) => m.get_mut(k),
        Value::Array(a) => a.get_mut(k.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Edits one leaf of a JSON file (config, quantization config, index).
fn mutate_json(r: &mut Rng, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    let mut all = vec![];
    leaves(&v, &mut vec![], &mut all);
    let path = r.pick(&all).clone();
    match r.below(6) {
        0 => {
            let (last, parent) = path.split_last()?;
            match at_path(&mut v, parent)? {
                Value::Object(m) => {
                    m.remove(last);
                }
                Value::Array(a) => {
                    a.pop();
                }
                _ => {}
            }
        }
        1 => {
            *at_path(&mut v, &path)? = json!(r.pick(&[
                "M*E-",
                "",
                "MMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMM",
                "X",
                "NVFP4",
                "FP8",
                "W4A16_NVFP4",
                "MIXED_PRECISION",
                "../../etc/passwd",
                "model-00001-of-00002.safetensors",
                "*"
            ]))
        }
        2 => {
            // A huge list where a list stood (an index naming 10^5 shards, 10^5 layers, …).
            let n = 100_000;
            *at_path(&mut v, &path)? = json!(vec!["model.safetensors"; n]);
        }
        _ => *at_path(&mut v, &path)? = hostile_number(r),
    }
    serde_json::to_vec_pretty(&v).ok()
}

/// Applies one mutation to one file of `dir`.
fn mutate(r: &mut Rng, dir: &Path) {
    let fs = files(dir);
    let f = r.pick(&fs).clone();
    let bytes = std::fs::read(&f).expect("read a fuzz file");
    let is_shard = f.extension().is_some_and(|e| e == "safetensors");
    let out = match r.below(if is_shard { 5 } else { 4 }) {
        0 => Some(bytes[..r.below(bytes.len() + 1)].to_vec()),
        1 => {
            let mut b = bytes.clone();
            // Bias towards the header: its first bytes hold the length and the JSON.
            let span = if is_shard && r.below(2) == 0 {
                b.len().min(4096)
            } else {
                b.len()
            };
            for _ in 0..1 + r.below(8) {
                if span > 0 {
                    let i = r.below(span);
                    b[i] ^= 1 << r.below(8);
                }
            }
            Some(b)
        }
        2 if f.file_name().is_some_and(|n| n == "config.json") && r.below(4) == 0 => {
            std::fs::remove_file(&f).expect("remove");
            None
        }
        _ if is_shard => mutate_header(r, &bytes),
        _ => mutate_json(r, &bytes),
    };
    if let Some(out) = out {
        std::fs::write(&f, out).expect("write a fuzz file");
    }
}

/// Seeds: one file and sharded, three recipes.
fn seeds(root: &Path) -> Vec<PathBuf> {
    let mut v = vec![];
    for (i, (recipe, shard)) in [
        (SynthRecipe::LightningMixed, 0u64),
        (SynthRecipe::LightningMixed, 60_000),
        (SynthRecipe::NanoNvfp4, 80_000),
        (SynthRecipe::Bf16, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let d = root.join(format!("seed{i}"));
        let opts = SynthOptions {
            recipe,
            seed: 5 + i as u64,
            max_shard_bytes: shard,
            misalign: i == 1,
        };
        write_checkpoint(&d, &Geometry::tiny(), &opts).expect("a seed checkpoint");
        Checkpoint::load(&d).expect("every seed loads");
        v.push(d);
    }
    v
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Distinct outcomes, by the refusal's message with its numbers and quoted names blanked: a
/// rough count of the refusal paths the run reached.
fn outcome_key(msg: &str) -> String {
    let mut k = String::new();
    let mut quoted = false;
    for c in msg.chars() {
        if c == '`' || c == '"' {
            quoted = !quoted;
            k.push('_');
        } else if !quoted && !c.is_ascii_digit() {
            k.push(c);
        }
    }
    k.chars().take(80).collect()
}

#[test]
fn mutated_checkpoints_are_refused_or_loaded_never_a_panic() {
    let seconds = env_u64("NEMOTRON_FUZZ_SECONDS", 30);
    let seed = env_u64("NEMOTRON_FUZZ_SEED", 1);
    let root = tempfile::tempdir().expect("tempdir");
    let seeds = seeds(root.path());
    let work = root.path().join("work");
    let mut r = Rng(seed);
    let (mut runs, mut loads) = (0u64, 0u64);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut crashes: Vec<String> = vec![];
    let mut slow: Vec<String> = vec![];
    let hook = std::panic::take_hook();
    // The panic's location, for the report (the message alone rarely says where).
    static WHERE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
    // Panics of the harness itself (outside a load) are printed as usual.
    static IN_LOAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    std::panic::set_hook(Box::new(|info| {
        if !IN_LOAD.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("fuzz harness panic: {info}");
            return;
        }
        if let (Some(l), Ok(mut w)) = (info.location(), WHERE.lock()) {
            // The first frame in this project's code, where the panic sits in the library's.
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let ours = bt
                .lines()
                .skip_while(|l| !l.contains("nemotron_loader::"))
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            *w = format!("{}:{} {}", l.file(), l.line(), ours.trim());
        }
    }));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(seconds) {
        let src = r.pick(&seeds).clone();
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).expect("work dir");
        for f in files(&src) {
            std::fs::copy(&f, work.join(f.file_name().expect("name"))).expect("copy");
        }
        let n = 1 + r.below(3);
        let state = r.0;
        for _ in 0..n {
            mutate(&mut r, &work);
        }
        let t = Instant::now();
        IN_LOAD.store(true, std::sync::atomic::Ordering::Relaxed);
        let res = std::panic::catch_unwind(|| Checkpoint::load(&work).map(|_| ()));
        IN_LOAD.store(false, std::sync::atomic::Ordering::Relaxed);
        let took = t.elapsed();
        runs += 1;
        let what = format!("seed dir {src:?}, rng state {state:#x}, {n} mutations");
        match res {
            Ok(Ok(())) => loads += 1,
            Ok(Err(e)) => {
                let m = e.to_string().replace(&*work.to_string_lossy(), "DIR");
                *outcomes.entry(outcome_key(&m)).or_default() += 1
            }
            Err(p) => {
                let m = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let at = WHERE.lock().map(|w| w.clone()).unwrap_or_default();
                crashes.push(format!("{what}: panic {m:?} at {at}"));
            }
        }
        if took > SLOW {
            slow.push(format!("{what}: {took:?}"));
        }
    }
    std::panic::set_hook(hook);
    eprintln!(
        "fuzz: seed {seed}, {:.0} s, {runs} runs ({:.0}/s), {loads} loaded, {} refused by {} distinct messages, {} crashes, {} slow",
        t0.elapsed().as_secs_f64(),
        runs as f64 / t0.elapsed().as_secs_f64(),
        runs - loads - crashes.len() as u64,
        outcomes.len(),
        crashes.len(),
        slow.len()
    );
    let mut top: Vec<(&String, &u64)> = outcomes.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    for (k, n) in top.into_iter().take(12) {
        eprintln!("  {n:>7} × {k}");
    }
    assert!(runs > 0, "the fuzz loop ran nothing");
    assert!(
        crashes.is_empty() && slow.is_empty(),
        "crashes: {crashes:#?}\nslow: {slow:#?}"
    );
}
