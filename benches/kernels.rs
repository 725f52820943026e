//! The device-timed kernel table at the Lightning shapes (no model): each op timed as N
//! back-to-back launches between two syncs, and as the same N launches captured once and replayed
//! (the launch gaps gone: device time), with bytes, GB/s and % of the copy ceiling measured in the
//! same run (FLOP/s for the matmuls). The batch-1 and small-batch rows' launches rotate over
//! copies of their weights (or disjoint expert choices) past the L2, as the model streams them
//! (`--warm`: one copy). A `cargo bench` target (`harness = false`), not built by
//! `cargo test`:
//!
//! `cargo bench --bench kernels --features cuda -- --backend cuda --dtype bf16 [--repeats 5]
//!  [--mma-min SETTING] [--only NAME,NAME]`
//!
//! (`--backend wgpu` with `--features wgpu`; the host backends run it too, slowly.) `--mma-min`
//! takes `bench`'s syntax ([`nemotron::kernels::cube::settings::Settings::parse`]) and sets what
//! every row runs with; a row that compares paths changes only the thresholds that choose them,
//! through the same `Settings`, and restores the settings in force after each launch.

use burn::tensor::{DType as BDType, Device, Int, Tensor, TensorData};
use clap::Parser;
use nemotron::kernels::cube::plans::matmul::TiledKernel;
use nemotron::kernels::cube::settings::Settings;
use nemotron::kernels::rng::Lcg;
use nemotron::kernels::{ops, Epilogue, Fp8Matrix, Fp8Weights, Nvfp4Matrix, Nvfp4Weights};
use nemotron::{dtype_name, BackendKind, DType};
use std::rc::Rc;
use std::time::Instant;

#[derive(Parser, Clone)]
struct Args {
    #[arg(long, default_value = "flex")]
    backend: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Timed repeats per row (at least 5); the median is printed.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// One kernel setting (`bench --mma-min`'s syntax) instead of the library's defaults.
    #[arg(long)]
    mma_min: Option<String>,
    /// Only the rows whose names contain one of these strings, separated by `|` where the text
    /// holds one (row names hold commas: "…tensor cores, quantized in-kernel"), else by commas
    /// (all rows when not given).
    #[arg(long)]
    only: Option<String>,
    /// Each row's weights as one copy, read by every launch of a timing (the table before
    /// session 41): a working set below the L2 (50 MB on an H100 or H200) is then partly served
    /// from it, which the model, streaming every weight once a token, never is. By default the
    /// launches rotate over copies ([`Cold`]).
    #[arg(long)]
    warm: bool,
    /// What `cargo bench` passes to every bench target; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let a = Args::parse();
    let r = (|| -> Res<()> {
        let kind: BackendKind = a.backend.parse()?;
        let dtype: DType = a.dtype.parse()?;
        if a.repeats < 5 {
            return Err(format!(
                "--repeats {}: at least 5 (the median of fewer is noise)",
                a.repeats
            )
            .into());
        }
        let dev = kind.device(dtype)?;
        if let Some(s) = &a.mma_min {
            Settings::parse(s)
                .and_then(|s| s.apply())
                .map_err(|e| format!("--mma-min {e}"))?;
        }
        kernels(&a, &dev, dtype.burn())
    })();
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Runs `f` with every plain and slot-major tensor-core path from `min.0` rows and grouped
/// routing from `min.1` slots (`usize::MAX`: off), and FP8 rows quantized in-kernel up to `inq`
/// where given; every other setting as in force (`--mma-min`'s included), and all of them
/// restored after.
fn with_paths(min: (usize, usize), inq: Option<usize>, f: impl FnOnce()) {
    let saved = Settings::current();
    let mut s = saved.clone();
    (s.min.nvfp4, s.min.fp8, s.min.dense, s.min.slot_major) = (min.0, min.0, min.0, min.0);
    s.min.grouped = min.1;
    if let Some(q) = inq {
        s.fp8_inq_max = q;
    }
    // Only the thresholds change; the tuning in force was accepted when it was set.
    s.apply().expect("thresholds apply");
    f();
    saved.apply().expect("the settings in force apply again");
}

/// Bytes of distinct weights a timing's launches rotate over (four times an H100's or H200's
/// 50 MB L2), so that no launch finds its weights in L2 from the launches before it. With one
/// copy, the batch-1 FP8 `in_proj` (27.7 MB) read at up to 112 % of the DRAM copy ceiling and the
/// same routed kernel (22.4 MB) under the same setting at 12.8 or 15.5–15.6 µs from process to
/// process (PERF §40).
const COLD_BYTES: f64 = 200e6;

/// Most copies of one row's weights (its small rows stay partly warm: they are latency-bound).
const COLD_MAX_COPIES: usize = 64;

/// Items a row's launches take in turn (weights, or routed rows' expert choices): one per launch,
/// cycling, the captured graph replaying the same order.
struct Cold<T> {
    items: Vec<T>,
    next: std::cell::Cell<usize>,
}

impl<T> Cold<T> {
    fn new(items: Vec<T>) -> Self {
        assert!(!items.is_empty(), "a row needs at least one item");
        Cold {
            items,
            next: std::cell::Cell::new(0),
        }
    }

