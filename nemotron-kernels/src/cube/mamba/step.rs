//! Decode over state slots: the conv and the selective scan for one token per row, each row's
//! state in slot `slots[b]` of a pool, updated in place (a negative slot is a pad row: zeros out,
//! nothing written). Inputs and outputs in the activation storage type `F`, the SSM pool in f32
//! or in bf16 (I32 words of two bf16 each, element `2w` in the low half of word `w`: vLLM's
//! `--mamba-ssm-cache-dtype bfloat16`, the state HF transformers keeps in a bf16 model; the step
//! computes in f32 from the stored values, the output from the f32 new state, and stores the new
//! state rounded to nearest even).
//!
//! - conv step: one unit per `(b, c)`: `y = silu(bias + Σ_k<K-1 w[c,k]·S[t−K+1+k] + w[c,K-1]·x)`
//!   over the channel's ring `S` of `K` entries (time `t` at `t mod K`, `t = lens[slot]`), then
//!   `S[t mod K] ← x`. The entry written is the one no reader of this step needs, so cubes may
//!   read a channel while another writes it.
//! - SSM step: a cube per `(b, h, 8 rows of p)`, [`SSM_LANES`] lanes striding over the state
//!   dimension `n` (coalesced): `dt = softplus(dt_raw + dt_bias)` (floored, rounded to `F` as the
//!   separate op stores it), `S[n] ← exp(dt·A)·S[n] + dt·x·B[n]`, `y = Σ_n S[n]·C[n] + D·x`
//!   (lanes reduced by warp shuffle on CUDA, through shared memory elsewhere); `x`, `B`, `C` are
//!   read in place from the conv step's `[B, H·P + 2·G·N]` output (no slicing copies).
//! - Both in one launch (`conv_ssm_step`): the SSM cube convolves what it reads from the raw
//!   `in_proj` row — its group's `2N` `B`/`C` channels once into shared memory (one cube per
//!   group, the group's first head's first row block, writes their rings), each row's `x`
//!   channel in the row's lanes (lane 0 writes its ring) — with the conv step's arithmetic and
//!   its rounding to `F`, so the values are those of the two launches.

use crate::cube::bf16::{bf16_hi, bf16_lo, bf16_word};
use crate::cube::buffers::{
    arg, contiguous_as, elemwise, empty, float_buf, i32_buf, with_float, yz,
};
use crate::cube::reduce::{lane_sum, plane_reduce};
use crate::{Maybe, ScanDims};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Lanes over the state dimension per SSM row, and rows per cube.
pub const SSM_LANES: u32 = 32;
pub const SSM_ROWS: u32 = 8;

/// The most state rows one warp of the SSM step walks ([`ssm_walk_plan`]).
pub const SSM_WALK_MAX: usize = 8;
/// Cubes a step keeps at least when its warps walk several rows: below it, one row a warp
/// (batch 1 to 16 on Lightning's 64 heads of 64 rows), for latency.
pub const SSM_WALK_MIN_CUBES: usize = 8192;

/// The default of [`set_ssm_walk`]: [`ssm_walk_plan`]'s choice by the batch. Timed on the H100
/// (PERF 36, bf16 state, against one row a warp): batch 64 4,562 → 4,921 tok/s, batch 256 7,757
/// → 8,569; batch 1 keeps one row (the plan leaves small batches alone).
pub const SSM_WALK_DEFAULT: usize = 0;

static SSM_WALK: AtomicUsize = AtomicUsize::new(SSM_WALK_DEFAULT);

/// Rows per warp the SSM step walks: 0 (the default) lets [`ssm_walk_plan`] choose by the
/// batch; 1, 2, 4 or 8 forces it where a lane's share of a row is held in registers.
/// Process-wide; for benchmarks and tests.
pub fn set_ssm_walk(rows: usize) {
    SSM_WALK.store(rows, Ordering::Relaxed);
}

/// The setting of [`set_ssm_walk`].
pub fn ssm_walk() -> usize {
    SSM_WALK.load(Ordering::Relaxed)
}

/// State rows each warp walks for `pairs` (row, head) pairs of `p` state rows: each walked row
/// reuses the warp's `dt`, decay and register share of `B` and `C` (otherwise loaded again per
/// row: as many load instructions as the state's own at `N` = 128, so halving the state's bytes
/// alone barely moved a batch-256 step). 1 where the share is not in registers (`registers`
/// false: the strided loop); `forced` (rounded down to a power of two, at most
/// [`SSM_WALK_MAX`]) where given; else the largest power of two up to [`SSM_WALK_MAX`] leaving
/// at least [`SSM_WALK_MIN_CUBES`] cubes.
pub fn ssm_walk_plan(pairs: usize, p: usize, registers: bool, forced: usize) -> usize {
    if !registers {
        return 1;
    }
    if forced > 0 {
        return 1 << forced.min(SSM_WALK_MAX).ilog2();
    }
    let cubes = |walk: usize| pairs * p.div_ceil(SSM_ROWS as usize * walk);
    let mut walk = 1;
    while walk < SSM_WALK_MAX && cubes(walk * 2) >= SSM_WALK_MIN_CUBES {
        walk *= 2;
    }
    walk
}

