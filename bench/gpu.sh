#!/usr/bin/env bash
# The GPU checks as one command on one H100/H200 (a few minutes), run from the repository root:
# the varlen tests with the CUDA kernel test, then the sdpa-dense vs varlen benchmark, whose JSON
# lands in bench/results/gpu-<date>-<device>.json. Extra arguments go to bench/bench_gpu.py.
#   bash bench/gpu.sh
#   PYTHON=python bash bench/gpu.sh --quick
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # a checkout works without an install
echo "== 1/3 device"; "$PYTHON" -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu.sh: no CUDA device here'); print(torch.cuda.get_device_name(0), 'torch', torch.__version__)"
echo "== 2/3 tests"; "$PYTHON" -m pytest -q -rs tests/model/test_varlen.py
echo "== 3/3 benchmark"; "$PYTHON" bench/bench_gpu.py "$@"