    /// The next item (round-robin).
    fn take(&self) -> &T {
        let i = self.next.get();
        self.next.set((i + 1) % self.items.len());
        &self.items[i]
    }
}

/// Copies of a row's weights of `bytes` for [`COLD_BYTES`] (1 with `--warm`).
fn copies(a: &Args, bytes: f64) -> usize {
    if a.warm {
        1
    } else {
        ((COLD_BYTES / bytes.max(1.0)).ceil() as usize).clamp(1, COLD_MAX_COPIES)
    }
}

/// Disjoint choices of `slots` experts among `experts` (as many as fit, at least one; `--warm`:
/// the one fixed choice `first`) for a routed row's launches to rotate over.
fn expert_sets(a: &Args, experts: usize, slots: usize, first: &[i32]) -> Vec<Vec<i32>> {
    if a.warm || experts < 2 * slots {
        return vec![first.to_vec()];
    }
    (0..experts / slots)
        .map(|s| (0..slots).map(|j| (s * slots + j) as i32).collect())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn sync(dev: &Device) {
    dev.sync().expect("device sync");
}

/// One kernel-table row: an op at one shape, its bytes and FLOPs.
struct Row<'a> {
    name: String,
    bytes: f64,
    flops: f64,
    op: Box<dyn FnMut() + 'a>,
}

/// Times `op` as `n` back-to-back launches between two syncs, and as `n` launches captured once
/// and replayed (CUDA graph; the closure re-run elsewhere): seconds per op, (eager, replayed).
fn device_time(dev: &Device, op: &mut dyn FnMut(), n: usize, reps: usize) -> (f64, f64) {
    for _ in 0..3 {
        op();
    }
    sync(dev);
    let mut eager = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..n {
            op();
        }
        sync(dev);
        eager.push(t.elapsed().as_secs_f64() / n as f64);
    }
    let mut g = burn::tensor::capture(dev, || {
        for _ in 0..n {
            op();
        }
    });
    sync(dev);
    let mut replay = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        // Safety: the op's inputs are owned by the closure's captures and outlive the graph.
        unsafe {
            g.replay();
        }
        sync(dev);
        replay.push(t.elapsed().as_secs_f64() / n as f64);
    }
    (median(eager), median(replay))
}

/// What one captured graph of a row may allocate, counted as launches × the row's bytes: a
/// launch's outputs and scratch stay reserved for the graph's life, and the decoded path's
/// 8,192-row rows allocate ≈ 0.4 GB a launch (an f32 output of 337 MB and the decoded weights),
/// so 50 of them ran an 80 GB H100 out of memory (PERF §32).
const LAUNCH_BYTES: f64 = 4.0e9;

/// Launches per timing of a row of `bytes`: `n`, or as many as [`LAUNCH_BYTES`] allows (at
/// least 3, so a median still has something to take).
fn launches_for(bytes: f64, n: usize) -> usize {
    ((LAUNCH_BYTES / bytes.max(1.0)) as usize).clamp(3, n)
}

