//! The selective scan in Mamba2's chunked matrix form (state-space duality, SSD) on the tensor
//! cores: bf16 `x`, `B`, `C`, f32 accumulation and f32 state. One cube per `(b, chunk, h)`,
//! `L / 16` warps for a chunk of up to `L` steps ([`SSD_MAX_CHUNK`]).
//!
//! **Math.** With `la[t] = Σ_{s ≤ t} dt_s·A` over the chunk (the cumulative log decay) and the
//! chunk's incoming state `S₀` (the sequence's state for its first chunk, zero after):
//! - `y_t = e^{la[t]} · C_t·S₀ᵀ + Σ_{s ≤ t} (C_t·B_s) · e^{la[t] − la[s]} · dt_s · x_s + D·x_t`;
//! - the chunk's end state `S[p, n] = e^{la[L−1]}·S₀ + Σ_s x_s[p] · e^{la[L−1] − la[s]} · dt_s · B_s[n]`;
//! - its decay `e^{la[L−1]}`.
//!
//! This is the recurrence `S_t = e^{dt_t·A}·S_{t−1} + dt_t·x_t ⊗ B_t`, `y_t = S_t·C_t + D·x_t`
//! unrolled over the chunk. Three `mma` products per warp (`m16n8k16`, bf16 → f32): `G = C·Bᵀ`
//! over its 16 rows of `t` (causal: only the `s ≤ t` tiles), kept in registers and turned into
//! `M = G ∘ e^{la[t] − la[s]} · dt_s` (masked to `s ≤ t`), which is at once the `A` fragment of
//! `Y += M·X` (the accumulator layout of an `n`-tile pair is the `A` layout of a `k`-tile); the
//! incoming state's part `C·S₀ᵀ` into the same accumulator first (scaled by `e^{la[t]}`); and the
//! end state `(x ∘ w)ᵀ·B` with `w_s = e^{la[L−1] − la[s]} · dt_s`, split over the warps by
//! 16 rows of `P` × up to 8 tiles of `N`. `M` and `x ∘ w` enter the `mma`s as two bf16 terms
//! each, and so does `S₀` (`hi + lo`, ≈ 16 bits: `mamba_ssm`'s Triton kernels round them to
//! bf16 once, which moved the tiny bf16 model past its parity band, PERF §21); every sum is
//! f32. New sequences (no state given) skip the `C·S₀ᵀ` term and its loads.
//!
//! **Chunks.** A prompt of one chunk per sequence writes `y` and the new state here. Longer ones
//! write f32 local outputs, end states and decays in the layout of [`super::scan`]'s chunked
//! path, whose carry and out kernels finish the job (state passed between chunks; the incoming
//! state's part of chunks after the first).
//!
//! **Shared memory** (pairs of bf16, one 32-bit word each; rows padded by [`PAD`] words so the
//! 8 rows × 4 columns a fragment load touches fall in 32 distinct banks): `C` and `B` rows of
//! the chunk (pairs along `N`), `x` transposed (pairs along time, `P` rows), `dt` and `la`.
//! At `L = 128`, `N = 128`, `P = 64`: 88,064 bytes (86 KiB), two cubes per H200 SM.
//!
//! Grid: one cube per `(b, chunk, h)` on x, folded onto y past the device's limit.

