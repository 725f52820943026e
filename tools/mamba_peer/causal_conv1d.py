"""STAND-IN for Dao-AILab/causal-conv1d: the same two entry points, written in plain torch.

This is NOT the causal-conv1d package and contains none of its code. The real package is a CUDA
extension that cannot be built where it is needed (no CUDA toolkit), so nemotron-rs' benchmark
puts this module on ``sys.path`` beside a pure-Python copy of ``mamba_ssm``'s Triton kernels
(see ../README.txt). HF transformers then runs the Mamba2 SSM math (chunked scan, decode state
update) in Triton, and only the short depthwise causal convolution (width 4) here, in torch.

Semantics (those of the upstream API, written from its documented behaviour):

* ``causal_conv1d_fn(x, weight, bias, ...)``: depthwise causal 1-D convolution along the last
  axis, ``out[b, d, t] = bias[d] + sum_k weight[d, k] * x[b, d, t - (W-1) + k]`` with zeros (or
  ``initial_states``) before ``t = 0``; then SiLU if ``activation`` is ``"silu"``/``"swish"``.
* ``causal_conv1d_update(x, conv_state, weight, bias, ...)``: the same for new tokens ``x``
  that follow the ones held in ``conv_state`` (the last ``state_len >= W-1`` inputs); shifts the
  new inputs into ``conv_state`` in place and returns the outputs for the new tokens.

Numerics follow the CUDA kernels: inputs, weight and bias are read in float32, the sum and the
activation are computed in float32, and the output is rounded once to ``x.dtype``.
Speed: a few torch kernel launches per call instead of one fused CUDA kernel.
"""

import torch
import torch.nn.functional as F

__version__ = "1.5.2+torch.standin"
IS_TORCH_STAND_IN = True

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]


def _silu_wanted(activation):
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")
    return activation is not None


def _finish(acc, silu, dtype):
    if silu:
        acc = F.silu(acc)
    return acc.to(dtype)


def _check_weight(weight, dim):
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ValueError(f"weight must be (dim, width) = ({dim}, W), got {tuple(weight.shape)}")
    return weight.shape[1]