/// One channel's conv output for this token (rounded to `F` as the conv step stores it): `at`
/// indexes the raw input in `x`, the ring of `(slot, ch)` lives at `(slot · width + ch) · k`;
/// `write`: store the input at `len mod k`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn conv_tap<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    ring: &mut [F],
    at: usize,
    ch: usize,
    slot: usize,
    width: usize,
    k: usize,
    len: usize,
    write: bool,
    #[comptime] has_bias: bool,
) -> f32 {
    let base = (slot * width + ch) * k;
    let xv = f32::cast_from(x[at]);
    let mut acc = 0.0f32;
    if has_bias {
        acc = f32::cast_from(bias[ch]);
    }
    for kk in 0..k - 1 {
        acc += f32::cast_from(w[ch * k + kk]) * f32::cast_from(ring[base + (len + 1 + kk) % k]);
    }
    acc += f32::cast_from(w[ch * k + k - 1]) * xv;
    if write {
        ring[base + len % k] = x[at];
    }
    f32::cast_from(F::cast_from(acc / (1.0f32 + (-acc).exp())))
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn conv_step_kernel<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    pool: &mut [F],
    lens: &[i32],
    slots: &[i32],
    y: &mut [F],
    rows: u32,
    ch: u32,
    k: u32,
    #[comptime] has_bias: bool,
) {
    let id = ABSOLUTE_POS;
    let (ch, k) = (ch as usize, k as usize);
    if id >= rows as usize * ch {
        terminate!();
    }
    let b = id / ch;
    let c = id % ch;
    let slot = slots[b];
    if slot < 0 {
        y[id] = F::cast_from(0.0f32);
        terminate!();
    }
    let len = lens[slot as usize] as usize;
    let v = conv_tap::<F>(
        x,
        w,
        bias,
        pool,
        id,
        c,
        slot as usize,
        ch,
        k,
        len,
        true,
        has_bias,
    );
    y[id] = F::cast_from(v);
}

pub fn conv_launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Maybe<CubeBackend<R>>,
    pool: CubeTensor<R>,
    lens: CubeTensor<R>,
    slots: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = float_buf(x);
    let dtype = x.dtype;
    check_ring(&pool, dtype);
    let shape = x.meta.shape().clone();
    let (rows, c) = (shape[0], shape[1]);
    let k = weight.meta.shape()[1];
    let w = contiguous_as(weight, dtype);
    let bias = bias.into_option().map(|b| contiguous_as(b, dtype));
    let (lens, slots) = (i32_buf(lens), i32_buf(slots));
    let y = empty(&x, [rows, c], dtype);
    let (count, dim) = elemwise(rows * c);
    macro_rules! go {
        ($t:ty) => {
            conv_step_kernel::launch::<$t, R>(
                &x.client,
                count,
                dim,
                arg(&x),
                arg(&w),
                arg(bias.as_ref().unwrap_or(&w)),
                arg(&pool),
                arg(&lens),
                arg(&slots),
                arg(&y),
                rows as u32,
                c as u32,
                k as u32,
                bias.is_some(),
            )
        };
    }
    with_float!(dtype, go);
    (y, pool)
}

fn check_ring<R: CubeRuntime>(pool: &CubeTensor<R>, dtype: DType) {
    assert_eq!(
        pool.dtype, dtype,
        "conv_step: the state pool must be in the activation dtype"
    );
    assert!(
        pool.is_contiguous(),
        "conv_step: the state pool must be contiguous"
    );
}

