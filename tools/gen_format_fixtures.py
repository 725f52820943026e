#!/usr/bin/env python3
"""Generate independent *format goldens* for nemotron-rs's number-format codecs.

Writes nemotron-loader/tests/fixtures/formats.safetensors with:

  * NVFP4 weights quantized by NVIDIA ModelOpt's own ``NVFP4QTensor.quantize``
    (packed E2M1 nibbles, per-16-block E4M3 scales, per-tensor F32 global scale)
    plus a dequantization computed here in numpy from the format definition.
  * The full E4M3 (float8_e4m3fn) decode table and an encode golden produced by
    PyTorch's ``x.to(torch.float8_e4m3fn)``.
  * A per-tensor FP8 weight quantized by ModelOpt's ``FP8QTensor.quantize``.
  * BF16 and F16 encode goldens produced by PyTorch's ``x.to(dtype)``.

Nothing here uses any code of nemotron-rs. Every torch/ModelOpt result is also
cross-checked against a small independent numpy reference written from the
format definitions, so a mismatch in either shows up at generation time.

Usage (from the repository root):

    python3 -m pip install torch nvidia-modelopt safetensors numpy
    python3 tools/gen_format_fixtures.py

The output is deterministic for fixed package versions (fixed seed, numpy
generator for all random inputs, CPU only).
"""

from __future__ import annotations

import json
import os
import platform
import struct
import sys
import warnings

warnings.filterwarnings("ignore")  # modelopt/torch emit version-compat chatter on import

import numpy as np
import safetensors
import torch
from safetensors.torch import load_file, save_file

import modelopt
from modelopt.torch.export.model_config import QUANTIZATION_FP8
from modelopt.torch.export.quant_utils import to_quantized_weight
from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

SEED = 20250607
SCRIPT = "tools/gen_format_fixtures.py"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_PATH = os.path.join(REPO_ROOT, "nemotron-loader", "tests", "fixtures", "formats.safetensors")

F32 = np.float32
rng = np.random.default_rng(SEED)
torch.manual_seed(SEED)

# --------------------------------------------------------------------------------------
# Independent numpy references (written from the format definitions, not from torch).
# --------------------------------------------------------------------------------------

# E2M1 (FP4) code -> value. Code bit 3 is the sign; code 8 is negative zero.
E2M1 = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=F32
)


def e4m3_decode_np(codes: np.ndarray) -> np.ndarray:
    """Decode float8_e4m3fn bytes: 1 sign, 4 exponent (bias 7), 3 mantissa; S.1111.111 = NaN."""
    c = codes.astype(np.uint32)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = (man / 8.0) * 2.0**-6
    val = sign * np.where(exp == 0, subnormal, normal)
    val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    return val.astype(F32)  # every E4M3 value is exact in f32


E4M3_ALL = e4m3_decode_np(np.arange(256, dtype=np.uint8))


def e4m3_encode_ref_np(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to E4M3 (saturating to +-448; inputs must be non-NaN).

    Ties go to the code with an even mantissa LSB (= even code, since codes of one
    sign are ordered by magnitude). Computed exactly in float64.
    """
    mags = E4M3_ALL[:127].astype(np.float64)  # codes 0x00..0x7E, increasing magnitude
    out = np.empty(x.shape, dtype=np.uint8)
    for i, v in enumerate(x.astype(np.float64).ravel()):
        a = min(abs(v), 448.0)
        hi = int(np.searchsorted(mags, a, side="left"))  # first mag >= a
        if hi == 0 or mags[hi] == a:
            code = hi
        else:
            lo = hi - 1
            dlo, dhi = a - mags[lo], mags[hi] - a
            code = lo if dlo < dhi else hi if dhi < dlo else (lo if lo % 2 == 0 else hi)
        out.ravel()[i] = code | (0x80 if np.signbit(v) else 0)
    return out


def bf16_encode_ref_np(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits by round-to-nearest-even on the bit pattern (no NaN inputs)."""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def ulp_diff_f32(a: np.ndarray, b: np.ndarray) -> int:
    """Max distance in units-in-last-place between two f32 arrays (+0 and -0 are equal)."""
    def ordered(v):
        i = v.astype(F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(ordered(a) - ordered(b)))) if a.size else 0


