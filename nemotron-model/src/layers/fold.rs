//! A MoE layer's shared expert stacked with its routed experts ([`SharedExpert::Fold`]): the
//! shared `up` `[W, H]` / `down` `[H, W]` cut into `m = ⌈W / w⌉` experts of the routed width `w`
//! (rows of `up`, columns of `down`; the last zero-padded), which every token then takes with
//! weight 1. relu² is elementwise and a zero row of `up` meets a zero column of `down`, so the
//! parts sum to the shared expert exactly (in exact arithmetic). Host bytes only: nothing here
//! touches a device.

use nemotron_loader::{ExpertWeights, HostTensor, LinearWeight as W, MoeWeights};

/// How a MoE layer runs its shared expert: a build option, since it decides the weights' layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedExpert {
    /// Two linears of its own beside the routed experts' launches; its output added after the
    /// routed sum is rounded to the activation dtype, as HF does.
    Apart,
    /// Stacked with the routed experts (see the module): each projection of the layer is one
    /// launch, two fewer per MoE layer and step. The shared parts are summed with the routed
    /// slots in f32 before the one rounding, where HF rounds the routed sum and then adds.
    /// Meant for the quantized stacks (NVFP4, FP8), whose kernels read each expert's weights in
    /// place: dense (BF16) experts gather a weight per slot, so there the fold trades one dense
    /// product for two more gathered slots per token, which is slower (the small100m BF16 model
    /// on the host, `bench --engine --prompt-len 16 --batch 2 --decode 4 --repeats 1 --no-hf`:
    /// prefill 47.8 → 32.0 tok/s).
    Fold,
    /// Both layouts held (the shared expert's weights twice on the device): decode steps
    /// through the slots of up to `max_rows` rows run folded, larger ones and every prefill
    /// (the ragged forward) apart — so a prompt's prefill does not depend on the prompts
    /// admitted with it (the fold rounds differently in bf16: `Moe::folds`). The fold paid at
    /// batch 1 and cost at batch 64 on the H100 (`docs/PERF.md` §34: +9.4 %, −3.4 %).
    /// Quantized stacks only: a layer whose experts are dense, or that [`fold_refusal`]
    /// refuses, runs apart. The default, at [`FOLD_AUTO_MAX_ROWS`]: on the H100 it decoded
    /// batch 1 at 411.5 tok/s against 369.1 apart, and batches 64 and 256 0.3 % slower than
    /// apart, inside the machine's spread (§36).
    Auto { max_rows: usize },
}

impl Default for SharedExpert {
    fn default() -> Self {
        SharedExpert::Auto {
            max_rows: FOLD_AUTO_MAX_ROWS,
        }
    }
}

/// Rows up to which [`SharedExpert::Auto`] folds when no count is given (`auto`).
pub const FOLD_AUTO_MAX_ROWS: usize = 8;

impl SharedExpert {
    /// The rows up to which a layer built this way folds (0: never), given whether the layer's
    /// shared expert can fold and whether its experts are quantized.
    pub fn fold_rows(self, foldable: bool, quantized: bool) -> usize {
        match self {
            SharedExpert::Apart => 0,
            _ if !foldable => 0,
            SharedExpert::Fold => usize::MAX,
            SharedExpert::Auto { max_rows } if quantized => max_rows,
            SharedExpert::Auto { .. } => 0,
        }
    }
}

impl std::str::FromStr for SharedExpert {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "apart" => Ok(SharedExpert::Apart),
            "fold" => Ok(SharedExpert::Fold),
            "auto" => Ok(SharedExpert::Auto {
                max_rows: FOLD_AUTO_MAX_ROWS,
            }),
            x => match x.strip_prefix("auto:").map(str::parse) {
                Some(Ok(max_rows)) => Ok(SharedExpert::Auto { max_rows }),
                _ => Err(format!(
                    "{x:?}: expected apart, fold, auto or auto:N (fold up to N rows)"
                )),
            },
        }
    }
}

/// Why `w`'s shared expert cannot be stacked with its routed experts, or None where it can (a
/// layer without a shared expert has nothing to fold: None).
pub fn fold_refusal(w: &MoeWeights) -> Option<String> {
    let s = w.shared.as_ref()?;
    let Some(first) = w.experts.first() else {
        return Some("no routed experts to stack it with".into());
    };
    let same = |a: &W, b: &W| match (a, b) {
        (W::Dense(_), W::Dense(_)) | (W::Fp8(_), W::Fp8(_)) => true,
        (W::Nvfp4(x), W::Nvfp4(y)) => x.activations == y.activations,
        _ => false,
    };
    if !w
        .experts
        .iter()
        .all(|e| same(&e.up, &first.up) && same(&e.down, &first.down))
    {
        return Some("the routed experts mix weight forms (they are not stacked)".into());
    }
    if !same(&s.up, &first.up) || !same(&s.down, &first.down) {
        return Some("its weight form differs from the routed experts'".into());
    }
    let (width, hidden) = (s.up.out_features(), s.up.in_features());
    let w = first.up.out_features();
    if matches!(s.down, W::Nvfp4(_)) && (w % 16 != 0 || width % 16 != 0) {
        return Some(format!(
            "NVFP4 widths {width} (shared) and {w} (routed) must be whole scale blocks of 16"
        ));
    }
    if hidden != first.up.in_features()
        || s.down.out_features() != first.down.out_features()
        || s.down.in_features() != width
    {
        return Some(format!(
            "shapes: up [{width}, {hidden}], down [{}, {}] against the experts' up [{}, {}]",
            s.down.out_features(),
            s.down.in_features(),
            first.up.out_features(),
            first.up.in_features()
        ));
    }
    None
}

