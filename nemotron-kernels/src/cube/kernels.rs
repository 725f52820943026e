//! The CubeCL kernels, runtime-generic (`#[cube]`): the same source runs on CUDA and on wgpu.
//! Activations are read and written in their storage type (`F`: f32, bf16, f16) and accumulated in
//! f32 (the Mamba kernels take f32); packed weights are read as u32 words (E2M1 nibbles, E4M3 bytes);
//! E2M1 codes are decoded from their bits, E4M3 bytes through a table built from the format
//! definitions.

use cubecl::prelude::*;

/// Sums `value` over the `CUBE_DIM_X` lanes of each unit row (`UNIT_POS_Y`) through shared
/// memory; every unit must call it. `units` = `CUBE_DIM_X · CUBE_DIM_Y` (comptime, for the
/// shared allocation).
#[cube]
fn row_sum(value: f32, #[comptime] units: u32) -> f32 {
    let mut sm = SharedMemory::<f32>::new(units as usize);
    let lanes = CUBE_DIM_X as usize;
    let base = UNIT_POS_Y as usize * lanes;
    let x = UNIT_POS_X as usize;
    sm[base + x] = value;
    sync_cube();
    let mut stride = lanes / 2;
    while stride > 0 {
        if x < stride {
            sm[base + x] = sm[base + x] + sm[base + x + stride];
        }
        sync_cube();
        stride /= 2;
    }
    sm[base]
}

/// The value of an E2M1 code (bit 3 sign, bits 0-2 magnitude: 0, 0.5, 1, 1.5, 2, 3, 4, 6) built
/// from its bits, without a table lookup: magnitudes ≥ 2 are `2^((m>>1)-1) · (1 + (m&1)/2)`, i.e.
/// f32 exponent `(m>>1) + 126` and the top mantissa bit `m&1`; 1 is 0.5 (0x3F000000), 0 is 0.
#[cube]
fn e2m1(code: u32) -> f32 {
    let m = code & 7u32;
    let normal = (((m >> 1u32) + 126u32) << 23u32) | ((m & 1u32) << 22u32);
    let small = m * 0x3F000000u32;
    let bits = if m >= 2u32 { normal } else { small };
    f32::reinterpret(bits | ((code & 8u32) << 28u32))
}

/// `Σ_b s[row, b] · Σ_j E2M1[code(row, 16b + j)] · x[xrow, 16b + j]` over this unit's blocks
/// (`b ≡ UNIT_POS_X mod CUBE_DIM_X`): one lane's share of an NVFP4 row dot product.
#[cube]
fn nvfp4_partial<F: Float>(
    x: &Array<F>,
    packed: &Array<u32>,
    scales: &Array<u32>,
    e4m3: &Array<f32>,
    row: usize,
    xrow: usize,
    k: usize,
    sw: usize,
) -> f32 {
    let nb = k / 16;
    let mut acc = 0.0f32;
    let mut b = UNIT_POS_X as usize;
    while b < nb {
        let sword = scales[row * sw + b / 4];
        let sbyte = (sword >> (((b % 4) * 8) as u32)) & 255u32;
        let s = e4m3[sbyte as usize];
        let wbase = row * (k / 8) + b * 2;
        let xbase = xrow * k + b * 16;
        let mut part = 0.0f32;
        for w in 0..2usize {
            let word = packed[wbase + w];
            for j in 0..8usize {
                let code = (word >> ((j * 4) as u32)) & 15u32;
                part += e2m1(code) * f32::cast_from(x[xbase + w * 8 + j]);
            }
        }
        acc += part * s;
        b += CUBE_DIM_X as usize;
    }
    acc
}

