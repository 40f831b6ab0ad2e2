#!/usr/bin/env bash
# Install gnnscale and its sampling backend into ./.venv (or the active virtualenv).
# Idempotent: whatever is already installed is kept, so a second run takes seconds.
#
#   ./install.sh                      CPU: torch 2.13.0 CPU wheel, torch-scatter/torch-sparse built
#                                     from source against it (~25 min on 2 cores, once; pip caches
#                                     the wheels), pymetis for Cluster-GCN partitioning.
#   TORCH_SPEC="torch==2.5.1" PYG_WHEELS=https://data.pyg.org/whl/torch-2.5.0+cu124.html ./install.sh
#                                     CUDA: your own torch build, and pyg-lib, torch-scatter and
#                                     torch-sparse as prebuilt wheels from PyG's index (online).
#   VENV=/path/to/env ./install.sh    another virtualenv location.
set -euo pipefail
cd "$(dirname "$0")"

if [ -z "${VIRTUAL_ENV:-}" ]; then
  venv="${VENV:-.venv}"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
fi
pip() { python -m pip "$@"; }
has() { python -c "import $1" >/dev/null 2>&1; }

# torch first: a bare "torch" requirement would pull a multi-GB CUDA build.
has torch || pip install "${TORCH_SPEC:-torch==2.13.0}"

# GraphSAINT needs torch-sparse (which imports torch-scatter); neighbour sampling uses pyg-lib
# when present, else torch-sparse.
if ! has torch_sparse || ! has torch_scatter; then
  if [ -n "${PYG_WHEELS:-}" ]; then
    pip install pyg-lib torch-scatter torch-sparse -f "$PYG_WHEELS"
  else
    pip install ninja numpy scipy setuptools wheel
    MAX_JOBS="${MAX_JOBS:-2}" pip install --no-build-isolation torch-scatter torch-sparse
  fi
fi

pip install -e ".[dev]"
backend=$(python -c "import gnnscale; print(gnnscale.sampling_backend())")
if [ "$backend" = "none" ]; then
  echo "install.sh: neither pyg-lib nor torch-sparse imports; neighbour sampling, Cluster-GCN and" >&2
  echo "GraphSAINT cannot run. See the errors above (python -c 'import torch_sparse' shows why)." >&2
  exit 1
fi
echo "gnnscale ready; sampling backend: $backend"