/// The device-timed kernel table at the Lightning shapes.
fn kernels(a: &Args, dev: &Device, dtype: BDType) -> Res<()> {
    let (n, reps) = (50, a.repeats);
    let esize = if dtype == BDType::F32 { 4.0 } else { 2.0 };
    let mut rng = Lcg::new(1);
    let act = |rng: &mut Lcg, shape: Vec<usize>| -> Tensor<2> {
        let len = shape.iter().product();
        Tensor::<1>::from_data(TensorData::new(rng.vec(len, 1.0), [len]), (dev, dtype))
            .reshape([shape[0], len / shape[0]])
    };
    // The copy ceiling in this run: a 1 GiB buffer read and written.
    let big = Tensor::<1>::from_data(
        TensorData::new(vec![1.0f32; 1 << 28], [1 << 28]),
        (dev, BDType::F32),
    );
    let (ce, cr) = device_time(dev, &mut || drop(big.clone() + 1.0), 10, reps);
    let ceiling = 2.0 * (1u64 << 30) as f64 / ce.min(cr);
    println!(
        "kernel table ({}, activations {}; µs per op call; eager = {n} launches between two syncs \
         (fewer for rows past {} MB, see launches_for), replay = the same launches as one \
         captured graph; median of {reps})",
        a.backend,
        dtype_name(dtype),
        LAUNCH_BYTES / (n as f64 * 1e6)
    );
    println!(
        "copy ceiling measured here: {:.0} GB/s (1 GiB read + written; eager {:.1} µs, replay {:.1} µs)",
        ceiling / 1e9,
        ce * 1e6,
        cr * 1e6
    );
    println!(
        "{}",
        if a.warm {
            "weights warm (--warm): every launch of a row reads the same copy, partly from L2"
                .to_string()
        } else {
            format!(
                "weights cold: the batch-1 and small-batch rows rotate over copies (or disjoint \
                 expert choices) of up to {:.0} MB, at most {COLD_MAX_COPIES} copies",
                COLD_BYTES / 1e6
            )
        }
    );
    let nvfp4 = |rng: &mut Lcg, e: usize, nout: usize, k: usize| -> Vec<Nvfp4Matrix> {
        (0..e)
            .map(|_| Nvfp4Matrix {
                out_features: nout,
                in_features: k,
                packed: rng.bytes(nout * k / 2),
                // Scale bytes kept below 0x7F so none decodes to NaN.
                block_scales: rng
                    .bytes(nout * k / 16)
                    .into_iter()
                    .map(|b| 0x30 + (b % 16))
                    .collect(),
                global_scale: 1e-3,
            })
            .collect()
    };
    let fp8 = |rng: &mut Lcg, nout: usize, k: usize| -> Fp8Matrix {
        Fp8Matrix {
            out_features: nout,
            in_features: k,
            weight: rng.bytes(nout * k).into_iter().map(|b| b & 0x7E).collect(),
            weight_scale: 1e-3,
            input_scale: 1e-2,
        }
    };
    let mut rows: Vec<Row> = vec![];
    // Batch 1 on both paths: the GEMVs, and the tensor cores with one token of eight used
    // (routed: slot-major, one cube row per slot).
    let gemv = (usize::MAX, usize::MAX);
    let tc = (1usize, 1usize);
    let tc1 = (1usize, usize::MAX);
    let b1_paths = [("GEMV", gemv), ("tensor cores", tc1)];
    for (k, nout) in [
        (2688, 1856),
        (1856, 2688),
        (2688, 3712),
        (3712, 2688),
        (2688, 10304),
        (4096, 2688),
        (2688, 131072),
    ] {
        let wbytes = (nout * k / 2 + nout * k / 16) as f64;
        let w = Rc::new(Cold::new(
            (0..copies(a, wbytes))
                .map(|_| Nvfp4Weights::upload(&nvfp4(&mut rng, 1, nout, k), dev))
                .collect(),
        ));
        let x = act(&mut rng, vec![1, k]);
        for (path, min) in b1_paths {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("NVFP4 GEMV {k}→{nout} {path}"),
                bytes: wbytes + esize * (k + nout) as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, None, || {
                        drop(ops::nvfp4_linear(x.clone(), w.take(), Epilogue::None));
                    });
                }),
            });
        }
    }
    // The routed experts at batch 1: six slots of 128 experts, and eight of 130 (the shared
    // expert of width 3712 folded in as experts 128 and 129, `SharedExpert::Fold`: compare with
    // the six-slot row plus the 2688→3712 / 3712→2688 GEMV rows above).
    for (k, nout, div, epi, slots) in [
        (2688, 1856, 6, Epilogue::Relu2, 6usize),
        (1856, 2688, 1, Epilogue::None, 6),
        (2688, 1856, 8, Epilogue::Relu2, 8),
        (1856, 2688, 1, Epilogue::None, 8),
    ] {
        let experts = 128 + slots - 6;
        let w = Nvfp4Weights::upload(&nvfp4(&mut rng, experts, nout, k), dev);
        let x = act(&mut rng, vec![slots / div, k]);
        let chosen: Vec<i32> = [3i32, 17, 42, 77, 90, 121, 128, 129][..slots].to_vec();
        // Disjoint expert choices in turn (the stack is 364 MB): each launch reads cold weights.
        let idx = Rc::new(Cold::new(
            expert_sets(a, experts, slots, &chosen)
                .into_iter()
                .map(|c| Tensor::<1, Int>::from_data(TensorData::new(c, [slots]), dev))
                .collect(),
        ));
        for (path, min) in b1_paths {
            let (x, w, idx) = (x.clone(), w.clone(), idx.clone());
            rows.push(Row {
                name: format!("NVFP4 experts {slots} of {experts} {k}→{nout} ({epi:?}) {path}"),
                bytes: slots as f64 * (nout * k / 2 + nout * k / 16) as f64
                    + esize * (slots / div * k + slots * nout) as f64,
                flops: 2.0 * slots as f64 * (k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, None, || {
                        drop(ops::nvfp4_expert_linear(
                            x.clone(),
                            idx.take().clone(),
                            div,
                            &w,
                            epi,
                        ));
                    });
                }),
            });
        }
    }
    // Batches 16 and 64: 96 / 384 routed slots over 128 experts (duplicates, as routing gives
    // them), slot-major GEMV and tensor cores (grouped by expert).
    for tokens in [16usize, 64] {
        let (k, nout) = (2688, 1856);
        let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 128, nout, k), dev);
        let x = act(&mut rng, vec![tokens, k]);
        let ids: Vec<i32> = (0..tokens * 6)
            .map(|i| ((i * 7919 + (i / 6) * 31) % 128) as i32)
            .collect();
        let uniq = ids.iter().collect::<std::collections::HashSet<_>>().len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(ids, [tokens * 6]), dev);
        for (path, min) in [("slot-major GEMV", gemv), ("tensor cores", tc)] {
            let (x, idx, w) = (x.clone(), idx.clone(), w.clone());
            rows.push(Row {
                name: format!(
                    "NVFP4 experts {} slots ({uniq} experts) {k}→{nout} {path}",
                    tokens * 6
                ),
                bytes: uniq as f64 * (nout * k / 2 + nout * k / 16) as f64
                    + esize * (tokens * k + tokens * 6 * nout) as f64,
                flops: 2.0 * (tokens * 6 * k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, None, || {
                        drop(ops::nvfp4_expert_linear(
                            x.clone(),
                            idx.clone(),
                            6,
                            &w,
                            Epilogue::Relu2,
                        ));
                    });
                }),
            });
        }
    }
    // Batched plain linears: the shared expert's up projection and lm_head (NVFP4), Mamba's
    // in_proj and out_proj (FP8), small-M GEMV against tensor cores.
    for (tokens, k, nout, fp8w) in [
        (16usize, 2688usize, 3712usize, false),
        (64, 2688, 3712, false),
        (16, 2688, 131072, false),
        (16, 2688, 10304, true),
        (64, 2688, 10304, true),
        (64, 4096, 2688, true),
    ] {
        let x = act(&mut rng, vec![tokens, k]);
        let (wbytes, run): (f64, Box<dyn Fn(Tensor<2>)>) = if fp8w {
            let wbytes = (nout * k) as f64;
            let w = Cold::new(
                (0..copies(a, wbytes))
                    .map(|_| Fp8Weights::upload(&[fp8(&mut rng, nout, k)], dev))
                    .collect(),
            );
            (
                wbytes,
                Box::new(move |x| drop(ops::fp8_linear(x, w.take(), Epilogue::None))),
            )
        } else {
            let wbytes = (nout * k / 2 + nout * k / 16) as f64;
            let w = Cold::new(
                (0..copies(a, wbytes))
                    .map(|_| Nvfp4Weights::upload(&nvfp4(&mut rng, 1, nout, k), dev))
                    .collect(),
            );
            (
                wbytes,
                Box::new(move |x| drop(ops::nvfp4_linear(x, w.take(), Epilogue::None))),
            )
        };
        let run = std::rc::Rc::new(run);
        for (path, min) in [("small-M GEMV", gemv), ("tensor cores", tc)] {
            let (x, run) = (x.clone(), run.clone());
            rows.push(Row {
                name: format!(
                    "{} {tokens} rows {k}→{nout} {path}",
                    if fp8w { "FP8 W8A8" } else { "NVFP4" }
                ),
                bytes: wbytes + esize * tokens as f64 * (k + nout) as f64,
                flops: 2.0 * (tokens * k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, None, || {
                        run(x.clone());
                    });
                }),
            });
        }
    }
    // The Mamba in_proj whole and as the engine runs it (z, xBC, dt), and out_proj.
    for (k, nout) in [
        (2688, 10304),
        (2688, 4096),
        (2688, 6144),
        (2688, 64),
        (4096, 2688),
    ] {
        let w = Rc::new(Cold::new(
            (0..copies(a, (nout * k) as f64))
                .map(|_| Fp8Weights::upload(&[fp8(&mut rng, nout, k)], dev))
                .collect(),
        ));
        let x = act(&mut rng, vec![1, k]);
        for (path, min, inq) in [
            ("GEMV", gemv, 0),
            ("tensor cores, quantized in-kernel", tc1, 8),
            ("tensor cores, quantized apart", tc1, 0),
        ] {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("FP8 W8A8 GEMV {k}→{nout} {path}"),
                bytes: (nout * k) as f64 + esize * (k + nout) as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, Some(inq), || {
                        drop(ops::fp8_linear(x.clone(), w.take(), Epilogue::None))
                    });
                }),
            });
        }
    }
    // Prefill GEMMs at 8,192 rows (64 × 128): ours (the default path) beside the decoded path
    // on each of cubek's tiled kernels (`fp8mm`, `nvfp4mm`, `densemm` from one row, `mmk=`),
    // and Burn's own matmul over the dense shape.
    let m = 8192;
    let with = |s: Settings, f: &mut dyn FnMut()| {
        let saved = Settings::current();
        s.apply().expect("a tiled setting applies");
        f();
        saved.apply().expect("the settings in force apply again");
    };
    let decoded = |k: TiledKernel| {
        let mut s = Settings::current();
        (s.min.fp8_mm, s.min.nvfp4_mm, s.min.dense_mm, s.tiled) = (1, 1, 1, k);
        s
    };
    let mut paths = vec![("ours, default path".to_string(), Settings::current())];
    for (name, k) in TiledKernel::ALL {
        if k != TiledKernel::Unit {
            paths.push((format!("decoded, mmk={name}"), decoded(k)));
        }
    }
    for (kind, k, nout) in [
        ("FP8 W8A8", 2688, 10304),
        ("FP8 W8A8", 4096, 2688),
        ("NVFP4", 2688, 3712),
        ("NVFP4", 3712, 2688),
        ("dense", 2688, 4096),
    ] {
        let x = act(&mut rng, vec![m, k]);
        let flops = 2.0 * (m * k * nout) as f64;
        let io = esize * (m * k + m * nout) as f64;
        let (bytes, op): (f64, std::rc::Rc<dyn Fn(Tensor<2>)>) = match kind {
            "FP8 W8A8" => {
                let w = Fp8Weights::upload(&[fp8(&mut rng, nout, k)], dev);
                (
                    (nout * k) as f64 + io,
                    std::rc::Rc::new(move |x| drop(ops::fp8_linear(x, &w, Epilogue::None))),
                )
            }
            "NVFP4" => {
                let w = Nvfp4Weights::upload(&nvfp4(&mut rng, 1, nout, k), dev);
                (
                    (nout * k / 2 + nout * k / 16) as f64 + io,
                    std::rc::Rc::new(move |x| drop(ops::nvfp4_linear(x, &w, Epilogue::None))),
                )
            }
            _ => {
                let w = Tensor::<1>::from_data(
                    TensorData::new(rng.vec(k * nout, 0.05), [k * nout]),
                    (dev, dtype),
                )
                .reshape([nout, k]);
                let burn = (w.clone(), x.clone());
                rows.push(Row {
                    name: format!("dense {m}×{k}→{nout} Burn's matmul"),
                    bytes: esize * (nout * k) as f64 + io,
                    flops,
                    op: Box::new(move || drop(burn.1.clone().matmul(burn.0.clone().transpose()))),
                });
                (
                    esize * (nout * k) as f64 + io,
                    std::rc::Rc::new(move |x| drop(ops::dense_linear(x, w.clone()))),
                )
            }
        };
        for (path, s) in &paths {
            let (x, op, s) = (x.clone(), op.clone(), s.clone());
            rows.push(Row {
                name: format!("{kind} {m}×{k}→{nout} {path}"),
                bytes,
                flops,
                op: Box::new(move || with(s.clone(), &mut || op(x.clone()))),
            });
        }
    }
    // Attention q and k/v projections (bf16) and the router (f32 weight over bf16 activations),
    // as the engine calls them: `dense_linear` against `w [N, K]`.
    for (k, nout, f32_weights) in [(2688, 4096, false), (2688, 256, false), (2688, 128, true)] {
        let wd = if f32_weights { BDType::F32 } else { dtype };
        let w = Tensor::<1>::from_data(
            TensorData::new(rng.vec(k * nout, 0.05), [k * nout]),
            (dev, wd),
        )
        .reshape([nout, k]);
        let x = act(&mut rng, vec![1, k]);
        let ws = if f32_weights { 4.0 } else { esize };
        for (path, min) in b1_paths {
            let (x, w) = (x.clone(), w.clone());
            rows.push(Row {
                name: format!("dense GEMV {k}→{nout} ({}) {path}", dtype_name(wd)),
                bytes: ws * (k * nout) as f64 + esize * k as f64 + ws * nout as f64,
                flops: 2.0 * (k * nout) as f64,
                op: Box::new(move || {
                    with_paths(min, None, || {
                        drop(ops::dense_linear(x.clone(), w.clone()));
                    });
                }),
            });
        }
    }
    // The router as a decode batch calls it: `dense_linear` of `m` bf16 rows against its f32
    // weight, past the GEMV's rows (the exact matmul; `--mma-min matrows=N` moves its
    // register-blocked kernel's start).
    {
        let (k, nout) = (2688, 128);
        let w = Tensor::<1>::from_data(
            TensorData::new(rng.vec(k * nout, 0.05), [k * nout]),
            (dev, BDType::F32),
        )
        .reshape([nout, k]);
        for m in [64, 256] {
            let (x, w) = (act(&mut rng, vec![m, k]), w.clone());
            rows.push(Row {
                name: format!("router {m}×{k}→{nout} (f32 weight, exact matmul)"),
                bytes: 4.0 * (k * nout) as f64 + esize * (m * k) as f64 + 4.0 * (m * nout) as f64,
                flops: 2.0 * (m * k * nout) as f64,
                op: Box::new(move || drop(ops::dense_linear(x.clone(), w.clone()))),
            });
        }
    }
    {
        let (h, p, ns, g) = (64, 64, 128, 8);
        let st = Tensor::<4>::zeros([1, h, p, ns], (dev, BDType::F32));
        let x = act(&mut rng, vec![1, h * p]).reshape([1, 1, h, p]);
        let dt = Tensor::<3>::ones([1, 1, h], (dev, dtype)) * 0.01;
        let av = Tensor::<1>::ones([h], (dev, dtype)) * -1.0;
        let bm = act(&mut rng, vec![1, g * ns]).reshape([1, 1, g, ns]);
        let d = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("selective scan, 1 token {h}×{p}×{ns} (ragged path)"),
            bytes: 2.0 * (h * p * ns * 4) as f64,
            flops: 5.0 * (h * p * ns) as f64,
            op: Box::new(move || {
                drop(ops::selective_scan(
                    x.clone(),
                    dt.clone(),
                    av.clone(),
                    bm.clone(),
                    bm.clone(),
                    d.clone(),
                    Some(st.clone()),
                    &[1],
                ))
            }),
        });
        // The engine's step: the state slot updated in place, x | B | C read from the conv
        // output row, the dt softplus inside.
        let pool = Tensor::<4>::zeros([1, h, p, ns], (dev, BDType::F32));
        let slot0 = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), dev);
        let xbc = act(&mut rng, vec![1, h * p + 2 * g * ns]);
        let dts = Tensor::<2>::ones([1, h], (dev, dtype)) * -4.0;
        let dims = nemotron::kernels::ScanDims {
            heads: h,
            head_dim: p,
            groups: g,
            state: ns,
        };
        let (av2, d2, bias2) = (
            Tensor::<1>::ones([h], (dev, dtype)) * -1.0,
            Tensor::<1>::ones([h], (dev, dtype)),
            Tensor::<1>::zeros([h], (dev, dtype)),
        );
        rows.push(Row {
            name: format!("SSM state step {h}×{p}×{ns} (slot, in place)"),
            bytes: 2.0 * (h * p * ns * 4) as f64,
            flops: 5.0 * (h * p * ns) as f64,
            op: Box::new(move || {
                drop(ops::ssm_step(
                    xbc.clone(),
                    dts.clone(),
                    bias2.clone(),
                    av2.clone(),
                    d2.clone(),
                    pool.clone(),
                    &slot0,
                    dims,
                    None,
                ))
            }),
        });
        let c = 6144;
        let x = act(&mut rng, vec![1, c]).reshape([1, 1, c]);
        let w = act(&mut rng, vec![c, 4]);
        let st = Tensor::<3>::zeros([1, c, 3], (dev, dtype));
        rows.push(Row {
            name: format!("causal conv step {c} channels, K=4"),
            bytes: esize * (c * (1 + 4 + 3 + 3 + 1)) as f64,
            flops: 8.0 * c as f64,
            op: Box::new(move || {
                drop(ops::causal_conv1d(
                    x.clone(),
                    w.clone(),
                    None,
                    st.clone(),
                    &[1],
                ))
            }),
        });
        let dtr = act(&mut rng, vec![1, h]).reshape([1, 1, h]);
        let bias = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("dt softplus {h} heads"),
            bytes: esize * (3 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::dt_softplus(dtr.clone(), bias.clone(), None))),
        });
    }
    {
        let e = 128;
        let logits = act(&mut rng, vec![1, e]).cast(BDType::F32);
        let bias = Tensor::<1>::zeros([e], (dev, BDType::F32));
        let c = nemotron::kernels::RouteConfig {
            top_k: 6,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
            weights_from_biased: false,
            fixed: 0,
        };
        // Decode attention (batch 1, 32 q heads over 2 kv heads, head 128) at 128, 1K and 8K of
        // context: append, scores, chunk partials, merge.
        for ctx in [128usize, 1024, 8192] {
            let (nh, kvh, hd, cap) = (32usize, 2usize, 128usize, ctx + 64);
            let q = act(&mut rng, vec![1, nh * hd]).reshape([1, nh, hd]);
            let k = act(&mut rng, vec![1, kvh * hd]).reshape([1, kvh, hd]);
            let v = act(&mut rng, vec![1, kvh * hd]).reshape([1, kvh, hd]);
            let kp = nemotron::kernels::ops::contiguous(Tensor::<4>::zeros(
                [1, kvh, cap, hd],
                (dev, dtype),
            ));
            let vp = nemotron::kernels::ops::contiguous(Tensor::<4>::zeros(
                [1, kvh, cap, hd],
                (dev, dtype),
            ));
            let lens = Tensor::<1, Int>::from_data(TensorData::new(vec![ctx as i32], [1]), dev);
            let slot0 = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), dev);
            rows.push(Row {
                name: format!("decode attention 1×{nh} heads, {ctx} context"),
                bytes: esize * (2 * kvh * (ctx + 1) * hd) as f64,
                flops: 4.0 * (nh * (ctx + 1) * hd) as f64,
                op: Box::new(move || {
                    drop(ops::attention_step(
                        q.clone(),
                        k.clone(),
                        v.clone(),
                        kp.clone(),
                        vp.clone(),
                        &lens,
                        &slot0,
                        1.0 / (hd as f32).sqrt(),
                    ))
                }),
            });
        }
        rows.push(Row {
            name: "MoE routing 128 experts, top 6".into(),
            bytes: (4 * 2 * e + 8 * 6) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::moe_route(logits.clone(), bias.clone(), &c))),
        });
        let v = 131_072;
        let logits = act(&mut rng, vec![1, v]);
        let l2 = logits.clone();
        rows.push(Row {
            name: format!("vocab argmax 1×{v} (ours)"),
            bytes: esize * v as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::argmax_rows(logits.clone()))),
        });
        rows.push(Row {
            name: format!("vocab argmax 1×{v} (Burn's argmax)"),
            bytes: esize * v as f64,
            flops: 0.0,
            op: Box::new(move || drop(l2.clone().argmax(1))),
        });
        let h = 2688;
        let x = act(&mut rng, vec![1, h]);
        let w = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("RMSNorm 1×{h}"),
            bytes: esize * (3 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::rms_norm(x.clone(), None, w.clone(), 1, 1e-5))),
        });
        let (x2, y2) = (act(&mut rng, vec![1, h]), act(&mut rng, vec![1, h]));
        let w2 = Tensor::<1>::ones([h], (dev, dtype));
        rows.push(Row {
            name: format!("residual add + RMSNorm 1×{h}"),
            bytes: esize * (5 * h) as f64,
            flops: 0.0,
            op: Box::new(move || drop(ops::add_rms_norm(x2.clone(), y2.clone(), w2.clone(), 1e-5))),
        });
        let i = 4096;
        let y = act(&mut rng, vec![1, i]);
        let z = act(&mut rng, vec![1, i]);
        let w = Tensor::<1>::ones([i], (dev, dtype));
        rows.push(Row {
            name: format!("gated group RMSNorm 1×{i}, 8 groups"),
            bytes: esize * (4 * i) as f64,
            flops: 0.0,
            op: Box::new(move || {
                drop(ops::rms_norm(
                    y.clone(),
                    Some(z.clone()),
                    w.clone(),
                    8,
                    1e-5,
                ))
            }),
        });
    }
    println!(
        "{:<44} {:>10} {:>10} {:>11} {:>9} {:>8} {:>10}",
        "op", "eager µs", "replay µs", "bytes", "GB/s", "% copy", "GFLOP/s"
    );
    let wanted = |name: &str| match &a.only {
        Some(o) => o
            .split(if o.contains('|') { '|' } else { ',' })
            .any(|p| name.contains(p)),
        None => true,
    };
    for mut r in rows.into_iter().filter(|r| wanted(&r.name)) {
        let (e, g) = device_time(dev, &mut r.op, launches_for(r.bytes, n), reps);
        let t = g.min(e);
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>11.0} {:>9.1} {:>7.1}% {:>10}",
            r.name,
            e * 1e6,
            g * 1e6,
            r.bytes,
            r.bytes / t / 1e9,
            100.0 * r.bytes / t / ceiling,
            if r.flops > 0.0 {
                format!("{:.1}", r.flops / t / 1e9)
            } else {
                "-".into()
            }
        );
    }
    Ok(())
}