/// The conv's share of a fused [`conv_ssm_launch`]: weight `[C, K]`, bias, the ring pool
/// `[S, C, K]` and the slot lengths `[S]`.
pub struct ConvIn<R: CubeRuntime> {
    pub weight: CubeTensor<R>,
    pub bias: Maybe<CubeBackend<R>>,
    pub pool: CubeTensor<R>,
    pub lens: CubeTensor<R>,
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn ssm_step_kernel<F: Float, P: Numeric>(
    xbc: &[F],
    dt: &[F],
    dt_bias: &[F],
    a: &[F],
    d: &[F],
    slots: &[i32],
    pool: &mut [P],
    y: &mut [F],
    cw: &[F],
    cbias: &[F],
    cpool: &mut [F],
    lens: &[i32],
    heads: u32,
    head_dim: u32,
    groups: u32,
    n_state: u32,
    k: u32,
    dt_floor: f32,
    #[comptime] units: usize,
    #[comptime] plane: bool,
    #[comptime] per: usize,
    #[comptime] conv: usize,
    #[comptime] has_bias: bool,
    #[comptime] packed: bool,
    #[comptime] walk: usize,
) {
    // `conv > 0`: `xbc` is the raw `in_proj` part and `conv = 2N` (the shared `B | C` tile).
    // `packed`: `pool` holds u32 words of two bf16 (`P = u32`), else f32 values (`P = f32`).
    let (h, p, g, n) = (
        heads as usize,
        head_dim as usize,
        groups as usize,
        n_state as usize,
    );
    let width = h * p + 2 * g * n;
    // (row, head) pairs folded over y and z (a batch may pass 65,535 rows); uniform per cube.
    let rh = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if rh >= slots.len() * h {
        terminate!();
    }
    let b = rh / h;
    let hh = rh % h;
    let slot = slots[b];
    let gg = hh / (h / g);
    let bb = b * width + h * p + gg * n;
    let cb = bb + g * n;
    let mut sbc = Shared::<[f32]>::new_slice(comptime!(conv.max(1)));
    let mut len = 0usize;
    if conv > 0 {
        if slot >= 0 {
            len = lens[slot as usize] as usize;
            let tid = (UNIT_POS_Y * CUBE_DIM_X + UNIT_POS_X) as usize;
            let threads = (CUBE_DIM_X * CUBE_DIM_Y) as usize;
            let writer = hh % (h / g) == 0 && CUBE_POS_X == 0;
            let mut j = tid;
            while j < 2 * n {
                let at = if j < n { bb + j } else { cb + j - n };
                sbc[j] = conv_tap::<F>(
                    xbc,
                    cw,
                    cbias,
                    cpool,
                    at,
                    at - b * width,
                    slot as usize,
                    width,
                    k as usize,
                    len,
                    writer,
                    has_bias,
                );
                j += threads;
            }
        }
        sync_cube();
    }
    // `walk` rows of `p` per warp: `dt`, the decay and (in registers) `B`, `C` once for them.
    let pp0 = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize * walk;
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    // A register share of `per` values a lane (the launcher passes 0 for the strided loop).
    let regs = comptime!(per > 0);
    let mut accs = Array::<f32>::new(walk);
    let mut xs = Array::<f32>::new(walk);
    #[unroll]
    for r in 0..walk {
        accs[r] = 0.0f32;
        xs[r] = 0.0f32;
    }
    if slot >= 0 && pp0 < p {
        // As `dt_softplus` computes and stores it.
        let raw = f32::cast_from(dt[b * h + hh]) + f32::cast_from(dt_bias[hh]);
        let sp = raw.max(0.0f32) + (-raw.abs()).exp().log1p();
        let dtv = f32::cast_from(F::cast_from(sp.max(dt_floor)));
        let decay = (dtv * f32::cast_from(a[hh])).exp();
        // The lane's share of `B` and `C`: element `lane + i·lanes` (f32 state) or the two
        // elements of word `lane + (i/2)·lanes` (packed), as the state share below.
        let mut bv = Array::<f32>::new(comptime!(per.max(1)));
        let mut cv = Array::<f32>::new(comptime!(per.max(1)));
        if regs {
            #[unroll]
            for i in 0..per {
                let nn = if packed {
                    2 * (lane + (i / 2) * lanes) + i % 2
                } else {
                    lane + i * lanes
                };
                if conv > 0 {
                    bv[i] = sbc[nn];
                    cv[i] = sbc[n + nn];
                } else {
                    bv[i] = f32::cast_from(xbc[bb + nn]);
                    cv[i] = f32::cast_from(xbc[cb + nn]);
                }
            }
        }
        #[unroll]
        for r in 0..walk {
            let pp = pp0 + r;
            if pp < p {
                let mut acc = 0.0f32;
                let xat = b * width + hh * p + pp;
                let xv = if conv > 0 {
                    conv_tap::<F>(
                        xbc,
                        cw,
                        cbias,
                        cpool,
                        xat,
                        hh * p + pp,
                        slot as usize,
                        width,
                        k as usize,
                        len,
                        UNIT_POS_X == 0,
                        has_bias,
                    )
                } else {
                    f32::cast_from(xbc[xat])
                };
                xs[r] = xv;
                let row = ((slot as usize * h + hh) * p + pp) * n;
                if regs && packed {
                    // The lane's `per / 2` words, loaded before any is used and stored after
                    // (one memory latency, not `per / 2`).
                    let words = comptime!(per / 2);
                    let wrow = row / 2;
                    let mut wd = Array::<u32>::new(words);
                    #[unroll]
                    for j in 0..words {
                        wd[j] = u32::cast_from(pool[wrow + lane + j * lanes]);
                    }
                    #[unroll]
                    for j in 0..words {
                        let s0 = decay * bf16_lo(wd[j]) + dtv * xv * bv[2 * j];
                        let s1 = decay * bf16_hi(wd[j]) + dtv * xv * bv[2 * j + 1];
                        acc += s0 * cv[2 * j];
                        acc += s1 * cv[2 * j + 1];
                        wd[j] = bf16_word(s0, s1);
                    }
                    #[unroll]
                    for j in 0..words {
                        pool[wrow + lane + j * lanes] = P::cast_from(wd[j]);
                    }
                } else if regs {
                    // `n = per · lanes`: the lane's whole share of the state row, loaded before
                    // any is used, the new state stored after.
                    let mut st = Array::<f32>::new(per);
                    #[unroll]
                    for i in 0..per {
                        st[i] = f32::cast_from(pool[row + lane + i * lanes]);
                    }
                    #[unroll]
                    for i in 0..per {
                        let s = decay * st[i] + dtv * xv * bv[i];
                        st[i] = s;
                        acc += s * cv[i];
                    }
                    #[unroll]
                    for i in 0..per {
                        pool[row + lane + i * lanes] = P::cast_from(st[i]);
                    }
                } else if packed {
                    let wrow = row / 2;
                    let mut w = lane;
                    while w < n / 2 {
                        let mut bn = Array::<f32>::new(2usize);
                        let mut cn = Array::<f32>::new(2usize);
                        #[unroll]
                        for e in 0..2usize {
                            let nn = 2 * w + e;
                            if conv > 0 {
                                bn[e] = sbc[nn];
                                cn[e] = sbc[n + nn];
                            } else {
                                bn[e] = f32::cast_from(xbc[bb + nn]);
                                cn[e] = f32::cast_from(xbc[cb + nn]);
                            }
                        }
                        let word = u32::cast_from(pool[wrow + w]);
                        let s0 = decay * bf16_lo(word) + dtv * xv * bn[0];
                        let s1 = decay * bf16_hi(word) + dtv * xv * bn[1];
                        acc += s0 * cn[0];
                        acc += s1 * cn[1];
                        pool[wrow + w] = P::cast_from(bf16_word(s0, s1));
                        w += lanes;
                    }
                } else {
                    let mut nn = lane;
                    while nn < n {
                        let bn = if conv > 0 {
                            sbc[nn]
                        } else {
                            f32::cast_from(xbc[bb + nn])
                        };
                        let cn = if conv > 0 {
                            sbc[n + nn]
                        } else {
                            f32::cast_from(xbc[cb + nn])
                        };
                        let s = decay * f32::cast_from(pool[row + nn]) + dtv * xv * bn;
                        pool[row + nn] = P::cast_from(s);
                        acc += s * cn;
                        nn += lanes;
                    }
                }
                accs[r] = acc;
            }
        }
    }
    // Every unit reduces (the shared-memory form synchronizes the cube), rows past `p` too.
    #[unroll]
    for r in 0..walk {
        let total = lane_sum(accs[r], units, plane);
        let pp = pp0 + r;
        if UNIT_POS_X == 0 && pp < p {
            let mut out = 0.0f32;
            if slot >= 0 {
                out = total + f32::cast_from(d[hh]) * xs[r];
            }
            y[(b * h + hh) * p + pp] = F::cast_from(out);
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn ssm_launch<R: CubeRuntime>(
    xbc: CubeTensor<R>,
    dt: CubeTensor<R>,
    dt_bias: CubeTensor<R>,
    a: CubeTensor<R>,
    d: CubeTensor<R>,
    pool: CubeTensor<R>,
    slots: CubeTensor<R>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (y, _, pool) = step_launch(xbc, dt, None, dt_bias, a, d, pool, slots, dims, dt_min);
    (y, pool)
}

/// The conv step and the SSM step in one launch: `(y, conv pool, ssm pool)`.
#[allow(clippy::too_many_arguments)]
pub fn conv_ssm_launch<R: CubeRuntime>(
    xbc: CubeTensor<R>,
    dt: CubeTensor<R>,
    conv: ConvIn<R>,
    dt_bias: CubeTensor<R>,
    a: CubeTensor<R>,
    d: CubeTensor<R>,
    pool: CubeTensor<R>,
    slots: CubeTensor<R>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (y, cp, pool) = step_launch(
        xbc,
        dt,
        Some(conv),
        dt_bias,
        a,
        d,
        pool,
        slots,
        dims,
        dt_min,
    );
    // `Some` in, `Some` out.
    (y, cp.unwrap_or_else(|| unreachable!()), pool)
}

#[allow(clippy::too_many_arguments)]
fn step_launch<R: CubeRuntime>(
    xbc: CubeTensor<R>,
    dt: CubeTensor<R>,
    conv: Option<ConvIn<R>>,
    dt_bias: CubeTensor<R>,
    a: CubeTensor<R>,
    d: CubeTensor<R>,
    pool: CubeTensor<R>,
    slots: CubeTensor<R>,
    dims: ScanDims,
    dt_min: Option<f32>,
) -> (CubeTensor<R>, Option<CubeTensor<R>>, CubeTensor<R>) {
    let xbc = float_buf(xbc);
    let dtype = xbc.dtype;
    // I32 words: the bf16 state (two values a word).
    let packed = pool.dtype == DType::I32;
    assert!(
        pool.dtype == DType::F32 || (packed && dims.state.is_multiple_of(2)),
        "ssm_step: the state pool is f32, or I32 words of bf16 pairs for an even state size"
    );
    assert!(
        pool.is_contiguous(),
        "ssm_step: the state pool must be contiguous"
    );
    let rows = xbc.meta.shape()[0];
    let ScanDims {
        heads: h,
        head_dim: p,
        groups: g,
        state: n,
    } = dims;
    let same = |t| contiguous_as(t, dtype);
    let (dt, dt_bias, a, d) = (same(dt), same(dt_bias), same(a), same(d));
    let slots = i32_buf(slots);
    let conv = conv.map(|c| {
        check_ring(&c.pool, dtype);
        let k = c.weight.meta.shape()[1];
        let bias = c.bias.into_option().map(same);
        (same(c.weight), bias, c.pool, i32_buf(c.lens), k)
    });
    let y = empty(&xbc, [rows, h, p], dtype);
    // A lane's share of a state row held in registers where it divides evenly (up to 8 values:
    // `n` ≤ 256; whole words where packed); otherwise (0) the strided loop.
    let lanes = SSM_LANES as usize;
    let per = if n % lanes == 0 && n / lanes <= 8 && (!packed || (n / lanes) % 2 == 0) {
        n / lanes
    } else {
        0
    };
    let walk = ssm_walk_plan(rows * h, p, per > 0, ssm_walk());
    let (gy, gz) = yz(rows * h);
    let count = CubeCount::Static(p.div_ceil(SSM_ROWS as usize * walk) as u32, gy, gz);
    // No floor: one below any softplus value (softplus > 0).
    let floor = dt_min.unwrap_or(-1.0);
    // Without the conv its arguments are stand-ins the kernel never reads (the writable one a
    // buffer of its own: wgpu refuses a buffer bound both read-only and writable).
    let spare = empty(&xbc, [1], dtype);
    let (cw, cb, cp, lens, k, has_bias) = match &conv {
        Some((w, b, p, l, k)) => (w, b.as_ref().unwrap_or(w), p, l, *k, b.is_some()),
        None => (&dt, &dt, &spare, &slots, 1, false),
    };
    let shared = if conv.is_some() { 2 * n } else { 0 };
    macro_rules! launch {
        ($t:ty, $p:ty) => {
            ssm_step_kernel::launch::<$t, $p, R>(
                &xbc.client,
                count,
                CubeDim::new_2d(SSM_LANES, SSM_ROWS),
                arg(&xbc),
                arg(&dt),
                arg(&dt_bias),
                arg(&a),
                arg(&d),
                arg(&slots),
                arg(&pool),
                arg(&y),
                arg(cw),
                arg(cb),
                arg(cp),
                arg(lens),
                h as u32,
                p as u32,
                g as u32,
                n as u32,
                k as u32,
                floor,
                (SSM_LANES * SSM_ROWS) as usize,
                plane_reduce(&xbc.client, SSM_LANES),
                per,
                shared,
                has_bias,
                packed,
                walk,
            )
        };
    }
    macro_rules! go {
        ($t:ty) => {
            if packed {
                launch!($t, u32)
            } else {
                launch!($t, f32)
            }
        };
    }
    with_float!(dtype, go);
    (y, conv.map(|c| c.2), pool)
}
