//! GQA decode attention over state slots, one new token per row, no RoPE, softmax in f32:
//!
//! 1. append: one unit per `(b, kv head, d)`: `K[s, g, len[s], d] = k[b, g, d]` (same for V);
//! 2. scores: one unit per `(b, q head, t)`, `t ≤ len[s]`: `σ[b, h, t] = scale · q[b, h]·K[s, h/r, t]`
//!    (f32 scratch `[B, NH, cap]`; units past the length exit);
//! 3. partials: a cube per `(b, q head, chunk of ATTN_CHUNK positions)`, one unit per `d`:
//!    `m = max σ`, `z = Σ exp(σ − m)`, `o[d] = Σ_t exp(σ_t − m) · V[s, h/r, t, d]` over the chunk
//!    (V reads coalesced along `d`);
//! 4. merge: a cube per `(b, q head)`: the chunks' partials rescaled to the row's maximum,
//!    `o = Σ o_c · e^(m_c − M) / Σ z_c · e^(m_c − M)` (flash-decoding).
//!
//! Where the head dim allows (even, dividing 128 — every real config), 1–3 run as one launch with
//! the append folded in, then the merge: two launches per layer. By default
//! ([`AttnForm::Gqa`], [`attn_gqa_kernel()`](super::gqa::attn_gqa_kernel)) a cube takes one `(kv head, row, chunk of 64
//! positions)` for all the query heads of its group, so each K/V chunk is read once per group
//! (16 query heads share a kv head in the Nano/Lightning geometry) — where the grid is small
//! ([`gqa_split_plan`]: batch 1 after a short prompt) each group is split over a few cubes of
//! fewer heads; [`attn_split_kernel()`](super::split::attn_split_kernel) (a
//! cube per query head) stays for groups too large for its shared memory. The four-launch form
//! stays for other head dims.
//!
//! Grids: the `(row, chunk)` pairs (or rows, for the merge) fold over y and z, so any batch and
//! capacity fit the launch limits.
//!
//! The lengths and slots are read on the device (`len[s]` before this step's token), so the same
//! launches serve every step of a captured graph; pad rows (`slot < 0`) write zeros.
//!
//! This file holds the form's choice ([`plan`]) and the launchers; the kernels are one file per
//! form: [`super::unfused`], [`super::split`], [`super::gqa`], and [`super::merge`].

use super::gqa::{attn_gqa_kernel, GQA_SHARED, GQA_UNITS};
use super::merge::attn_merge_kernel;
use super::split::{attn_split_kernel, SPLIT_CHUNK, SPLIT_UNITS};
use super::unfused::{attn_partial_kernel, attn_scores_kernel, kv_append_kernel};
use super::ATTN_CHUNK;
use crate::cube::buffers::{
    arg, contiguous_as, elemwise, empty, float_buf, i32_buf, with_float, yz,
};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Whether [`attn_split_kernel()`](super::split::attn_split_kernel) takes head dim `hd` (even, dividing its 128 units: 2 … 128).
fn split_applies(hd: usize) -> bool {
    hd >= 2 && hd % 2 == 0 && SPLIT_UNITS % hd == 0
}

/// Which form of decode attention [`launch`] runs where the head dim allows the fused ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnForm {
    /// `gqa::attn_gqa_kernel` + merge: one cube per `(kv head, row, chunk)` for the group's heads.
    Gqa,
    /// `split::attn_split_kernel` + merge: one cube per `(q head, row, chunk)`.
    Split,
    /// Append, scores, partials, merge: four launches.
    Unfused,
}

/// The form that runs when `asked` is set, for `heads` query heads over `kv_heads`, head dim
/// `hd` (pure; tested on the host): the GQA form where its cube's shared memory holds the
/// group's rows (`r` query rows, `r` unit sums and two `r × CHUNK` score arrays), else the split
/// form; either fused form only where the head dim divides the split cube's units, else the
/// unfused one.
pub fn plan(asked: AttnForm, heads: usize, kv_heads: usize, hd: usize) -> AttnForm {
    let group = heads / kv_heads.max(1);
    if !split_applies(hd) {
        AttnForm::Unfused
    } else if asked == AttnForm::Gqa && gqa_shared_bytes(group, hd) > GQA_SHARED {
        AttnForm::Split
    } else {
        asked
    }
}