/// The shared expert `s` as `⌈W / w⌉` experts of the routed width `w` (see the module); `s`
/// passed [`fold_refusal`] against experts of width `w`.
pub fn fold_shared(s: ExpertWeights, w: usize) -> Vec<ExpertWeights> {
    let width = s.up.out_features();
    let parts = width.div_ceil(w);
    (0..parts)
        .map(|p| {
            let (from, real) = (p * w, (width - p * w).min(w));
            ExpertWeights {
                up: up_part(&s.up, from, real, w),
                down: down_part(&s.down, from, real, w),
            }
        })
        .collect()
}

/// Rows `from..from + real` of `t` (`rows × row` bytes each), zero rows up to `total`.
fn rows(
    t: &HostTensor,
    row: usize,
    from: usize,
    real: usize,
    total: usize,
    p: usize,
) -> HostTensor {
    let mut bytes = t.bytes[from * row..(from + real) * row].to_vec();
    bytes.resize(total * row, 0);
    let mut shape = t.shape.clone();
    shape[0] = total;
    HostTensor {
        name: format!("{} (fold part {p})", t.name),
        dtype: t.dtype,
        shape,
        bytes,
    }
}

/// Byte columns `from..from + real` of each of `t`'s rows (`row` bytes each), zero columns up to
/// `total`; `cols` is the new last dimension.
fn cols(
    t: &HostTensor,
    row: usize,
    from: usize,
    real: usize,
    total: usize,
    cols: usize,
    p: usize,
) -> HostTensor {
    let n = t.bytes.len() / row;
    let mut bytes = Vec::with_capacity(n * total);
    for r in t.bytes.chunks_exact(row) {
        bytes.extend_from_slice(&r[from..from + real]);
        bytes.resize(bytes.len() + total - real, 0);
    }
    // A matrix: `[rows, row]` bytes as `[.., cols]` elements.
    let mut shape = t.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = cols;
    }
    HostTensor {
        name: format!("{} (fold part {p})", t.name),
        dtype: t.dtype,
        shape,
        bytes,
    }
}

/// `up` rows `from..from + real`, zero-padded to `w` rows (an E2M1 code 0 and an E4M3 scale 0 are
/// zeros, as is an all-zero float or FP8 byte).
fn up_part(up: &W, from: usize, real: usize, w: usize) -> W {
    let p = from / w;
    match up {
        W::Dense(t) => {
            let row = t.shape[1] * t.dtype.size();
            W::Dense(rows(t, row, from, real, w, p))
        }
        W::Fp8(f) => {
            let mut f = f.clone();
            f.weight = rows(&f.weight, f.in_features, from, real, w, p);
            f.out_features = w;
            W::Fp8(f)
        }
        W::Nvfp4(n) => {
            let mut n = n.clone();
            n.packed = rows(&n.packed, n.in_features / 2, from, real, w, p);
            n.block_scales = rows(&n.block_scales, n.in_features / 16, from, real, w, p);
            n.out_features = w;
            W::Nvfp4(n)
        }
    }
}

/// `down` input columns `from..from + real`, zero-padded to `w` columns. NVFP4 cuts at whole
/// bytes and scale blocks: `from` and `w` are multiples of 16 there (`w` is the routed experts'
/// `down` input, whose blocks are 16 wide).
fn down_part(down: &W, from: usize, real: usize, w: usize) -> W {
    let p = from / w;
    match down {
        W::Dense(t) => {
            let e = t.dtype.size();
            W::Dense(cols(t, t.shape[1] * e, from * e, real * e, w * e, w, p))
        }
        W::Fp8(f) => {
            let mut f = f.clone();
            f.weight = cols(&f.weight, f.in_features, from, real, w, w, p);
            f.in_features = w;
            W::Fp8(f)
        }
        W::Nvfp4(n) => {
            let mut n = n.clone();
            let k = n.in_features;
            n.packed = cols(
                &n.packed,
                k / 2,
                from / 2,
                real.div_ceil(2),
                w / 2,
                w / 2,
                p,
            );
            n.block_scales = cols(
                &n.block_scales,
                k / 16,
                from / 16,
                real.div_ceil(16),
                w / 16,
                w / 16,
                p,
            );
            n.in_features = w;
            W::Nvfp4(n)
        }
    }
}