def causal_conv1d_fn(
    x,
    weight,
    bias=None,
    seq_idx=None,
    initial_states=None,
    return_final_states=False,
    final_states_out=None,
    activation=None,
):
    """
    x: (batch, dim, seqlen); any strides.
    weight: (dim, width)
    bias: (dim,) or None
    seq_idx: (batch, seqlen) integer or None; a token only sees earlier tokens with the same id.
    initial_states: (batch, dim, width - 1) or None: the inputs before t = 0.
    return_final_states: also return the last width - 1 inputs, (batch, dim, width - 1), the
        conv state a following call (or causal_conv1d_update) continues from.
    final_states_out: optional (batch, dim, width - 1) tensor written in place and returned.
    activation: None, "silu" or "swish".

    out: (batch, dim, seqlen) in x.dtype; (out, final_states) if return_final_states.
    """
    silu = _silu_wanted(activation)
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, dim, seqlen), got {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    width = _check_weight(weight, dim)
    if seq_idx is not None and (initial_states is not None or return_final_states):
        raise NotImplementedError("initial_states / return_final_states are not supported with seq_idx")

    w = weight.float()
    b = bias.float() if bias is not None else None
    if initial_states is not None:
        if tuple(initial_states.shape) != (batch, dim, width - 1):
            raise ValueError(
                f"initial_states must be (batch, dim, width - 1) = {(batch, dim, width - 1)}, "
                f"got {tuple(initial_states.shape)}"
            )
        left = initial_states.float()
    else:
        left = x.new_zeros((batch, dim, width - 1), dtype=torch.float32)
    xp = torch.cat([left, x.float()], dim=-1)  # (batch, dim, width - 1 + seqlen)

    if seq_idx is None:
        acc = F.conv1d(xp, w.unsqueeze(1), b, padding=0, groups=dim)  # (batch, dim, seqlen)
    else:
        if tuple(seq_idx.shape) != (batch, seqlen):
            raise ValueError(f"seq_idx must be (batch, seqlen) = {(batch, seqlen)}, got {tuple(seq_idx.shape)}")
        # Tap k reads the input `lag = width - 1 - k` steps back; drop it where that input belongs
        # to another sequence. Before t = 0 the input is the zero padding, so any id will do there.
        ids = torch.cat([seq_idx[:, :1].expand(batch, width - 1), seq_idx], dim=-1)
        acc = x.new_zeros((batch, dim, seqlen), dtype=torch.float32)
        if b is not None:
            acc = acc + b[None, :, None]
        for k in range(width):
            tap = xp[:, :, k : k + seqlen]
            same = (ids[:, k : k + seqlen] == seq_idx).to(torch.float32)
            acc = acc + w[None, :, k, None] * tap * same[:, None, :]
    out = _finish(acc, silu, x.dtype)

    if not return_final_states:
        return out
    final = xp[:, :, xp.shape[-1] - (width - 1) :]  # last width - 1 inputs, initial states included
    if final_states_out is not None:
        final_states_out.copy_(final)
        return out, final_states_out
    return out, final.to(x.dtype)


def causal_conv1d_update(
    x,
    conv_state,
    weight,
    bias=None,
    activation=None,
    cache_seqlens=None,
    conv_state_indices=None,
):
    """
    x: (batch, dim) or (batch, dim, seqlen): the new tokens.
    conv_state: (batch, dim, state_len), state_len >= width - 1: the inputs before x, oldest
        first; updated in place. With conv_state_indices: (n_states, dim, state_len).
    weight: (dim, width)
    bias: (dim,) or None
    activation: None, "silu" or "swish".
    cache_seqlens: (batch,) integer or None. If given, conv_state is a circular buffer: input
        number p of the sequence lives in slot p % state_len and cache_seqlens[b] inputs were
        written before x; x goes to slots cache_seqlens[b] .. cache_seqlens[b] + seqlen - 1.
        (The caller advances cache_seqlens.)
    conv_state_indices: (batch,) integer or None: row of conv_state used by batch entry b.

    out: same shape as x, in x.dtype.
    """
    silu = _silu_wanted(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    batch, dim, seqlen = x.shape
    width = _check_weight(weight, dim)

    if conv_state_indices is not None:
        rows = conv_state_indices.to(device=conv_state.device, dtype=torch.long)
        state = conv_state.index_select(0, rows)
    else:
        rows = None
        state = conv_state
    if state.shape[0] != batch or state.shape[1] != dim:
        raise ValueError(f"conv_state rows must be (batch, dim) = {(batch, dim)}, got {tuple(state.shape)}")
    state_len = state.shape[-1]
    if state_len < width - 1:
        raise ValueError(f"conv_state length {state_len} < width - 1 = {width - 1}")
    xs = x.to(state.dtype)

    if cache_seqlens is None:
        window = torch.cat([state, xs], dim=-1)  # (batch, dim, state_len + seqlen)
        state.copy_(window[:, :, seqlen:])
        window = window[:, :, window.shape[-1] - (width - 1 + seqlen) :]
    else:
        base = cache_seqlens.to(device=x.device, dtype=torch.long)[:, None]  # (batch, 1)
        back = torch.arange(-(width - 1), 0, device=x.device, dtype=torch.long)
        slots = torch.remainder(base + back, state_len)  # (batch, width - 1)
        prev = state.gather(2, slots[:, None, :].expand(batch, dim, width - 1))
        window = torch.cat([prev, xs], dim=-1)  # (batch, dim, width - 1 + seqlen)
        keep = min(seqlen, state_len)  # only the newest state_len inputs survive
        ahead = torch.arange(seqlen - keep, seqlen, device=x.device, dtype=torch.long)
        dest = torch.remainder(base + ahead, state_len)  # (batch, keep), distinct per row
        state.scatter_(2, dest[:, None, :].expand(batch, dim, keep), xs[:, :, seqlen - keep :])

    if rows is not None:
        conv_state.index_copy_(0, rows, state)

    b = bias.float() if bias is not None else None
    acc = F.conv1d(window.float(), weight.float().unsqueeze(1), b, padding=0, groups=dim)  # (batch, dim, seqlen)
    out = _finish(acc, silu, x.dtype)
    return out.squeeze(-1) if squeeze else out
