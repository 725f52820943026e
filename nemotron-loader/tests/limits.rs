//! Resource limits before allocation (issue 12, item 2): checkpoints that claim far more than
//! they hold — a 2^40-byte tensor, a 2^60-byte header, an index naming a million shards, an index
//! file of 100 MiB, a 10^12-token vocabulary, 10^9 experts — are refused by name, quickly, with the
//! process's peak resident memory staying small (read from `/proc/self/status`' `VmHWM`, the
//! high-water mark, so an allocation freed before the refusal still counts).
//!
//! One test in its own binary: the high-water mark is process-wide.

use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron_loader::Checkpoint;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Peak resident set so far, bytes (Linux).
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb << 10
}

fn checkpoint(shards: bool) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        recipe: SynthRecipe::LightningMixed,
        seed: 3,
        max_shard_bytes: if shards { 64 << 10 } else { 0 },
        misalign: false,
    };
    write_checkpoint(d.path(), &Geometry::tiny(), &opts).unwrap();
    d
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, v.to_string()).unwrap();
}

/// A safetensors file whose header is `header` (JSON) followed by `data` bytes.
fn shard(path: &Path, header: &str, data: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    f.write_all(&vec![0u8; data]).unwrap();
}

/// Loads `dir` in a thread with a deadline; returns the refusal, its time and the peak growth.
fn refuse(dir: &Path) -> (String, Duration, u64) {
    let before = peak_rss();
    let t0 = Instant::now();
    let d = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Checkpoint::load(&d).map(|_| ()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{}: no answer within 20 s", dir.display()));
    let took = t0.elapsed();
    let err = r.expect_err("a hostile checkpoint loaded").to_string();
    (err, took, peak_rss().saturating_sub(before))
}

#[test]
fn claims_past_what_a_file_holds_are_refused_cheaply() {
    // Warm up allocator and the synthetic writer, then take the baseline.
    let _ = checkpoint(false);
    let mut rows = vec![];
    let mut case = |name: &str, dir: &Path, needles: &[&str]| {
        let (err, took, grew) = refuse(dir);
        for n in needles {
            assert!(err.contains(n), "{name}: {err:?} does not mention {n:?}");
        }
        rows.push(format!(
            "{name}: refused in {:.3} s, peak RSS +{:.1} MiB: {err}",
            took.as_secs_f64(),
            grew as f64 / (1 << 20) as f64
        ));
        assert!(took < Duration::from_secs(5), "{name}: {took:?}");
        assert!(
            grew < 48 << 20,
            "{name}: the peak grew by {} MiB",
            grew >> 20
        );
    };

    // A tensor claiming 2^40 bytes in a file of a few hundred.
    let d = checkpoint(false);
    let huge = format!(
        r#"{{"backbone.embeddings.weight":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}}"#,
        1u64 << 40,
        1u64 << 40
    );
    shard(&d.path().join("model.safetensors"), &huge, 64);
    case(
        "2^40-byte tensor",
        d.path(),
        &[
            "model.safetensors",
            "backbone.embeddings.weight",
            "1099511627776",
        ],
    );

    // A header length prefix of 2^60.
    let d = checkpoint(false);
    let mut f = std::fs::File::create(d.path().join("model.safetensors")).unwrap();
    f.write_all(&(1u64 << 60).to_le_bytes()).unwrap();
    f.write_all(b"{}").unwrap();
    drop(f);
    case("2^60-byte header", d.path(), &["model.safetensors"]);

    // An index naming a million shards (a 30 MB file; none of them exists).
    let d = checkpoint(true);
    let idx = d.path().join("model.safetensors.index.json");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&idx).unwrap());
    write!(w, r#"{{"metadata":{{}},"weight_map":{{"#).unwrap();
    for i in 0..1_000_000u32 {
        let sep = if i == 0 { "" } else { "," };
        write!(w, r#"{sep}"t.{i}":"s{i}.safetensors""#).unwrap();
    }
    write!(w, "}}}}").unwrap();
    drop(w);
    case(
        "index naming 10^6 shards",
        d.path(),
        &["index", "65536 shards"],
    );

    // An index file of 100 MiB (sparse: refused by its size, never read).
    let d = checkpoint(true);
    let f = std::fs::File::create(d.path().join("model.safetensors.index.json")).unwrap();
    f.set_len(100 << 20).unwrap();
    drop(f);
    case("100 MiB index", d.path(), &["index", "64 MiB"]);

    // A 10^12-token vocabulary.
    let d = checkpoint(false);
    edit_config(d.path(), |v| v["vocab_size"] = 1_000_000_000_000u64.into());
    case("vocab_size 10^12", d.path(), &["vocab_size"]);

    // 10^9 routed experts.
    let d = checkpoint(false);
    edit_config(d.path(), |v| {
        v["n_routed_experts"] = 1_000_000_000u64.into()
    });
    case("n_routed_experts 10^9", d.path(), &["n_routed_experts"]);

    for r in &rows {
        eprintln!("{r}");
    }
}
