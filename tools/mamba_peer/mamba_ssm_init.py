"""Pure-Python subset of state-spaces/mamba (``mamba_ssm``): the Triton kernels only.

Copied verbatim from https://github.com/state-spaces/mamba at commit
e9594ce1c732d97440f0332fdc43170a2294dbfa (v2.3.2.post1-9-ge9594ce, 2026-07-23), Apache-2.0
(see LICENSE and AUTHORS beside this file). Files kept, unchanged:

    mamba_ssm/ops/__init__.py, mamba_ssm/ops/triton/{__init__,selective_state_update,ssd_combined,
    ssd_bmm,ssd_chunk_scan,ssd_chunk_state,ssd_state_passing,layernorm_gated,layer_norm,
    k_activations,softplus}.py, mamba_ssm/utils/{__init__,torch,determinism}.py

This ``__init__`` is the only file written here: upstream's imports ``selective_scan_fn`` /
``mamba_inner_fn`` (the ``selective_scan_cuda`` extension) and the Mamba/Mamba2/Mamba3 modules;
this one imports nothing, so ``import mamba_ssm`` needs no compiled extension. HF transformers
resolves ``mamba_ssm.ops.triton.selective_state_update.selective_state_update``,
``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` and
``mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined`` by importing those
submodules itself. Runtime needs: torch, triton (>= 3.5 upstream), einops, packaging.

Not usable from this copy: ``selective_scan_fn``/``mamba_inner_fn`` (CUDA extension), and
``mamba_split_conv1d_scan_combined`` (it calls ``causal_conv1d.cpp_functions``, which the
pure-torch ``causal_conv1d`` stand-in does not provide; HF calls it only when training).
"""

__version__ = "2.3.2.post1"
