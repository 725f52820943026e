#!/usr/bin/env bash
# Rebuilds the git-ignored `.whl/` folder the `--mamba-ssm` peer reads (see README.txt here):
# the Triton-only subset of state-spaces/mamba at a fixed commit, einops from PyPI, and this
# project's pure-torch stand-in for causal_conv1d. Needs network (git, pip) once; run from the
# repository root. Usage: tools/mamba_peer/build.sh [path-to-a-mamba-checkout]
set -euo pipefail
COMMIT=e9594ce1c732d97440f0332fdc43170a2294dbfa
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT=.whl
SRC="${1:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -z "$SRC" ]; then
  git clone -q https://github.com/state-spaces/mamba "$tmp/mamba"
  SRC="$tmp/mamba"
fi
git -C "$SRC" archive "$COMMIT" mamba_ssm/ops/__init__.py mamba_ssm/ops/triton mamba_ssm/utils/__init__.py \
  mamba_ssm/utils/torch.py mamba_ssm/utils/determinism.py LICENSE AUTHORS | tar -x -C "$tmp"
rm -rf "$OUT" && mkdir -p "$OUT/mamba_ssm" "$OUT/causal_conv1d"
cp -r "$tmp/mamba_ssm/ops" "$tmp/mamba_ssm/utils" "$OUT/mamba_ssm/"
rm -rf "$OUT/mamba_ssm/ops/triton/mamba3"
cp "$tmp/LICENSE" "$tmp/AUTHORS" "$OUT/mamba_ssm/"
cp "$HERE/mamba_ssm_init.py" "$OUT/mamba_ssm/__init__.py"
cp "$HERE/causal_conv1d.py" "$OUT/causal_conv1d/__init__.py"
pip download -q einops==0.8.2 --no-deps -d "$tmp/wheels"
python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/wheels/einops-*.whl "$OUT"
cp "$HERE/README.txt" "$OUT/README.txt"
# Minimal metadata (transformers 5.17 does not read it; other versions' availability checks do).
mkdir -p "$OUT/mamba_ssm-2.3.2.post1.dist-info" "$OUT/causal_conv1d-1.5.2.dist-info"
printf 'Metadata-Version: 2.1\nName: mamba_ssm\nVersion: 2.3.2.post1\nSummary: Triton-kernel subset of state-spaces/mamba %s (no CUDA extensions); see README.txt\nLicense: Apache-2.0\n' "$COMMIT" \
  > "$OUT/mamba_ssm-2.3.2.post1.dist-info/METADATA"
printf 'Metadata-Version: 2.1\nName: causal_conv1d\nVersion: 1.5.2+torch.standin\nSummary: Pure-torch STAND-IN with causal-conv1d'"'"'s causal_conv1d_fn / causal_conv1d_update signatures (not the CUDA package); see README.txt\n' \
  > "$OUT/causal_conv1d-1.5.2.dist-info/METADATA"
echo "built $OUT from mamba $COMMIT"