def t2np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def elementwise_cast_check(x: np.ndarray, dtype: torch.dtype, bulk_bits: np.ndarray, view_dt):
    """Re-cast each element alone (scalar code path) and compare with the bulk (vectorized) cast."""
    for i, v in enumerate(x):
        one = torch.tensor([v], dtype=torch.float32).to(dtype).view(view_dt).item()
        assert one == int(bulk_bits[i]), (dtype, i, v, one, bulk_bits[i])


tensors: dict[str, torch.Tensor] = {}

print(f"python      {platform.python_version()}")
print(f"torch       {torch.__version__}")
print(f"modelopt    {modelopt.__version__}")
print(f"numpy       {np.__version__}")
print(f"safetensors {safetensors.__version__}")
print(f"seed        {SEED}")

# Sanity: torch's E4M3 decode must equal the definition-based decoder (NaN at 0x7F/0xFF).
_torch_table = t2np(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float())
assert np.array_equal(_torch_table, E4M3_ALL, equal_nan=True)
assert np.isnan(E4M3_ALL[[0x7F, 0xFF]]).all() and np.isfinite(np.delete(E4M3_ALL, [0x7F, 0xFF])).all()

# --------------------------------------------------------------------------------------
# NVFP4 via ModelOpt
# --------------------------------------------------------------------------------------
BLOCK = 16


def nvfp4_case_2() -> np.ndarray:
    """[4, 32] = 8 blocks engineered so that ModelOpt's arithmetic is exact.

    The tensor amax is 6 * 448 * 2^-12 = 0.65625, so weight_scale_2 = amax / (6*448)
    = 2^-12 exactly. A block whose amax is 6 * s * 2^-12 (s an E4M3 value) then gets
    block scale exactly s, its step is s * 2^-12, and value t * step divides back to
    exactly t. So t = 0.25, 0.75, ..., 5 are exact E2M1 rounding ties.
    """
    k = 2.0**-12
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    tie_block = np.array([6.0] + ties + [-t for t in ties] + [-6.0])  # amax = 6*step
    # Same ties, shuffled and with mixed signs.
    mixed = np.array([-0.25, 6.0, 0.75, -1.25, 1.75, -2.5, 3.5, -5.0,
                      0.25, -0.75, 1.25, -1.75, 2.5, -3.5, 5.0, -6.0])
    # Just below / just above every tie (f32 neighbours) -> must round away from the tie.
    off = [6.0]
    for t in ties:
        off += [np.nextafter(F32(t), F32(0)), np.nextafter(F32(t), F32(10))]
    off += [-6.0]
    off_tie_block = np.array(off, dtype=np.float64)
    assert off_tie_block.size == 16
    # Exact E2M1 grid values (incl. -0.0 input, which ModelOpt encodes as +0 code 0).
    exact = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    zero = np.zeros(16)
    # (block values in units of step, E4M3 block scale s). Scale 6*2^-9 and 2^-9
    # are E4M3 subnormals; 2.0 is a power of two so the off-tie neighbours stay exact.
    rows = [
        [(tie_block, 448.0), (zero, None)],
        [(mixed, 1.0), (off_tie_block, 2.0)],
        [(tie_block, 6 * 2.0**-9), (exact, 3.0)],
        [(mixed, 40.0), (tie_block, 2.0**-9)],
    ]
    w = np.zeros((4, 32), dtype=F32)
    for r, blocks in enumerate(rows):
        for b, (vals, s) in enumerate(blocks):
            if s is not None:
                w[r, b * BLOCK:(b + 1) * BLOCK] = (vals * s * k).astype(F32)
    # Check the construction is exact in f32.
    for r, blocks in enumerate(rows):
        for b, (vals, s) in enumerate(blocks):
            if s is not None:
                assert np.array_equal(w[r, b * BLOCK:(b + 1) * BLOCK].astype(np.float64) / (s * k), vals)
    assert np.abs(w).max() == F32(6 * 448 * k)
    return w