/// Shared memory of a GQA cube of `r` query heads, head dim `hd`: `r` query
/// rows, `r` unit sums and two `r × CHUNK` score arrays, in f32.
fn gqa_shared_bytes(r: usize, hd: usize) -> usize {
    r * (hd + GQA_UNITS + 2 * SPLIT_CHUNK) * 4
}

/// Cubes [`gqa_split_plan`] fills a GQA launch to before it stops splitting groups. From the
/// H100's kernel table (batch 1, 32 heads over 2 kv heads, µs a call with the merge, replayed;
/// `kernels --only "decode attention" --mma-min attnsplit=N`, docs/PERF.md §37):
///
/// | context (pairs) | split 1 | 2 | 4 | 16 |
/// |---|---|---|---|---|
/// | 128 (6) | 20.8 | 19.9 | 16.0 | 15.6 |
/// | 1K (34) | 24.5 | **20.1** | 20.1 | 32.0 |
/// | 8K (258) | **41.2** | 48.8 | 70.3 | 203.9 |
///
/// the best split leaves 64–136 cubes; past one a SM the re-reads of each chunk cost more than
/// the heads side by side save.
pub const GQA_MIN_CUBES: usize = 64;

/// Into how many cubes the GQA form splits each kv head's group of `group` query heads, for
/// `rows × chunks` (row, chunk) pairs over `kv_heads` (pure; tested on the host): `forced` (a
/// power of two, rounded down and capped at the group) where given, else the fewest sub-groups
/// (a power of two dividing the group) whose grid holds [`GQA_MIN_CUBES`] cubes, at most one head
/// a cube. One cube a group reads each K/V chunk once for all its heads, but at batch 1 after a
/// short prompt that is 2 kv heads × 3 chunks = 6 cubes walking 16 heads each (28.6 µs a layer on
/// the H100, §34); split, the chunk is re-read per sub-group from L2 and the heads run side by
/// side. `chunks` counts the slot capacity's chunks (the lengths are on the device), so a large
/// capacity keeps whole groups.
pub fn gqa_split_plan(
    group: usize,
    kv_heads: usize,
    rows: usize,
    chunks: usize,
    forced: usize,
) -> usize {
    // The largest power of two dividing the group.
    let most = 1usize << group.max(1).trailing_zeros();
    if forced > 0 {
        return 1usize << forced.min(most).ilog2();
    }
    let pairs = kv_heads.max(1) * rows.max(1) * chunks.max(1);
    let mut split = 1;
    while split < most && pairs * split < GQA_MIN_CUBES {
        split *= 2;
    }
    split
}

static GQA_SPLIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Cubes per GQA group: 0 (the default) lets [`gqa_split_plan`] choose by the grid, `n` forces
/// `n` (rounded down to a power of two dividing the group). Process-wide; for tests and
/// benchmarks.
pub fn set_gqa_split(split: usize) {
    GQA_SPLIT.store(split, std::sync::atomic::Ordering::Relaxed);
}

/// The setting of [`set_gqa_split`].
pub fn gqa_split() -> usize {
    GQA_SPLIT.load(std::sync::atomic::Ordering::Relaxed)
}