use super::scan::{carry_and_out, Chunks, CHUNK_STATE_BYTES};
use crate::cube::bf16_mma::{mma_acc, scaled, Pair, F2};
use crate::cube::buffers::{arg, contiguous_as, empty, f32_buf, fold, lens_arg, lens_buf};
use burn::tensor::{bf16, DType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::cmma::MmaDefinition;
use cubecl::prelude::*;

/// The longest chunk of one cube (8 warps of 16 steps).
pub const SSD_MAX_CHUNK: usize = 128;
/// The largest `N` and `P` the kernel stages (shared memory within two cubes per SM at 128).
pub const SSD_MAX_DIM: usize = 128;
/// Padding words per shared row (module docs).
pub const PAD: usize = 4;

static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many scans this process has run in this form (so a test can tell that it ran, not the
/// register scan it falls back to).
pub fn launches() -> usize {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Prompt tokens (`B · T`) from which a bf16 scan on a device with tensor cores runs in the
/// chunked matrix form (this module), by default: 1,024, the smallest prompt measured. On the
/// H200 (PERF §22), with its loads vectorized, new sequences' state terms skipped and `M` /
/// `x ∘ w` in two bf16 terms, prefill ran +5.1 % at 1 × 1,024, +6.1 % at 16 × 128 and +6.0 % at
/// 64 × 128 over the register scan, and the whole-model bf16 parity tests passed with it forced
/// on (the first cut, rounding them once, did not: §21). Below it — short prompts, and the
/// one-token forwards of `forward_one` — the register scan runs (a chunk is padded to 16 steps).
pub const SSD_MIN_TOKENS: usize = 1024;

static SSD_MIN: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(SSD_MIN_TOKENS);
static SSD_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets the prompt tokens from which the scan takes the tensor-core form (process-wide; for
/// tests and benchmarks; `usize::MAX`: never).
pub fn set_ssd_min(tokens: usize) {
    SSD_MIN.store(tokens, std::sync::atomic::Ordering::Relaxed);
    SSD_SET.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The current [`set_ssd_min`] setting; before any, `NEMOTRON_SCAN_SSD`
/// ([`crate::cube::tuning::scan_ssd_min`]) or [`SSD_MIN_TOKENS`].
pub fn ssd_min() -> usize {
    if SSD_SET.load(std::sync::atomic::Ordering::Relaxed) {
        return SSD_MIN.load(std::sync::atomic::Ordering::Relaxed);
    }
    crate::cube::tuning::scan_ssd_min().unwrap_or(SSD_MIN_TOKENS)
}

/// The chunks of the tensor-core form ([`super::ssd`]) for `t` steps of `batch` sequences over
/// `rows` state rows (`B · H · P`) of `n` entries, `p` per head, from `ssd_min` prompt tokens,
/// chunks of `len` steps asked for (rounded up to 16, at most [`SSD_MAX_CHUNK`]);
/// `None` where the shapes do not fit it or the chunk end states would pass
/// [`CHUNK_STATE_BYTES`] (pure; the caller checks the dtype and the device).
pub fn ssd_plan(
    n: usize,
    p: usize,
    rows: usize,
    batch: usize,
    t: usize,
    ssd_min: usize,
    len: usize,
) -> Option<Chunks> {
    if t == 0 || batch.saturating_mul(t) < ssd_min || !fits(n, p) {
        return None;
    }
    let len = chunk_len(len);
    let count = t.div_ceil(len);
    if count >= 2 && rows.saturating_mul(count).saturating_mul(n * 4) > CHUNK_STATE_BYTES {
        return None;
    }
    Some(Chunks { len, count })
}

/// The chunks a bf16 scan of `x` `[B, T, H, P]` with `B`/`C` `[B, T, G, N]` takes in this form
/// on this device, with the current settings ([`ssd_min`], the scan's chunk length); `None`:
/// the register scan ([`super::scan::launch`]).
pub fn chunks_for<R: CubeRuntime>(x: &CubeTensor<R>, b: &CubeTensor<R>) -> Option<Chunks> {
    let xs = x.meta.shape();
    let (bs, t, h, p) = (xs[0], xs[1], xs[2], xs[3]);
    let n = b.meta.shape()[3];
    if x.dtype != DType::BF16 || !available(&x.client) {
        return None;
    }
    ssd_plan(
        n,
        p,
        bs * h * p,
        bs,
        t,
        ssd_min(),
        super::scan::chunking().len,
    )
}

pub use crate::cube::bf16_mma::available;

/// The chunk length the kernel takes for a requested one: a multiple of 16 up to
/// [`SSD_MAX_CHUNK`].
pub fn chunk_len(requested: usize) -> usize {
    (requested.clamp(1, SSD_MAX_CHUNK).div_ceil(16) * 16).min(SSD_MAX_CHUNK)
}

/// Whether the shapes fit the kernel: `N` a multiple of 16, `N` and `P` at most
/// [`SSD_MAX_DIM`] (pure; tested on the host).
pub fn fits(n: usize, p: usize) -> bool {
    n >= 16 && n % 16 == 0 && n <= SSD_MAX_DIM && p >= 1 && p <= SSD_MAX_DIM
}

#[cube]
fn pair_of(a: f32, b: f32) -> Pair {
    let mut v = F2::empty();
    v.insert(0usize, a);
    v.insert(1usize, b);
    Pair::cast_from(v)
}

/// `v[at..at + count]` as bf16 pairs `hi` and the rounding's remainder `lo` (`hi + lo` ≈ `v`
/// to ≈ 16 bits).
#[cube]
fn split(
    v: &Array<F2>,
    #[comptime] at: usize,
    hi: &mut Array<Pair>,
    lo: &mut Array<Pair>,
    #[comptime] count: usize,
) {
    #[unroll]
    for i in 0..count {
        let f = v[at + i];
        let h = Pair::cast_from(f);
        hi[i] = h;
        lo[i] = Pair::cast_from(f - F2::cast_from(h));
    }
}

/// One chunk of one head (module docs). `new_state` / `decays` / `y` are the chunked path's end
/// states, decays and f32 local outputs when `chunked`, else the new state and `y` themselves.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn ssd_chunk_kernel<Y: Float, NX: Size, NB: Size>(
    x: &[Vector<bf16, NX>],
    dt: &[f32],
    a: &[f32],
    bm: &[Vector<bf16, NB>],
    cm: &[Vector<bf16, NB>],
    d: &[f32],
    lens: &[u32],
    state: &[f32],
    new_state: &mut [f32],
    decays: &mut [f32],
    y: &mut [Y],
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    chunk_len: u32,
    chunks: u32,
    #[comptime] l: usize,
    #[comptime] n: usize,
    #[comptime] pw: usize,
    #[comptime] ragged: bool,
    #[comptime] chunked: bool,
    #[comptime] fresh: bool,
    #[comptime] xw: usize,
) {
    let (t_max, h, p, g, nc) = (
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        chunks as usize,
    );
    let cube = (CUBE_POS_X + CUBE_POS_Y * CUBE_COUNT_X) as usize;
    // Cubes past the end (the folded grid's last row) leave; uniform over the cube.
    if cube >= batch as usize * nc * h {
        terminate!();
    }
    let hh = cube % h;
    let c = (cube / h) % nc;
    let b = cube / (h * nc);
    let gg = hh / (h / g);
    let mut len = t_max;
    if ragged {
        len = lens[b] as usize;
    }
    let ts = c * chunk_len as usize;
    // A chunk past a shorter sequence's end has nothing to do; the first always runs (a
    // length-0 sequence's end state is its input state).
    if c > 0 && ts >= len {
        terminate!();
    }
    let steps = (ts + chunk_len as usize).min(len) - ts.min(len);
    let (lane, warp) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let (gq, tq) = (lane / 4, lane % 4);
    let tid = warp * 32 + lane;
    let threads = comptime!(l / 16 * 32);
    let nw = comptime!(n / 2 + PAD);
    let lw = comptime!(l / 2 + PAD);
    let mut cs = Shared::<[Pair]>::new_slice(comptime!(l * (n / 2 + PAD)));
    let mut bs = Shared::<[Pair]>::new_slice(comptime!(l * (n / 2 + PAD)));
    let mut xs = Shared::<[Pair]>::new_slice(comptime!(pw * (l / 2 + PAD)));
    let mut la = Shared::<[f32]>::new_slice(l);
    let mut ds = Shared::<[f32]>::new_slice(l);
    // Stage B and C of group `gg` (pairs along N) and x transposed (pairs along time): every
    // unit's 16-byte loads issued before its shared stores (rows are read clamped to the
    // sequence and masked past the chunk's steps; columns past P are zero).
    let nv = comptime!(n / 8);
    let per_bc = comptime!(n / 16);
    let mut vb = Array::<Vector<bf16, NB>>::new(per_bc);
    let mut vc = Array::<Vector<bf16, NB>>::new(per_bc);
    #[unroll]
    for i in 0..per_bc {
        let j = i * threads + tid;
        let r = (j / nv).min(t_max - 1 - ts.min(t_max - 1));
        let row = (b * t_max + ts + r) * g + gg;
        vb[i] = bm[row * nv + j % nv];
        vc[i] = cm[row * nv + j % nv];
    }
    #[unroll]
    for i in 0..per_bc {
        let j = i * threads + tid;
        let (r, q) = (j / nv, j % nv);
        let wb = Vector::<u32, Const<4>>::reinterpret(vb[i]);
        let wc = Vector::<u32, Const<4>>::reinterpret(vc[i]);
        let keep = r < steps;
        #[unroll]
        for k in 0..4usize {
            let mut ub = wb.extract(k);
            let mut uc = wc.extract(k);
            if !keep {
                ub = 0u32;
                uc = 0u32;
            }
            bs[r * nw + 4 * q + k] = Pair::reinterpret(ub);
            cs[r * nw + 4 * q + k] = Pair::reinterpret(uc);
        }
    }
    if comptime!(xw == 8) {
        // Units over (pair of steps, 8 columns of P), the step pair fastest (conflict-free
        // shared stores); each loads its two steps' 8 columns.
        let pairs = comptime!(l / 2);
        let total = comptime!(l / 2 * (pw / 8));
        let per_x = comptime!((l / 2 * (pw / 8)).div_ceil(l / 16 * 32));
        let pv_max = p / 8 - 1;
        let last = t_max - 1;
        let mut va = Array::<Vector<bf16, NX>>::new(per_x);
        let mut vz = Array::<Vector<bf16, NX>>::new(per_x);
        #[unroll]
        for i in 0..per_x {
            let j = (i * threads + tid).min(total - 1);
            let (s0, pv) = (2 * (j % pairs), (j / pairs).min(pv_max));
            va[i] = x[((b * t_max + (ts + s0).min(last)) * h + hh) * (p / 8) + pv];
            vz[i] = x[((b * t_max + (ts + s0 + 1).min(last)) * h + hh) * (p / 8) + pv];
        }
        #[unroll]
        for i in 0..per_x {
            let j = i * threads + tid;
            if j < total {
                let (sp, pv) = (j % pairs, j / pairs);
                let col = pv * 8 < p;
                let (k0, k1) = (col && 2 * sp < steps, col && 2 * sp + 1 < steps);
                let wa = Vector::<u32, Const<4>>::reinterpret(va[i]);
                let wz = Vector::<u32, Const<4>>::reinterpret(vz[i]);
                #[unroll]
                for m in 0..4usize {
                    let mut u0 = wa.extract(m);
                    let mut u1 = wz.extract(m);
                    if !k0 {
                        u0 = 0u32;
                    }
                    if !k1 {
                        u1 = 0u32;
                    }
                    let lo = (u0 & 0xFFFFu32) | (u1 << 16u32);
                    let hi = (u0 >> 16u32) | (u1 & 0xFFFF_0000u32);
                    xs[(pv * 8 + 2 * m) * lw + sp] = Pair::reinterpret(lo);
                    xs[(pv * 8 + 2 * m + 1) * lw + sp] = Pair::reinterpret(hi);
                }
            }
        }
    } else {
        let mut j = tid;
        while j < comptime!(pw * (l / 2)) {
            let pr = j % pw;
            let s0 = 2 * (j / pw);
            let mut v0 = 0.0f32;
            let mut v1 = 0.0f32;
            if pr < p {
                if s0 < steps {
                    v0 = f32::cast_from(x[((b * t_max + ts + s0) * h + hh) * p + pr].extract(0));
                }
                if s0 + 1 < steps {
                    v1 =
                        f32::cast_from(x[((b * t_max + ts + s0 + 1) * h + hh) * p + pr].extract(0));
                }
            }
            xs[pr * lw + s0 / 2] = pair_of(v0, v1);
            j += threads;
        }
    }
    if tid < l {
        let mut v = 0.0f32;
        if tid < steps {
            v = dt[(b * t_max + ts + tid) * h + hh];
        }
        ds[tid] = v;
    }
    sync_cube();
    // The cumulative log decay, by warp 0: each lane sums its consecutive steps, then the
    // lanes' totals are scanned across the warp.
    if warp == 0 {
        let per = comptime!(l.div_ceil(32));
        let av = a[hh];
        let mut run = 0.0f32;
        let mut loc = Array::<f32>::new(per);
        #[unroll]
        for i in 0..per {
            let s = lane * per + i;
            let mut v = 0.0f32;
            if s < l {
                v = ds[s] * av;
            }
            run += v;
            loc[i] = run;
        }
        let before = plane_inclusive_sum(run) - run;
        #[unroll]
        for i in 0..per {
            let s = lane * per + i;
            if s < l {
                la[s] = before + loc[i];
            }
        }
    }
    sync_cube();
    let def = MmaDefinition::<bf16, bf16, f32>::new(16usize, 8usize, 16usize);
    let pt = comptime!(pw / 8);
    let st = comptime!(l / 8);
    // Outputs: this warp's 16 steps × P.
    let r0 = warp * 16;
    let (rowa, rowb) = (r0 + gq, r0 + gq + 8);
    if r0 < steps {
        let mut gacc = Array::<F2>::new(comptime!(2 * l / 8));
        let mut yacc = Array::<F2>::new(comptime!(2 * pw / 8));
        #[unroll]
        for i in 0..comptime!(2 * l / 8) {
            gacc[i] = F2::new(0.0f32);
        }
        #[unroll]
        for i in 0..comptime!(2 * pw / 8) {
            yacc[i] = F2::new(0.0f32);
        }
        // The incoming state's terms: the first chunk of a sequence that has one.
        let first = c == 0 && comptime!(!fresh);
        #[unroll]
        for kk in 0..comptime!(n / 16) {
            let mut ra = Array::<Pair>::new(4usize);
            ra[0] = cs[rowa * nw + kk * 8 + tq];
            ra[1] = cs[rowb * nw + kk * 8 + tq];
            ra[2] = cs[rowa * nw + kk * 8 + 4 + tq];
            ra[3] = cs[rowb * nw + kk * 8 + 4 + tq];
            // G = C·Bᵀ over the causal tiles (s ≤ the warp's last row).
            #[unroll]
            for jt in 0..st {
                if jt <= 2 * warp + 1 {
                    let mut rb = Array::<Pair>::new(2usize);
                    rb[0] = bs[(jt * 8 + gq) * nw + kk * 8 + tq];
                    rb[1] = bs[(jt * 8 + gq) * nw + kk * 8 + 4 + tq];
                    mma_acc(&def, &ra, &rb, &mut gacc, jt);
                }
            }
            // C·S₀ᵀ (the first chunk's incoming state): column p of `B` is state row p, as two
            // bf16 terms (hi + lo, as M below).
            if comptime!(!fresh) && first {
                #[unroll]
                for jp in 0..pt {
                    let pc = jp * 8 + gq;
                    let base = ((b * h + hh) * p + pc.min(p - 1)) * n + kk * 16 + 2 * tq;
                    let m = if pc < p { 1.0f32 } else { 0.0f32 };
                    let mut sv = Array::<F2>::new(2usize);
                    let mut s0 = F2::empty();
                    s0.insert(0usize, state[base] * m);
                    s0.insert(1usize, state[base + 1] * m);
                    let mut s1 = F2::empty();
                    s1.insert(0usize, state[base + 8] * m);
                    s1.insert(1usize, state[base + 9] * m);
                    sv[0] = s0;
                    sv[1] = s1;
                    let mut hi = Array::<Pair>::new(2usize);
                    let mut lo = Array::<Pair>::new(2usize);
                    split(&sv, 0usize, &mut hi, &mut lo, 2usize);
                    mma_acc(&def, &ra, &hi, &mut yacc, jp);
                    mma_acc(&def, &ra, &lo, &mut yacc, jp);
                }
            }
        }
        let (laa, lab) = (la[rowa], la[rowb]);
        if comptime!(!fresh) && first {
            let (ea, eb) = (laa.exp(), lab.exp());
            #[unroll]
            for jp in 0..pt {
                yacc[2 * jp] = scaled(yacc[2 * jp], ea);
                yacc[2 * jp + 1] = scaled(yacc[2 * jp + 1], eb);
            }
        }
        // M = G ∘ e^{la[t] − la[s]} · dt_s over s ≤ t; then Y += M·X by k-tiles of 16 steps.
        #[unroll]
        for jt in 0..st {
            if jt <= 2 * warp + 1 {
                let mut ma = F2::empty();
                let mut mb = F2::empty();
                #[unroll]
                for i in 0..2usize {
                    let s = jt * 8 + 2 * tq + i;
                    let (fs, ls) = (ds[s], la[s]);
                    let mut va = 0.0f32;
                    let mut vb = 0.0f32;
                    if s <= rowa {
                        va = gacc[2 * jt].extract(i) * (laa - ls).exp() * fs;
                    }
                    if s <= rowb {
                        vb = gacc[2 * jt + 1].extract(i) * (lab - ls).exp() * fs;
                    }
                    ma.insert(i, va);
                    mb.insert(i, vb);
                }
                gacc[2 * jt] = ma;
                gacc[2 * jt + 1] = mb;
            }
        }
        // M as two bf16 terms (hi + lo: ≈ 16 bits, the register scan's precision to within
        // f32 sums), each an `mma` against the same `X`.
        #[unroll]
        for k2 in 0..comptime!(l / 16) {
            if k2 <= warp {
                let mut ra = Array::<Pair>::new(4usize);
                let mut rl = Array::<Pair>::new(4usize);
                split(&gacc, 4 * k2, &mut ra, &mut rl, 4usize);
                #[unroll]
                for jp in 0..pt {
                    let mut rb = Array::<Pair>::new(2usize);
                    rb[0] = xs[(jp * 8 + gq) * lw + k2 * 8 + tq];
                    rb[1] = xs[(jp * 8 + gq) * lw + k2 * 8 + 4 + tq];
                    mma_acc(&def, &ra, &rb, &mut yacc, jp);
                    mma_acc(&def, &rl, &rb, &mut yacc, jp);
                }
            }
        }
        let dv = d[hh];
        #[unroll]
        for jp in 0..pt {
            #[unroll]
            for hr in 0..2usize {
                #[unroll]
                for i in 0..2usize {
                    let r = r0 + gq + 8 * hr;
                    let pc = jp * 8 + 2 * tq + i;
                    if r < steps && pc < p {
                        let xp = xs[pc * lw + r / 2];
                        let xv = if r % 2 == 0 {
                            f32::cast_from(xp.extract(0))
                        } else {
                            f32::cast_from(xp.extract(1))
                        };
                        let out = ((b * t_max + ts + r) * h + hh) * p + pc;
                        y[out] = Y::cast_from(yacc[2 * jp + hr].extract(i) + dv * xv);
                    }
                }
            }
        }
    }
    // The end state: items of 16 rows of P × `ngs` tiles of 8 of N, over the warps.
    let ngs = comptime!(if (n / 8) % 8 == 0 {
        8
    } else if (n / 8) % 4 == 0 {
        4
    } else {
        2
    });
    let ng = comptime!(n / 8 / ngs);
    let items = comptime!(pw / 16 * ng);
    let lend = la[l - 1];
    let dall = lend.exp();
    let srow = ((b * nc + c) * h + hh) * p;
    let mut item = warp;
    while item < items {
        let mp = item / ng;
        let ngi = item % ng;
        let mut sacc = Array::<F2>::new(comptime!(2 * ngs));
        #[unroll]
        for i in 0..comptime!(2 * ngs) {
            sacc[i] = F2::new(0.0f32);
        }
        let (pa, pb) = (mp * 16 + gq, mp * 16 + gq + 8);
        #[unroll]
        for kk in 0..comptime!(l / 16) {
            let s0 = kk * 16 + 2 * tq;
            let mut w0 = F2::empty();
            let mut w1 = F2::empty();
            #[unroll]
            for i in 0..2usize {
                w0.insert(i, (lend - la[s0 + i]).exp() * ds[s0 + i]);
                w1.insert(i, (lend - la[s0 + 8 + i]).exp() * ds[s0 + 8 + i]);
            }
            // x ∘ w as two bf16 terms (as M above).
            let mut xw4 = Array::<F2>::new(4usize);
            xw4[0] = F2::cast_from(xs[pa * lw + kk * 8 + tq]) * w0;
            xw4[1] = F2::cast_from(xs[pb * lw + kk * 8 + tq]) * w0;
            xw4[2] = F2::cast_from(xs[pa * lw + kk * 8 + 4 + tq]) * w1;
            xw4[3] = F2::cast_from(xs[pb * lw + kk * 8 + 4 + tq]) * w1;
            let mut ra = Array::<Pair>::new(4usize);
            let mut rl = Array::<Pair>::new(4usize);
            split(&xw4, 0usize, &mut ra, &mut rl, 4usize);
            #[unroll]
            for jn in 0..ngs {
                // Column `nc` of `B` (k = steps s0, s0 + 1 and s0 + 8, s0 + 9): one half of a pair.
                let ncol = (ngi * ngs + jn) * 8 + gq;
                let q = ncol / 2;
                let mut e = Array::<f32>::new(4usize);
                #[unroll]
                for i in 0..4usize {
                    let s = s0 + (i / 2) * 8 + i % 2;
                    let v = bs[s * nw + q];
                    e[i] = if ncol % 2 == 0 {
                        f32::cast_from(v.extract(0))
                    } else {
                        f32::cast_from(v.extract(1))
                    };
                }
                let mut rb = Array::<Pair>::new(2usize);
                rb[0] = pair_of(e[0], e[1]);
                rb[1] = pair_of(e[2], e[3]);
                mma_acc(&def, &ra, &rb, &mut sacc, jn);
                mma_acc(&def, &rl, &rb, &mut sacc, jn);
            }
        }
        #[unroll]
        for jn in 0..ngs {
            #[unroll]
            for hr in 0..2usize {
                #[unroll]
                for i in 0..2usize {
                    let pr = pa + 8 * hr;
                    let ncol = (ngi * ngs + jn) * 8 + 2 * tq + i;
                    if pr < p {
                        let mut v = sacc[2 * jn + hr].extract(i);
                        if comptime!(!fresh) && c == 0 {
                            v += dall * state[((b * h + hh) * p + pr) * n + ncol];
                        }
                        new_state[(srow + pr) * n + ncol] = v;
                    }
                }
            }
        }
        item += comptime!(l / 16);
    }
    if chunked && tid == 0 {
        decays[(b * nc + c) * h + hh] = dall;
    }
}

/// The scan of `x` `[B, T, H, P]` (bf16) in chunks of `len` steps (a multiple of 16 up to
/// [`SSD_MAX_CHUNK`], `count` of them: [`chunks_for`]) from `state`, or from the zero state
/// (`None`: new sequences; the incoming state's terms are then not computed). Returns `y` and
/// the new state, as [`super::scan::launch`].
#[allow(clippy::too_many_arguments)]
pub fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    dt: CubeTensor<R>,
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    c: CubeTensor<R>,
    d: CubeTensor<R>,
    state: Option<CubeTensor<R>>,
    lens: &[usize],
    len: usize,
    count: usize,
) -> (CubeTensor<R>, CubeTensor<R>) {
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dtype = x.dtype;
    let fresh = state.is_none();
    // Several chunks: the carry kernel reads the incoming state of a sequence of no steps.
    let state = match state {
        Some(s) => Some(s),
        None if count > 1 => Some(super::scan::zero_state(&x, &b)),
        None => None,
    };
    let state_dtype = state.as_ref().map_or(DType::F32, |s| s.dtype);
    let xs = x.meta.shape().clone();
    let (bs, t, h, p) = (xs[0], xs[1], xs[2], xs[3]);
    let bsh = b.meta.shape().clone();
    let (g, n) = (bsh[2], bsh[3]);
    let (x, bm, cm) = (
        contiguous_as(x, DType::BF16),
        contiguous_as(b, DType::BF16),
        contiguous_as(c, DType::BF16),
    );
    let (dt, a, d) = (f32_buf(dt), f32_buf(a), f32_buf(d));
    // Without a state the kernel reads none: `a` stands in for the argument.
    let st = state.map_or_else(|| a.clone(), f32_buf);
    // x in 16-byte vectors where P allows; B and C always (N is a multiple of 16).
    let xw = if p % 8 == 0 { 8 } else { 1 };
    let client = x.client.clone();
    let lens = lens_buf(&client, lens);
    let ns = empty(&x, [bs, h, p, n], DType::F32);
    let y = empty(&x, [bs, t, h, p], DType::BF16);
    let l = len.div_ceil(16) * 16;
    let pw = p.div_ceil(16) * 16;
    let dim = CubeDim::new_2d(32, (l / 16) as u32);
    let grid = fold(bs * count * h);
    // One chunk per sequence: `y` and the new state here. Several: f32 local outputs, chunk end
    // states and decays, finished by the carry and out kernels.
    let chunked = count > 1;
    let (local, ends, decays) = if chunked {
        (
            empty(&x, [bs, t, h, p], DType::F32),
            empty(&x, [bs, count, h, p, n], DType::F32),
            empty(&x, [bs, count, h], DType::F32),
        )
    } else {
        (y.clone(), ns.clone(), empty(&x, [1], DType::F32))
    };
    macro_rules! go {
        ($y:ty) => {
            ssd_chunk_kernel::launch::<$y, R>(
                &client,
                grid,
                dim,
                xw,
                8,
                arg(&x),
                arg(&dt),
                arg(&a),
                arg(&bm),
                arg(&cm),
                arg(&d),
                lens_arg(&lens, &a),
                arg(&st),
                arg(&ends),
                arg(&decays),
                arg(&local),
                bs as u32,
                t as u32,
                h as u32,
                p as u32,
                g as u32,
                len as u32,
                count as u32,
                l,
                n,
                pw,
                lens.is_some(),
                chunked,
                fresh,
                xw,
            )
        };
    }
    if !chunked {
        go!(bf16);
        return (contiguous_as(y, dtype), contiguous_as(ns, state_dtype));
    }
    go!(f32);
    carry_and_out(
        &client,
        &local,
        &dt,
        &a,
        &cm,
        &lens,
        &st,
        &ends,
        &decays,
        &ns,
        &y,
        (bs, t, h, p, g, n),
        (len, count),
        DType::BF16,
    );
    (contiguous_as(y, dtype), contiguous_as(ns, state_dtype))
}
