#!/usr/bin/env bash
# Install gnnscale into ./.venv (or the active virtualenv), from PyPI's wheels alone: gnnscale
# samples every task itself, so nothing is compiled. Idempotent: whatever is already installed is
# kept, so a second run takes seconds.
#
#   ./install.sh                      CPU: torch 2.13.0's CPU wheel, then gnnscale and its
#                                     dependencies (wheels only; about a minute once cached).
#   WITH_TORCH_SPARSE=1 ./install.sh  also torch-scatter and torch-sparse, PyG's older backend,
#                                     built from source against torch (~25 min on 2 cores, once:
#                                     pip caches the wheels): for the parity tests against PyG's
#                                     sampling (tests/test_parity.py) and `--data.loader.sampler=pyg`.
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

# PyG's own backends, optional: pyg-lib (PyG's fastest sampler, used when present) and
# torch-sparse come as wheels from PyG's index only; from PyPI, torch-sparse is a source build.
if [ -n "${PYG_WHEELS:-}" ]; then
  has torch_sparse && has torch_scatter || pip install pyg-lib torch-scatter torch-sparse -f "$PYG_WHEELS"
elif [ "${WITH_TORCH_SPARSE:-0}" = 1 ] && ! { has torch_sparse && has torch_scatter; }; then
  pip install ninja numpy scipy setuptools wheel
  MAX_JOBS="${MAX_JOBS:-2}" pip install --no-build-isolation torch-scatter torch-sparse
fi

pip install -e ".[dev]"
sampler=$(python -c "from gnnscale.sampling import describe; print(describe('auto'))")
echo "gnnscale ready; neighbour sampling by $sampler"