static FORM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the decode attention form (process-wide; for tests and benchmarks). The default is
/// [`AttnForm::Gqa`].
pub fn set_form(f: AttnForm) {
    let v = match f {
        AttnForm::Gqa => 0,
        AttnForm::Split => 1,
        AttnForm::Unfused => 2,
    };
    FORM.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The form [`set_form`] chose.
pub fn form() -> AttnForm {
    match FORM.load(std::sync::atomic::Ordering::Relaxed) {
        0 => AttnForm::Gqa,
        1 => AttnForm::Split,
        _ => AttnForm::Unfused,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let q = float_buf(q);
    let dtype = q.dtype;
    let (k, v) = (contiguous_as(k, dtype), contiguous_as(v, dtype));
    let qs = q.meta.shape().clone();
    let (rows, nh, hd) = (qs[0], qs[1], qs[2]);
    let kvh = kpool.meta.shape()[1];
    let layout = Layout {
        rows,
        heads: nh,
        q_row: nh * hd,
        kv_row: kvh * hd,
        k_off: 0,
        v_off: 0,
    };
    run(q, k, v, layout, kpool, vpool, lens, slots, scale, None)
}

/// [`launch`] with `q | k | v` read in place from one projection row per token: `qkv`
/// `[B, (NH + 2·KVH)·D]` (no slicing copies, one projection launch instead of three). Over
/// plain pools (`kv8` `None`) or an FP8 cache (`Some((k_scale, v_scale))`): pools
/// `[S, KVH, cap, D/4]` of I32 words holding E4M3 codes ([`crate::cube::kv8`]), `D` a multiple of
/// 4 that the fused forms take; the step's own K/V are attended as stored, as every earlier
/// position.
#[allow(clippy::too_many_arguments)]
pub fn launch_fused<R: CubeRuntime>(
    qkv: CubeTensor<R>,
    heads: usize,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
    kv8: Option<(f32, f32)>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(qkv);
    let xs = x.meta.shape().clone();
    let (rows, width) = (xs[0], xs[1]);
    let ps = kpool.meta.shape().clone();
    let (kvh, hd) = (ps[1], if kv8.is_some() { 4 * ps[3] } else { ps[3] });
    assert_eq!(
        width,
        (heads + 2 * kvh) * hd,
        "attention_step_qkv: a row of {width} for {heads} + 2 × {kvh} heads of {hd}"
    );
    let layout = Layout {
        rows,
        heads,
        q_row: width,
        kv_row: width,
        k_off: heads * hd,
        v_off: (heads + kvh) * hd,
    };
    run(
        x.clone(),
        x.clone(),
        x,
        layout,
        kpool,
        vpool,
        lens,
        slots,
        scale,
        kv8,
    )
}

/// Where a row's query heads and new K/V sit in the `q`, `k`, `v` buffers (values).
struct Layout {
    rows: usize,
    heads: usize,
    q_row: usize,
    kv_row: usize,
    k_off: usize,
    v_off: usize,
}

#[allow(clippy::too_many_arguments)]
fn run<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    layout: Layout,
    kpool: CubeTensor<R>,
    vpool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
    scale: f32,
    kv8: Option<(f32, f32)>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let dtype = q.dtype;
    let fp8 = kv8.is_some();
    let (k_scale, v_scale) = kv8.unwrap_or((1.0, 1.0));
    for (name, p) in [("K", &kpool), ("V", &vpool)] {
        assert_eq!(
            p.dtype,
            if fp8 { DType::I32 } else { dtype },
            "attention_step: the {name} pool must be in the activation dtype (I32 words for FP8)"
        );
        assert!(
            p.is_contiguous(),
            "attention_step: the {name} pool must be contiguous"
        );
    }
    let (lens, slots) = (i32_buf(lens), i32_buf(slots));
    let (rows, nh) = (layout.rows, layout.heads);
    let ps = kpool.meta.shape().clone();
    let (kvh, cap) = (ps[1], ps[2]);
    let hd = if fp8 { 4 * ps[3] } else { ps[3] };
    let (q_row, kv_row, k_off, v_off) = (
        layout.q_row as u32,
        layout.kv_row as u32,
        layout.k_off as u32,
        layout.v_off as u32,
    );
    let chunks = cap.div_ceil(ATTN_CHUNK);
    let part = empty(&q, [rows, nh, chunks, hd + 2], DType::F32);
    let o = empty(&q, [rows, nh, hd], dtype);
    let client = q.client.clone();
    // The FP8 cache has no unfused form: a fused one wherever the head dim allows.
    let asked = match form() {
        AttnForm::Unfused if fp8 => AttnForm::Split,
        f => f,
    };
    let form = plan(asked, nh, kvh, hd);
    assert!(
        !fp8 || (form != AttnForm::Unfused && hd % 4 == 0),
        "attention_step: an FP8 KV cache needs a head dim that is a multiple of 4 dividing \
         {SPLIT_UNITS} (got {hd}; see `ops::kv8_fits`)"
    );
    if form != AttnForm::Unfused {
        macro_rules! split {
            ($t:ty) => {{
                if fp8 {
                    split!($t, u32, true)
                } else {
                    split!($t, $t, false)
                }
            }};
            ($t:ty, $p:ty, $fp8:expr) => {{
                if form == AttnForm::Gqa {
                    let group = nh / kvh;
                    let split = gqa_split_plan(group, kvh, rows, chunks, gqa_split());
                    attn_gqa_kernel::launch::<$t, $p, R>(
                        &client,
                        {
                            let (y, z) = yz(rows * chunks);
                            CubeCount::Static((kvh * split) as u32, y, z)
                        },
                        CubeDim::new_1d(GQA_UNITS as u32),
                        arg(&q),
                        arg(&k),
                        arg(&v),
                        arg(&lens),
                        arg(&slots),
                        arg(&kpool),
                        arg(&vpool),
                        arg(&part),
                        nh as u32,
                        kvh as u32,
                        split as u32,
                        cap as u32,
                        chunks as u32,
                        scale,
                        q_row,
                        kv_row,
                        k_off,
                        v_off,
                        k_scale,
                        v_scale,
                        hd,
                        group / split,
                        $fp8,
                    );
                } else {
                    attn_split_kernel::launch::<$t, $p, R>(
                        &client,
                        {
                            let (y, z) = yz(rows * chunks);
                            CubeCount::Static(nh as u32, y, z)
                        },
                        CubeDim::new_1d(SPLIT_UNITS as u32),
                        arg(&q),
                        arg(&k),
                        arg(&v),
                        arg(&lens),
                        arg(&slots),
                        arg(&kpool),
                        arg(&vpool),
                        arg(&part),
                        nh as u32,
                        kvh as u32,
                        cap as u32,
                        chunks as u32,
                        scale,
                        q_row,
                        kv_row,
                        k_off,
                        v_off,
                        k_scale,
                        v_scale,
                        hd,
                        $fp8,
                    );
                }
                attn_merge_kernel::launch::<$t, R>(
                    &client,
                    {
                        let (y, z) = yz(rows);
                        CubeCount::Static(nh as u32, y, z)
                    },
                    CubeDim::new_1d(hd as u32),
                    arg(&part),
                    arg(&lens),
                    arg(&slots),
                    arg(&o),
                    nh as u32,
                    hd as u32,
                    chunks as u32,
                    ATTN_CHUNK,
                );
            }};
        }
        with_float!(dtype, split);
        return (o, kpool, vpool);
    }
    let scores = empty(&q, [rows, nh, cap], DType::F32);
    let (ac, ad) = elemwise(rows * kvh * hd);
    let (sc, sd) = elemwise(rows * nh * cap);
    macro_rules! go {
        ($t:ty) => {{
            kv_append_kernel::launch::<$t, R>(
                &client,
                ac,
                ad,
                arg(&k),
                arg(&v),
                arg(&lens),
                arg(&slots),
                arg(&kpool),
                arg(&vpool),
                rows as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
                kv_row,
                k_off,
                v_off,
            );
            attn_scores_kernel::launch::<$t, R>(
                &client,
                sc,
                sd,
                arg(&q),
                arg(&kpool),
                arg(&lens),
                arg(&slots),
                arg(&scores),
                rows as u32,
                nh as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
                scale,
                q_row,
            );
            attn_partial_kernel::launch::<$t, R>(
                &client,
                {
                    let (y, z) = yz(rows * chunks);
                    CubeCount::Static(nh as u32, y, z)
                },
                CubeDim::new_1d(hd as u32),
                arg(&scores),
                arg(&vpool),
                arg(&lens),
                arg(&slots),
                arg(&part),
                nh as u32,
                kvh as u32,
                hd as u32,
                cap as u32,
                chunks as u32,
                ATTN_CHUNK,
            );
            attn_merge_kernel::launch::<$t, R>(
                &client,
                {
                    let (y, z) = yz(rows);
                    CubeCount::Static(nh as u32, y, z)
                },
                CubeDim::new_1d(hd as u32),
                arg(&part),
                arg(&lens),
                arg(&slots),
                arg(&o),
                nh as u32,
                hd as u32,
                chunks as u32,
                ATTN_CHUNK,
            );
        }};
    }
    with_float!(dtype, go);
    (o, kpool, vpool)
}
