#!/usr/bin/env bash
# Set up a virtual environment (CPU torch first, so nothing pulls a CUDA build) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
set +e
# Two workers (pytest-xdist), a test file per worker at a time: most tests wait on a subprocess
# or import torch, so two cores run the suite in well under the serial time. DETOUR_TEST_WORKERS=0
# runs it in one process.
.venv/bin/python -m pytest -q --durations=10 -n "${DETOUR_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"  # the slowest tests listed: the suite keeps under 10 minutes
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure of the suite, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
