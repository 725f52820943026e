//! Log-probabilities on the device: per row of logits `[R, V]`, the log-sum-exp, the logit of
//! one given token, and the `n` largest logits with their ids (by decreasing value, the lower id
//! on ties, NaN never ranking: the order of the host's `sampling::logprobs`), so a request that
//! asks for `logprobs` brings `2 + 2n` numbers per row to the host instead of the 131,072-entry
//! row. Grid: one cube per row (rows folded over x and y), `units` units (a power of two). A
//! unit keeps its strided share's `n` best, sorted, in registers while taking its maximum; the
//! cube's maximum by a shared-memory tree; `Σ exp(x − max)` in a second pass over the row (from
//! L2), summed in f32 per unit and across the cube; then `n` rounds of the arg-max tree over the
//! units' list heads, the winning unit advancing its head.

use super::buffers::{arg, empty, float_buf, fold, i32_buf, with_float};
use super::reduce::{argmax_tree, better, block_sum, plane_reduce};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// The most ranked entries a row may ask for (OpenAI's and vLLM's limit on `top_logprobs`).
pub const MAX_TOP: usize = crate::MAX_TOP_LOGPROBS;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn logprob_rows_kernel<F: Float>(
    x: &[F],
    tokens: &[i32],
    stats: &mut [f32],
    top_ids: &mut [i32],
    top_vals: &mut [f32],
    rows: u32,
    cols: u32,
    #[comptime] units: usize,
    #[comptime] n: usize,
    #[comptime] plane: bool,
) {
    let row = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Uniform over the cube: the folded grid's last cubes past the rows leave.
    if row >= rows as usize {
        terminate!();
    }
    let u = UNIT_POS as usize;
    let cols = cols as usize;
    let none = cols as u32 + 1u32;
    let base = row * cols;
    let neg_inf = f32::reinterpret(0xFF80_0000u32);
    // This unit's best `n`, sorted by `better` (empty slots carry `none`).
    let mut lv = Array::<f32>::new(MAX_TOP);
    let mut li = Array::<u32>::new(MAX_TOP);
    #[unroll]
    for j in 0..MAX_TOP {
        lv[j] = 0.0f32;
        li[j] = none;
    }
    let mut m = neg_inf;
    let mut c = u;
    while c < cols {
        let v = f32::cast_from(x[base + c]);
        if !v.is_nan() {
            m = m.max(v);
        }
        if n > 0 {
            if better(v, c as u32, lv[n - 1], li[n - 1], none) {
                // Shift the worse entries down (no short-circuit `&&` in a kernel: the bound is
                // tested apart before any read below it).
                let mut j = 0usize;
                j += n - 1;
                let mut moving = true;
                while moving {
                    if j == 0 {
                        moving = false;
                    } else if better(v, c as u32, lv[j - 1], li[j - 1], none) {
                        lv[j] = lv[j - 1];
                        li[j] = li[j - 1];
                        j -= 1;
                    } else {
                        moving = false;
                    }
                }
                lv[j] = v;
                li[j] = c as u32;
            }
        }
        c += units;
    }
    let mut red = Shared::<[f32]>::new_slice(units);
    red[u] = m;
    sync_cube();
    // A runtime stride (a comptime one cannot be updated).
    let mut stride = CUBE_DIM as usize / 2;
    while stride > 0 {
        if u < stride {
            red[u] = red[u].max(red[u + stride]);
        }
        sync_cube();
        stride /= 2;
    }
    let mx = red[0];
    sync_cube();
    let mut s = 0.0f32;
    c = u;
    while c < cols {
        let v = f32::cast_from(x[base + c]);
        if !v.is_nan() {
            s += (v - mx).exp();
        }
        c += units;
    }
    let total = block_sum(s, units, plane);
    if u == 0 {
        stats[row * 2] = mx + total.ln();
        let t = tokens[row];
        let inside = t >= 0 && (t as usize) < cols;
        // Read at a clamped index, kept only when inside the row.
        let tv = f32::cast_from(x[base + (t.max(0) as usize).min(cols - 1)]);
        stats[row * 2 + 1] = if inside { tv } else { neg_inf };
    }
    if n == 0 {
        // The one column of an empty ranking.
        if u == 0 {
            top_ids[row] = -1i32;
            top_vals[row] = 0.0f32;
        }
    }
    let mut val = Shared::<[f32]>::new_slice(units);
    let mut ix = Shared::<[u32]>::new_slice(units);
    let mut head = 0usize;
    for r in 0..n {
        val[u] = lv[head.min(MAX_TOP - 1)];
        ix[u] = if head < n {
            li[head.min(MAX_TOP - 1)]
        } else {
            none
        };
        sync_cube();
        argmax_tree(&mut val, &mut ix, none);
        let win = ix[0];
        if u == 0 {
            top_ids[row * n + r] = if win == none { -1i32 } else { win as i32 };
            top_vals[row * n + r] = if win == none { 0.0f32 } else { val[0] };
        }
        if win != none && head < n && li[head.min(MAX_TOP - 1)] == win {
            head += 1;
        }
        sync_cube();
    }
}

/// `(stats [R, 2] f32: log-sum-exp and the logit of tokens[r]; ids [R, n] I32; values [R, n]
/// f32)` for `x [R, V]`, `tokens [R]` (a token outside the row gives −∞; a row with fewer than
/// `n` ranked entries gives id −1).
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    tokens: CubeTensor<R>,
    n: usize,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    assert!(
        n <= MAX_TOP,
        "logprob_rows: {n} ranked entries, at most {MAX_TOP}"
    );
    let x = float_buf(x);
    let tokens = i32_buf(tokens);
    let shape = x.meta.shape().clone();
    let (rows, cols) = (shape[0], shape[1]);
    let stats = empty(&x, [rows, 2], DType::F32);
    let ids = empty(&x, [rows, n.max(1)], DType::I32);
    let vals = empty(&x, [rows, n.max(1)], DType::F32);
    if rows == 0 {
        return (stats, ids, vals);
    }
    let max = x.client.properties().hardware.max_units_per_cube as usize;
    // A power of two (the trees halve it), 256 or what the device allows: a unit's list lives in
    // registers, so fewer units than the arg-max's 1,024.
    let units = 1usize << (max.clamp(32, 256).ilog2());
    let plane = plane_reduce(&x.client, 32) && units % 32 == 0;
    macro_rules! go {
        ($t:ty) => {
            logprob_rows_kernel::launch::<$t, R>(
                &x.client,
                fold(rows),
                CubeDim::new_1d(units as u32),
                arg(&x),
                arg(&tokens),
                arg(&stats),
                arg(&ids),
                arg(&vals),
                rows as u32,
                cols as u32,
                units,
                n,
                plane,
            )
        };
    }
    with_float!(x.dtype, go);
    (stats, ids, vals)
}