def nvfp4_inputs() -> list[tuple[str, np.ndarray]]:
    cases = []
    # (0) plain normal(0, 0.02) weights.
    cases.append(("normal(0,0.02) [8,64]", rng.normal(0, 0.02, (8, 64))))
    # (1) rows with very different magnitudes: some x100 (they set the global amax), some
    #     x1e-3 (their block scales land in the E4M3 subnormal range) and one x1e-5 (its
    #     block scales fall below 2^-9 and are clamped by ModelOpt to 2^-9, so almost
    #     every element quantizes to +-0).
    w1 = rng.normal(0, 0.02, (16, 128))
    w1[[2, 9]] *= 100.0
    w1[[5, 11, 14]] *= 1e-3
    w1[[7]] *= 1e-5
    cases.append(("normal, rows 2,9 x100, rows 5,11,14 x1e-3, row 7 x1e-5 [16,128]", w1))
    # (2) exact ties + all-zero block (see nvfp4_case_2).
    cases.append(("engineered E2M1 ties, all-zero block, subnormal block scales [4,32]", nvfp4_case_2()))
    # (3) uniform(-1, 1).
    cases.append(("uniform(-1,1) [6,256]", rng.uniform(-1, 1, (6, 256))))
    # (4) heavy tailed: student-t (df=1.5) * 0.02 clipped to +-1.
    cases.append(("student-t(df=1.5)*0.02 clipped to +-1 [3,48]",
                  np.clip(rng.standard_t(1.5, (3, 48)) * 0.02, -1.0, 1.0)))
    # (5) one block per row, negative values only; row 1 has tiny values that become -0 (code 8).
    w5 = np.empty((2, 16))
    w5[0] = -rng.uniform(0.0, 1.0, 16)
    w5[1] = -np.concatenate([[1.0], rng.uniform(0.0, 0.04, 15)])
    cases.append(("negative only, one block per row [2,16]", w5))
    return [(d, w.astype(F32)) for d, w in cases]


def e2m1_encode_ref_np(t: np.ndarray) -> np.ndarray:
    """Round |t| to the nearest E2M1 magnitude, ties to the even code; saturate at 6.

    Sign bit = (t < 0), so small negatives give code 8 (-0) and -0.0 gives code 0,
    matching what ModelOpt emits.
    """
    grid = E2M1[:8].astype(np.float64)
    a = np.minimum(np.abs(t.astype(np.float64)), 6.0)
    d = np.abs(a[..., None] - grid)  # distance to each magnitude
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    # among equally near codes pick the even one (grid codes 0..7, ties involve a pair)
    idx = np.where(cand.sum(-1) > 1, np.argmax(cand & (np.arange(8) % 2 == 0), axis=-1),
                   np.argmax(cand, axis=-1))
    return (idx + 8 * (t < 0)).astype(np.uint8)