/// NVFP4 linear: `y[m, n] = gs · Σ_b s[n, b] · Σ_j E2M1[code(n, 16b + j)] · x[m, 16b + j]`.
/// A cube holds `CUBE_DIM_Y` output rows of one input row `m` (`CUBE_POS_Y`), a row per unit row;
/// the lanes of a unit row stride over the 16-element blocks (coalesced weight reads).
/// `packed`: `[N, K/8]` words (8 codes each, the low nibble first); `scales`: `[N, sw]` words of
/// four E4M3 bytes (row-padded).
#[cube(launch)]
pub fn nvfp4_linear_kernel<F: Float>(
    x: &Array<F>,
    packed: &Array<u32>,
    scales: &Array<u32>,
    e4m3: &Array<f32>,
    y: &mut Array<F>,
    k: u32,
    n_out: u32,
    sw: u32,
    global: f32,
    #[comptime] units: u32,
    #[comptime] relu2: bool,
) {
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let m = CUBE_POS_Y as usize;
    let mut acc = 0.0f32;
    if n < n_out as usize {
        acc = nvfp4_partial(x, packed, scales, e4m3, n, m, k as usize, sw as usize);
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out as usize {
        y[m * n_out as usize + n] = F::cast_from(epilogue(total * global, relu2));
    }
}

/// Routed-expert NVFP4 linear: `y[s, n] = gs[e] · Σ_b s_e[n, b] · Σ_j E2M1[code_e(n, 16b + j)] ·
/// x[s / div, 16b + j]` with `e = experts[s]`. Cubes as in [`nvfp4_linear_kernel()`], with slots in
/// place of input rows (`slot = CUBE_POS_Y + CUBE_POS_Z · CUBE_COUNT_Y`). The experts are
/// stacked: `packed` `[E · N, K/8]`, `scales` `[E · N, sw]`, `globals` `[E]`.
#[cube(launch)]
pub fn nvfp4_expert_linear_kernel<F: Float>(
    x: &Array<F>,
    experts: &Array<i32>,
    packed: &Array<u32>,
    scales: &Array<u32>,
    globals: &Array<f32>,
    e4m3: &Array<f32>,
    y: &mut Array<F>,
    k: u32,
    n_out: u32,
    sw: u32,
    slots: u32,
    div: u32,
    #[comptime] units: u32,
    #[comptime] relu2: bool,
) {
    let slot = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if slot >= slots as usize {
        terminate!();
    }
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let e = experts[slot] as usize;
    let mut acc = 0.0f32;
    if n < n_out as usize {
        let row = e * n_out as usize + n;
        acc = nvfp4_partial(
            x,
            packed,
            scales,
            e4m3,
            row,
            slot / div as usize,
            k as usize,
            sw as usize,
        );
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out as usize {
        y[slot * n_out as usize + n] = F::cast_from(epilogue(total * globals[e], relu2));
    }
}

/// Group RMSNorm, optionally gated: one cube per `(row, group)` (`CUBE_POS_X`, `CUBE_POS_Y`); the
/// units stride over the group's channels, sum `u²` in f32, then write `w · u · rsqrt(mean + eps)`
/// with `u = x · silu(gate)` (gated) or `x`.
#[cube(launch)]
pub fn rms_norm_kernel<F: Float>(
    x: &Array<F>,
    gate: &Array<F>,
    weight: &Array<F>,
    y: &mut Array<F>,
    h: u32,
    group: u32,
    eps: f32,
    #[comptime] gated: bool,
    #[comptime] units: u32,
) {
    let (h, group) = (h as usize, group as usize);
    let base = CUBE_POS_X as usize * h + CUBE_POS_Y as usize * group;
    let wbase = CUBE_POS_Y as usize * group;
    let mut ss = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < group {
        let mut u = f32::cast_from(x[base + c]);
        if gated {
            let z = f32::cast_from(gate[base + c]);
            u *= z / (1.0f32 + f32::exp(-z));
        }
        ss += u * u;
        c += CUBE_DIM_X as usize;
    }
    let total = row_sum(ss, units);
    let inv = 1.0f32 / f32::sqrt(total / group as f32 + eps);
    let mut c = UNIT_POS_X as usize;
    while c < group {
        let mut u = f32::cast_from(x[base + c]);
        if gated {
            let z = f32::cast_from(gate[base + c]);
            u *= z / (1.0f32 + f32::exp(-z));
        }
        y[base + c] = F::cast_from(u * inv * f32::cast_from(weight[wbase + c]));
        c += CUBE_DIM_X as usize;
    }
}

/// MoE routing, one unit per token (`E · k` work each, deterministic): `s = sigmoid(logit)`,
/// groups ranked by the sum of their two best `s + bias`, the `topk_group` best kept (a bit mask),
/// then `k` passes each taking the best not-yet-chosen `s + bias` (dropped groups score
/// `masked`; ties go to the lower index), weights `s` (or the biased score) renormalized and
/// scaled. `idx`/`w`: `[N, k]`.
#[cube(launch)]
pub fn moe_route_kernel(
    logits: &Array<f32>,
    bias: &Array<f32>,
    idx: &mut Array<i32>,
    w: &mut Array<f32>,
    tokens: u32,
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    scaling: f32,
    masked: f32,
    #[comptime] renorm: bool,
    #[comptime] biased_weights: bool,
) {
    let t = ABSOLUTE_POS as usize;
    if t >= tokens as usize {
        terminate!();
    }
    let (e_n, k, ng) = (experts as usize, top_k as usize, n_group as usize);
    let per = e_n / ng;
    let row = t * e_n;
    // Kept groups as a bit mask (n_group ≤ 32).
    let mut keep = 0u32;
    if ng > 1 {
        for _ in 0..topk_group as usize {
            let mut best_g = ng;
            let mut best_v = 0.0f32;
            for g in 0..ng {
                if (keep >> g as u32) & 1u32 == 0u32 {
                    let mut b1 = masked;
                    let mut b2 = masked;
                    for j in 0..per {
                        let e = g * per + j;
                        let v = 1.0f32 / (1.0f32 + f32::exp(-logits[row + e])) + bias[e];
                        if v > b1 {
                            b2 = b1;
                            b1 = v;
                        } else if v > b2 {
                            b2 = v;
                        }
                    }
                    let gs = if per > 1 { b1 + b2 } else { b1 };
                    if best_g == ng || gs > best_v {
                        best_g = g;
                        best_v = gs;
                    }
                }
            }
            keep |= 1u32 << best_g as u32;
        }
    } else {
        keep = 1u32;
    }
    let mut sum = 0.0f32;
    for j in 0..k {
        let mut best_e = e_n;
        let mut best_v = 0.0f32;
        for e in 0..e_n {
            let mut taken = false;
            for i in 0..j {
                if idx[t * k + i] == e as i32 {
                    taken = true;
                }
            }
            if !taken {
                let g = e / per;
                let allowed = (keep >> g as u32) & 1u32 == 1u32;
                let v = if allowed {
                    1.0f32 / (1.0f32 + f32::exp(-logits[row + e])) + bias[e]
                } else {
                    masked
                };
                if best_e == e_n || v > best_v {
                    best_e = e;
                    best_v = v;
                }
            }
        }
        idx[t * k + j] = best_e as i32;
        let s = 1.0f32 / (1.0f32 + f32::exp(-logits[row + best_e]));
        let wv = if biased_weights { best_v } else { s };
        w[t * k + j] = wv;
        sum += wv;
    }
    for j in 0..k {
        let mut v = w[t * k + j];
        if renorm {
            v = v / (sum + 1e-20f32);
        }
        w[t * k + j] = v * scaling;
    }
}

/// The linear kernels' epilogue: `relu(v)²` when `relu2`, `v` otherwise.
#[cube]
fn epilogue(v: f32, #[comptime] relu2: bool) -> f32 {
    if relu2 {
        let r = f32::max(v, 0.0f32);
        r * r
    } else {
        v
    }
}

/// `softplus(dt + bias[h]) ` then `max(·, min)` (`min` = −∞ stand-in when unclamped), elementwise
/// over `[N, H]`: `max(x, 0) + log1p(exp(−|x|))`.
#[cube(launch)]
pub fn dt_softplus_kernel<F: Float>(
    dt: &Array<F>,
    bias: &Array<F>,
    y: &mut Array<F>,
    len: u32,
    heads: u32,
    min: f32,
) {
    let i = ABSOLUTE_POS as usize;
    if i >= len as usize {
        terminate!();
    }
    let x = f32::cast_from(dt[i]) + f32::cast_from(bias[i % heads as usize]);
    let sp = f32::max(x, 0.0f32) + f32::log1p(f32::exp(-f32::abs(x)));
    y[i] = F::cast_from(f32::max(sp, min));
}

/// E4M3 round-to-nearest-even of `v` (already clamped to ±448), returned as its f32 value.
#[cube]
fn e4m3_round(v: f32) -> f32 {
    let a = f32::abs(v);
    let min_normal = 0.015625f32; // 2^-6
                                  // Keep 3 mantissa bits: drop 20 with round-half-even (a carry moves the exponent up).
                                  // Subnormals are multiples of 2^-9: shifted into [2^-6, 2^-5), that is the ulp there.
    let shifted = a < min_normal;
    let base = if shifted { a + min_normal } else { a };
    let bits = u32::reinterpret(base);
    let lsb = (bits >> 20u32) & 1u32;
    let rounded = f32::reinterpret((bits + 0x7FFFFu32 + lsb) & 0xFFF00000u32);
    let r = if shifted {
        rounded - min_normal
    } else {
        rounded
    };
    if v < 0.0 {
        -r
    } else {
        r
    }
}

/// One lane's share of a W8A8 row dot product: `Σ e4m3(clamp(x / is, ±448)) · W8[row, k]` over
/// the words `w ≡ UNIT_POS_X mod CUBE_DIM_X`.
#[cube]
fn fp8_partial<F: Float>(
    x: &Array<F>,
    weight: &Array<u32>,
    e4m3: &Array<f32>,
    row: usize,
    xrow: usize,
    k: usize,
    input_scale: f32,
) -> f32 {
    let nw = k / 4;
    let mut acc = 0.0f32;
    let mut w = UNIT_POS_X as usize;
    while w < nw {
        let word = weight[row * nw + w];
        for j in 0..4usize {
            let byte = (word >> ((j * 8) as u32)) & 255u32;
            let xv = f32::clamp(
                f32::cast_from(x[xrow * k + w * 4 + j]) / input_scale,
                -448.0f32,
                448.0f32,
            );
            acc += e4m3_round(xv) * e4m3[byte as usize];
        }
        w += CUBE_DIM_X as usize;
    }
    acc
}

/// Static W8A8 FP8 linear: `y[m, n] = (is · ws) · Σ_k e4m3(clamp(x[m,k] / is, ±448)) · W8[n, k]`.
/// `weight`: `[N, K/4]` words of four E4M3 bytes. Cubes as in [`nvfp4_linear_kernel()`].
#[cube(launch)]
pub fn fp8_linear_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<u32>,
    e4m3: &Array<f32>,
    y: &mut Array<F>,
    k: u32,
    n_out: u32,
    input_scale: f32,
    weight_scale: f32,
    #[comptime] units: u32,
    #[comptime] relu2: bool,
) {
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let m = CUBE_POS_Y as usize;
    let mut acc = 0.0f32;
    if n < n_out as usize {
        acc = fp8_partial(x, weight, e4m3, n, m, k as usize, input_scale);
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out as usize {
        y[m * n_out as usize + n] =
            F::cast_from(epilogue(total * (input_scale * weight_scale), relu2));
    }
}

/// Routed-expert FP8 W8A8 linear (slots as in [`nvfp4_expert_linear_kernel()`]); `weight`
/// `[E · N, K/4]` words, per-expert `input_scales` and `weight_scales` `[E]`.
#[cube(launch)]
pub fn fp8_expert_linear_kernel<F: Float>(
    x: &Array<F>,
    experts: &Array<i32>,
    weight: &Array<u32>,
    input_scales: &Array<f32>,
    weight_scales: &Array<f32>,
    e4m3: &Array<f32>,
    y: &mut Array<F>,
    k: u32,
    n_out: u32,
    slots: u32,
    div: u32,
    #[comptime] units: u32,
    #[comptime] relu2: bool,
) {
    let slot = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if slot >= slots as usize {
        terminate!();
    }
    let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    let e = experts[slot] as usize;
    let input_scale = input_scales[e];
    let mut acc = 0.0f32;
    if n < n_out as usize {
        let row = e * n_out as usize + n;
        acc = fp8_partial(
            x,
            weight,
            e4m3,
            row,
            slot / div as usize,
            k as usize,
            input_scale,
        );
    }
    let total = row_sum(acc, units);
    if UNIT_POS_X == 0 && n < n_out as usize {
        y[slot * n_out as usize + n] =
            F::cast_from(epilogue(total * (input_scale * weight_scales[e]), relu2));
    }
}

/// Causal depthwise conv + bias + SiLU, one unit per `(b, c)` walking time.
/// `x`: `[B, T, C]`; `w`: `[C, K]`; `bias`: `[C]`; `state`/`new_state`: `[B, C, K-1]`;
/// `lens`: `[B]`.
#[cube(launch)]
pub fn causal_conv1d_kernel(
    x: &Array<f32>,
    w: &Array<f32>,
    bias: &Array<f32>,
    state: &Array<f32>,
    lens: &Array<u32>,
    y: &mut Array<f32>,
    new_state: &mut Array<f32>,
    batch: u32,
    t_max: u32,
    ch: u32,
    k: u32,
) {
    let id = ABSOLUTE_POS;
    let (batch, t_max, ch, k) = (batch as usize, t_max as usize, ch as usize, k as usize);
    if id >= batch * ch {
        terminate!();
    }
    let b = id / ch;
    let c = id % ch;
    let km1 = k - 1;
    let len = lens[b] as usize;
    for t in 0..len {
        let mut acc = bias[c];
        for kk in 0..k {
            // Input at time t - (K-1) + kk; negative times read the cached tail.
            let v = if t + kk >= km1 {
                x[(b * t_max + t + kk - km1) * ch + c]
            } else {
                state[(b * ch + c) * km1 + t + kk]
            };
            acc += w[c * k + kk] * v;
        }
        y[(b * t_max + t) * ch + c] = acc / (1.0f32 + f32::exp(-acc));
    }
    for s in 0..km1 {
        let v = if len + s >= km1 {
            x[(b * t_max + len + s - km1) * ch + c]
        } else {
            state[(b * ch + c) * km1 + len + s]
        };
        new_state[(b * ch + c) * km1 + s] = v;
    }
}

/// The selective scan with D skip, one unit per `(b, h, p)` walking time; the state row
/// `S[b, h, p, :]` is updated in place in `state` (a copy of the input state).
#[cube(launch)]
pub fn selective_scan_kernel(
    x: &Array<f32>,
    dt: &Array<f32>,
    a: &Array<f32>,
    bm: &Array<f32>,
    cm: &Array<f32>,
    d: &Array<f32>,
    lens: &Array<u32>,
    state: &mut Array<f32>,
    y: &mut Array<f32>,
    batch: u32,
    t_max: u32,
    heads: u32,
    head_dim: u32,
    groups: u32,
    n_state: u32,
) {
    let id = ABSOLUTE_POS;
    let (batch, t_max, h, p, g, n) = (
        batch as usize,
        t_max as usize,
        heads as usize,
        head_dim as usize,
        groups as usize,
        n_state as usize,
    );
    if id >= batch * h * p {
        terminate!();
    }
    let b = id / (h * p);
    let hh = (id / p) % h;
    let pp = id % p;
    let gg = hh / (h / g);
    let len = lens[b] as usize;
    let srow = ((b * h + hh) * p + pp) * n;
    for t in 0..len {
        let dtv = dt[(b * t_max + t) * h + hh];
        let decay = f32::exp(dtv * a[hh]);
        let xv = x[((b * t_max + t) * h + hh) * p + pp];
        let bc = ((b * t_max + t) * g + gg) * n;
        let mut acc = 0.0f32;
        for nn in 0..n {
            let s = decay * state[srow + nn] + dtv * xv * bm[bc + nn];
            state[srow + nn] = s;
            acc += s * cm[bc + nn];
        }
        y[((b * t_max + t) * h + hh) * p + pp] = acc + d[hh] * xv;
    }
}

/// Batched `c[b, m, n] = Σ_k a[b, m, k] · w[b, k, n]` in any float storage type `F`, accumulated
/// in f32 term by term (no tensor cores, no reordering beyond the split below). A cube covers
/// `CUBE_DIM_X` consecutive columns of one row `(b, m)`; its `CUBE_DIM_Y` unit rows split `K`
/// (unit row `y` sums `k ≡ y mod CUBE_DIM_Y`) and add their partial sums through shared memory.
/// Reads of `w` are coalesced along the columns; the split keeps a batch-1 GEMV busy.
#[cube(launch)]
pub fn matmul_kernel<F: Float>(
    a: &Array<F>,
    w: &Array<F>,
    c: &mut Array<F>,
    m: u32,
    k: u32,
    n: u32,
    #[comptime] cols: u32,
    #[comptime] splits: u32,
) {
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let col = (CUBE_POS_X * cols + UNIT_POS_X) as usize;
    let row = CUBE_POS_Y as usize;
    let bb = CUBE_POS_Z as usize;
    let y = UNIT_POS_Y as usize;
    let mut acc = 0.0f32;
    if col < n {
        let mut kk = y;
        while kk < k {
            acc += f32::cast_from(a[(bb * m + row) * k + kk])
                * f32::cast_from(w[(bb * k + kk) * n + col]);
            kk += splits as usize;
        }
    }
    let mut sm = SharedMemory::<f32>::new((cols * splits) as usize);
    let x = UNIT_POS_X as usize;
    sm[y * cols as usize + x] = acc;
    sync_cube();
    // A runtime stride (a comptime one would be folded at expansion time).
    let mut stride = (CUBE_DIM_Y / 2) as usize;
    while stride > 0 {
        if y < stride {
            sm[y * cols as usize + x] =
                sm[y * cols as usize + x] + sm[(y + stride) * cols as usize + x];
        }
        sync_cube();
        stride /= 2;
    }
    if y == 0 && col < n {
        c[(bb * m + row) * n + col] = F::cast_from(sm[x]);
    }
}