def nvfp4_dequant_np(packed: np.ndarray, scale_bytes: np.ndarray, wsf2: F32) -> np.ndarray:
    """Format definition: value = (E2M1[code] * f32(e4m3 block scale)) * weight_scale_2, all f32.

    Byte j of a row holds column 2j in its low nibble and column 2j+1 in its high nibble.
    """
    r, half = packed.shape
    codes = np.empty((r, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    scale = np.repeat(e4m3_decode_np(scale_bytes), BLOCK, axis=1)
    out = (E2M1[codes] * scale) * F32(wsf2)
    assert out.dtype == F32
    return out


print("\n== NVFP4 (ModelOpt NVFP4QTensor.quantize(w, 16)) ==")
for i, (desc, w_np) in enumerate(nvfp4_inputs()):
    w = torch.from_numpy(w_np.copy())
    w_before = w.clone()
    # ModelOpt computes weight_scale_2 itself when it is not given:
    # reduce_amax(w) / (6 * 448) -- exactly what NVFP4QTensor.get_weights_scaling_factor_2 does.
    qt, wsf, wsf2 = NVFP4QTensor.quantize(w, BLOCK)
    assert torch.equal(w, w_before), "quantize mutated its input"
    assert torch.equal(wsf2, NVFP4QTensor.get_weights_scaling_factor_2(w))
    packed = qt._quantized_data
    if i == 0:
        print(f"  quantize returned: qtensor {type(qt).__name__} data {packed.dtype} {tuple(packed.shape)}, "
              f"block scale {wsf.dtype} {tuple(wsf.shape)}, global scale {wsf2.dtype} {tuple(wsf2.shape)}")
    R, C = w.shape
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (R, C // 2)
    assert wsf.dtype == torch.float8_e4m3fn and tuple(wsf.shape) == (R, C // BLOCK)
    assert wsf2.dtype == torch.float32 and wsf2.dim() == 0

    packed_np = t2np(packed)
    scale_bytes = t2np(wsf.view(torch.uint8))
    wsf2_np = F32(wsf2.item())
    deq = nvfp4_dequant_np(packed_np, scale_bytes, wsf2_np)

    # Independent check of ModelOpt's nibble values: w / (f32(scale) * wsf2), RNE on the E2M1 grid.
    step = (np.repeat(E4M3_ALL[scale_bytes], BLOCK, axis=1) * wsf2_np).astype(F32)
    codes_ref = e2m1_encode_ref_np((w_np / step).astype(F32))
    codes_mo = np.empty((R, C), dtype=np.uint8)
    codes_mo[:, 0::2], codes_mo[:, 1::2] = packed_np & 0x0F, packed_np >> 4
    assert np.array_equal(codes_mo, codes_ref), f"case {i}: ModelOpt codes != numpy E2M1 RNE reference"

    # ModelOpt's own dequantize computes E2M1 * (f32(scale) * wsf2) (different association).
    deq_mo = t2np(qt.dequantize(dtype=torch.float32, scale=wsf, double_scale=wsf2,
                                block_sizes={-1: BLOCK}))
    n_diff = int(np.sum(deq != deq_mo))
    ulps = ulp_diff_f32(deq, deq_mo)
    assert ulps <= 1, f"case {i}: numpy vs ModelOpt dequant differ by {ulps} ulp"
    n_negzero = int(np.sum((deq == 0) & np.signbit(deq)))
    err = np.abs(deq - w_np).max()
    print(f"  nvfp4.{i}: {desc}")
    print(f"     wsf2={wsf2_np!r}  block scales (f32) min={E4M3_ALL[scale_bytes].min():.6g} "
          f"max={E4M3_ALL[scale_bytes].max():.6g}  subnormal scales={int(np.sum((scale_bytes & 0x78) == 0))}"
          f"  max|deq-w|={err:.4g}")
    print(f"     numpy vs ModelOpt.dequantize: max|diff|={np.abs(deq - deq_mo).max():.3g}, "
          f"{n_diff} elems differ, max {ulps} ulp; -0.0 entries in numpy dequant={n_negzero}")

    tensors[f"nvfp4.{i}.w"] = w_before
    tensors[f"nvfp4.{i}.weight"] = packed.contiguous()
    tensors[f"nvfp4.{i}.weight_scale"] = wsf.contiguous()
    tensors[f"nvfp4.{i}.weight_scale_2"] = wsf2.reshape(()).contiguous()
    tensors[f"nvfp4.{i}.dequant"] = torch.from_numpy(deq)

    if i == 0:
        # Verify the nibble order: decoding low nibble = even column reproduces the
        # weights (and ModelOpt's dequantize); the swapped order does not.
        swapped = nvfp4_dequant_np(((packed_np & 0x0F) << 4) | (packed_np >> 4), scale_bytes, wsf2_np)
        print(f"     nibble order check on case 0: low=even col -> max|deq-w|={err:.4g}, "
              f"max|deq-ModelOpt|={np.abs(deq - deq_mo).max():.3g};  "
              f"low=odd col -> max|deq-w|={np.abs(swapped - w_np).max():.4g}")
        assert err < np.abs(swapped - w_np).max()
        # First byte, spelled out.
        b0 = int(packed_np[0, 0])
        print(f"     row0 byte0=0x{b0:02x}: low nibble {b0 & 15} -> E2M1 {E2M1[b0 & 15]} (col 0, w={w_np[0, 0]:.5f}), "
              f"high nibble {b0 >> 4} -> E2M1 {E2M1[b0 >> 4]} (col 1, w={w_np[0, 1]:.5f}), "
              f"step={E4M3_ALL[scale_bytes[0, 0]] * wsf2_np:.5g}")
    if i == 2:
        zb = scale_bytes[0, 1]
        print(f"     all-zero block (row 0, block 1): scale byte 0x{zb:02x} = {E4M3_ALL[zb]}, "
              f"codes {sorted(set(packed_np[0, 8:16].tolist()))}")
        assert E4M3_ALL[zb] == 1.0
        # Expected tie behaviour (round half to even on the E2M1 grid).
        expect = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0, 6.0: 6.0}
        got = E2M1[codes_mo[0, :16]]
        t_in = w_np[0, :16] / (448.0 * 2.0**-12)
        for t, g in zip(t_in, got):
            assert abs(g) == expect[abs(float(t))] and (np.signbit(g) == (t < 0)), (t, g)
        print("     ties (round half to even) -> " + ", ".join(f"{t}->{v}" for t, v in expect.items())
              + "; -0.25 -> code 8 (-0)")

# --------------------------------------------------------------------------------------
# E4M3 decode table and encode golden (PyTorch cast)
# --------------------------------------------------------------------------------------
print("\n== E4M3 ==")
tensors["e4m3.table"] = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()

finite_codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
mags = E4M3_ALL[:127].astype(np.float64)  # 0 .. 448, increasing
mids = ((mags[:-1] + mags[1:]) / 2).astype(F32)  # exact halfway points (need 4 mantissa bits)
assert np.array_equal(mids.astype(np.float64), (mags[:-1] + mags[1:]) / 2)
parts = [
    E4M3_ALL[finite_codes],                                    # every finite value (+0 and -0 incl.)
    mids, -mids,                                               # exact ties
    np.nextafter(mids, F32(0)), np.nextafter(mids, F32(1e9)),  # one f32 ulp either side of each tie
    -np.nextafter(mids, F32(0)), -np.nextafter(mids, F32(1e9)),
    # random magnitudes spread log-uniformly over 2^-12 .. 448 with random signs
    (rng.choice([-1.0, 1.0], 800) * np.exp2(rng.uniform(-12, np.log2(448), 800))),
    rng.uniform(-2.0**-6, 2.0**-6, 150),                       # E4M3 subnormal range
    # tiny values: |x| <= 2^-10 rounds to 0 (2^-10 is a tie -> 0), just above -> 2^-9
    np.array([2.0**-10, -2.0**-10, 2.0**-11, -2.0**-11, 1e-6, -1e-6, 1e-30, -1e-30,
              2.0**-149, -2.0**-149, 0.0, -0.0]),
    np.nextafter(F32(2.0**-10), F32(1)) * np.array([1, -1]),
    rng.uniform(-2.0**-10, 2.0**-10, 24),
    # saturation edge: +-448 and (448, 464] (464 is the 448/480 tie -> 448)
    np.array([448.0, -448.0, 448.5, -448.5, 450.0, -450.0, 455.99, 456.0, -456.0,
              460.0, -460.0, 463.99, -463.99, 464.0, -464.0]),
]
enc_x = np.concatenate([np.asarray(p, dtype=F32).ravel() for p in parts]).astype(F32)
enc_code = t2np(torch.from_numpy(enc_x).to(torch.float8_e4m3fn).view(torch.uint8))
assert np.isfinite(E4M3_ALL[enc_code]).all(), "torch produced NaN for an in-range input"
assert np.array_equal(enc_code, e4m3_encode_ref_np(enc_x)), "torch e4m3 cast != numpy RNE reference"
elementwise_cast_check(enc_x, torch.float8_e4m3fn, enc_code, torch.uint8)
tensors["e4m3.enc.x"] = torch.from_numpy(enc_x)
tensors["e4m3.enc.code"] = torch.from_numpy(enc_code)
print(f"  e4m3.enc: {enc_x.size} values, matches numpy RNE reference; "
      f"codes 0x7e/0xfe: {int(np.sum((enc_code & 0x7F) == 0x7E))}, zeros: {int(np.sum((enc_code & 0x7F) == 0))}")

# Beyond 464 torch 2.15's cast saturates (finite overflow and +-inf -> +-448; some
# older torch releases returned NaN from 480 up). Stored separately so a codec can opt in.
sat_x = np.array([464.01, -464.01, 479.99, 480.0, -480.0, 500.0, 1e4, -1e4, 3.0e38,
                  np.inf, -np.inf], dtype=F32)
sat_code = t2np(torch.from_numpy(sat_x).to(torch.float8_e4m3fn).view(torch.uint8))
elementwise_cast_check(sat_x, torch.float8_e4m3fn, sat_code, torch.uint8)
tensors["e4m3.sat.x"] = torch.from_numpy(sat_x)
tensors["e4m3.sat.code"] = torch.from_numpy(sat_code)
print(f"  e4m3.sat: torch cast of {sat_x.tolist()} -> {[hex(c) for c in sat_code]}")

# --------------------------------------------------------------------------------------
# Per-tensor FP8 weight via ModelOpt
# --------------------------------------------------------------------------------------
print("\n== FP8 per-tensor (ModelOpt FP8QTensor.quantize) ==")
w8_np = rng.normal(0, 0.05, (12, 40)).astype(F32)
w8 = torch.from_numpy(w8_np.copy())
qt8, scale8 = FP8QTensor.quantize(w8)          # scale = amax / 448, data = e4m3(w / scale)
q8 = qt8._quantized_data
assert q8.dtype == torch.float8_e4m3fn and tuple(q8.shape) == (12, 40) and scale8.dim() == 0
# The HF export path (export/quant_utils.to_quantized_weight) must give identical bytes.
q8_export = to_quantized_weight(w8, scale8, QUANTIZATION_FP8)
assert torch.equal(q8.view(torch.uint8), q8_export.view(torch.uint8))
scale8_np = F32(scale8.item())
assert scale8_np == F32(np.abs(w8_np).max() / F32(448.0))
deq8 = (e4m3_decode_np(t2np(q8.view(torch.uint8))) * scale8_np).astype(F32)
deq8_mo = t2np(qt8.dequantize(dtype=torch.float32, scale=scale8))
assert np.array_equal(deq8, deq8_mo)
tensors["fp8.0.w"] = torch.from_numpy(w8_np)
tensors["fp8.0.weight"] = q8.contiguous()
tensors["fp8.0.weight_scale"] = scale8.reshape(()).float().contiguous()
tensors["fp8.0.dequant"] = torch.from_numpy(deq8)
print(f"  fp8.0: weight {q8.dtype} {tuple(q8.shape)}, weight_scale {scale8_np!r} (= amax/448), "
      f"max|deq-w|={np.abs(deq8 - w8_np).max():.4g}, numpy dequant == ModelOpt dequantize")

# --------------------------------------------------------------------------------------
# BF16 and F16 encode goldens (PyTorch cast, round-to-nearest-even)
# --------------------------------------------------------------------------------------


def with_neighbours(v: np.ndarray) -> list[np.ndarray]:
    v = v.astype(F32)
    return [v, np.nextafter(v, F32(0)), np.nextafter(v, np.copysign(F32(np.inf), v))]


print("\n== BF16 / F16 ==")
binades = np.exp2(np.arange(-40, 41, 8, dtype=np.float64))
# BF16: 8 significant bits -> spacing in [1,2) is 2^-7; ties at odd multiples of 2^-8.
bf_ties = np.concatenate([(1 + np.array([1, 3, 5, 127, 255]) * 2.0**-8) * s for s in binades])
bf_ties = np.concatenate([bf_ties, -bf_ties])
bf_parts = with_neighbours(bf_ties) + [
    np.array([1.0, -1.0, 0.0, -0.0, 2 - 2.0**-8, 2 - 2.0**-9, 1 - 2.0**-9, -(2 - 2.0**-8),
              3.140625, 65504.0, 1e10, -1e10]),
    # subnormals / tiny: 2^-134 is a tie (-> 0), 3*2^-134 -> 2^-132, f32 min subnormal -> 0
    np.array([2.0**-149, -2.0**-149, 2.0**-134, 3 * 2.0**-134, 2.0**-133, -2.0**-133, 1e-40, -1e-40,
              5e-39, 2.0**-126, 2.0**-126 - 2.0**-149, -(2.0**-126 - 2.0**-149)]),
    # large: bf16 max (0x7F7F), the max/inf tie (0x7F7F8000 -> inf), f32 max (-> inf), inf
    np.array([np.frombuffer(np.uint32(0x7F7F0000).tobytes(), F32)[0],
              np.frombuffer(np.uint32(0x7F7F7FFF).tobytes(), F32)[0],
              np.frombuffer(np.uint32(0x7F7F8000).tobytes(), F32)[0],
              np.finfo(F32).max, -np.finfo(F32).max, np.inf, -np.inf]),
    rng.choice([-1.0, 1.0], 400) * np.exp2(rng.uniform(-130, 127, 400)),
    rng.normal(0, 1, 200),
]
bf_x = np.concatenate([np.asarray(p, dtype=F32).ravel() for p in bf_parts]).astype(F32)
bf_y = torch.from_numpy(bf_x).to(torch.bfloat16)
bf_bits = t2np(bf_y.view(torch.int16)).view(np.uint16)
assert np.array_equal(bf_bits, bf16_encode_ref_np(bf_x)), "torch bf16 cast != numpy RNE reference"
elementwise_cast_check(bf_x, torch.bfloat16, bf_bits.view(np.int16), torch.int16)
tensors["bf16.x"] = torch.from_numpy(bf_x)
tensors["bf16.y"] = bf_y
print(f"  bf16: {bf_x.size} values, matches bit-level RNE reference; "
      f"inf outputs {int(np.sum(np.isinf(bf_y.float().numpy())))}, "
      f"subnormal outputs {int(np.sum(((bf_bits & 0x7F80) == 0) & ((bf_bits & 0x7F) != 0)))}")

# F16: 11 significant bits -> spacing in [1,2) is 2^-10; ties at odd multiples of 2^-11.
h_binades = np.exp2(np.arange(-14, 16, 3, dtype=np.float64))
h_ties = np.concatenate([(1 + np.array([1, 3, 5, 1023, 2047]) * 2.0**-11) * s for s in h_binades])
h_ties = np.concatenate([h_ties, -h_ties])
h_parts = with_neighbours(h_ties) + [
    np.array([1.0, -1.0, 0.0, -0.0, 2 - 2.0**-11, 2 - 2.0**-12, 1 - 2.0**-12, -(2 - 2.0**-11),
              3.140625, 0.1, -0.1]),
    # subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3*2^-25 ties to 2^-23
    np.array([2.0**-24, -2.0**-24, 2.0**-25, -2.0**-25, 3 * 2.0**-25, 5 * 2.0**-25, 2.0**-26,
              1e-8, 2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-24, 1e-30, 2.0**-149]),
    np.nextafter(F32(2.0**-25), F32(1)) * np.array([1, -1]),
    # large: 65504 max, 65519.99 -> 65504, 65520 is the max/inf tie -> inf, beyond -> inf
    np.array([65504.0, -65504.0, 65519.0, 65520.0, -65520.0, 65536.0, 1e6, 1e30, np.inf, -np.inf]),
    np.nextafter(F32(65520.0), F32(0)) * np.array([1, -1]),
    rng.choice([-1.0, 1.0], 400) * np.exp2(rng.uniform(-26, 16, 400)),
    rng.normal(0, 1, 200),
]
h_x = np.concatenate([np.asarray(p, dtype=F32).ravel() for p in h_parts]).astype(F32)
h_y = torch.from_numpy(h_x).to(torch.float16)
h_bits = t2np(h_y.view(torch.int16)).view(np.uint16)
assert np.array_equal(h_bits, h_x.astype(np.float16).view(np.uint16)), "torch f16 cast != numpy"
elementwise_cast_check(h_x, torch.float16, h_bits.view(np.int16), torch.int16)
tensors["f16.x"] = torch.from_numpy(h_x)
tensors["f16.y"] = h_y
print(f"  f16: {h_x.size} values, matches numpy astype(float16); "
      f"inf outputs {int(np.sum(np.isinf(h_y.float().numpy())))}, "
      f"subnormal outputs {int(np.sum(((h_bits & 0x7C00) == 0) & ((h_bits & 0x3FF) != 0)))}")

# --------------------------------------------------------------------------------------
# Write and read back
# --------------------------------------------------------------------------------------
metadata = {
    "generator": SCRIPT,
    "torch": torch.__version__,
    "modelopt": modelopt.__version__,
    "numpy": np.__version__,
    "safetensors": safetensors.__version__,
    "python": platform.python_version(),
    "seed": str(SEED),
    "nvfp4": "weight: u8 [R,C/2], low nibble = even column; weight_scale: F8_E4M3 [R,C/16]; "
             "weight_scale_2: F32 []; dequant = (E2M1[code] * f32(weight_scale)) * weight_scale_2 in f32",
    "e4m3.sat": "torch saturates finite overflow and +-inf to +-448 (0x7e/0xfe); NaN -> 0x7f",
}
os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
save_file({k: v.contiguous() for k, v in tensors.items()}, OUT_PATH, metadata=metadata)


def canonicalize_header(path: str) -> None:
    """safetensors writes __metadata__ from a hash map, so its key order varies between runs.

    Rewrite the JSON header in place with the metadata keys sorted (same bytes, same length,
    tensor entries and data untouched) so that the file is byte-for-byte reproducible.
    """
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        raw = fh.read(n)
        hdr = json.loads(raw, object_pairs_hook=dict)
        hdr["__metadata__"] = dict(sorted(hdr["__metadata__"].items()))
        out = json.dumps({"__metadata__": hdr.pop("__metadata__"), **hdr}, separators=(",", ":")).encode()
        assert len(out) <= n, "canonical header longer than the original"
        fh.seek(8)
        fh.write(out + b" " * (n - len(out)))  # safetensors pads the header with spaces


canonicalize_header(OUT_PATH)

back = load_file(OUT_PATH)
assert back.keys() == tensors.keys()
for k, v in tensors.items():
    assert back[k].dtype == v.dtype and back[k].shape == v.shape
    assert torch.equal(back[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
with safetensors.safe_open(OUT_PATH, "pt") as f:
    assert f.metadata() == metadata
# Show the on-disk dtype strings from the raw header.
with open(OUT_PATH, "rb") as fh:
    hlen = struct.unpack("<Q", fh.read(8))[0]
    header = json.loads(fh.read(hlen))
print(f"\nwrote {os.path.relpath(OUT_PATH, REPO_ROOT)} ({os.path.getsize(OUT_PATH)} bytes), "
      f"{len(tensors)} tensors; read back OK")
for name in sorted(k for k in header if k != "__metadata__"):
    print(f"  {name:26s} {header[name]['dtype']:8s} {header[name]['shape']}")
print(f"  __metadata__ {header['__metadata__']}")
