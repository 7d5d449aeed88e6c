#!/usr/bin/env bash
# detour on an older library stack, on the CPU: by default the one of the GPU node that
# bench/gpu.sh targets (Python 3.12, torch 2.11.0, transformers 5.17.0, tokenizers 0.23.2).
# It builds a virtual environment outside the checkout (PyPI's Linux torch wheels are CUDA builds:
# torch plus its nvidia libraries take several GB, and run on the CPU as well), installs detour
# from this checkout without its pinned dependencies, then runs tests/model and a tiny
# `detour twins` on a prepared synthetic corpus. The log, with this machine's paths written as
# `.`, `$VENV` and `~`, goes to bench/results/compat-<date>-torch<T>-transformers<V>.log.
#   bash bench/compat.sh
#   TORCH=2.13.0 TRANSFORMERS=5.24.0 TOKENIZERS=0.23.3 bash bench/compat.sh
#   DETOUR_COMPAT_VENV=/big/disk/venv bash bench/compat.sh
# Exit status: 0 when the tests and the twins run pass, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
TORCH="${TORCH:-2.11.0}"
TRANSFORMERS="${TRANSFORMERS:-5.17.0}"
TOKENIZERS="${TOKENIZERS:-0.23.2}"
VENV="${DETOUR_COMPAT_VENV:-$HOME/.cache/detour-compat/torch$TORCH-transformers$TRANSFORMERS}"
LOG="bench/results/compat-$(date -u +%Y%m%d)-torch$TORCH-transformers$TRANSFORMERS.log"

# Python 3.12, as on the node, where there is one (directly, or as a pyenv version); else this one.
find_python() {
  if python3.12 -c "" 2>/dev/null; then echo python3.12; return; fi
  if command -v pyenv >/dev/null; then
    local p
    p="$(ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)"
    [ -n "$p" ] && { echo "$p"; return; }
  fi
  echo python3
}
PY="$(find_python)"

# Paths of this machine do not belong in a log that is committed.
# pip's notes about this machine's local package folders are left out with them.
scrub() {
  grep --line-buffered -v "^WARNING: Location 'file:" |
    sed -u -e "s|$VENV|\$VENV|g" -e "s|$work|\$TMP|g" -e "s|$REPO|.|g" -e "s|$HOME|~|g"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

main() {
  set -e
  echo "== compat: torch $TORCH, transformers $TRANSFORMERS, tokenizers $TOKENIZERS"
  echo "checkout: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "== 1/4 environment ($("$PY" --version))"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  printf 'torch==%s\ntransformers==%s\ntokenizers==%s\n' "$TORCH" "$TRANSFORMERS" "$TOKENIZERS" >"$work/pins.txt"
  "${pip[@]}" -c "$work/pins.txt" "torch==$TORCH" "transformers==$TRANSFORMERS" "tokenizers==$TOKENIZERS"
  "${pip[@]}" --no-deps -e .
  # the rest of pyproject.toml's dependencies and the test extra, never moving the three pins
  "$VENV/bin/python" - >"$work/rest.txt" <<'EOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["test"]:
    if re.match(r"(torch|transformers|tokenizers)\b", req) is None:
        print(req)
EOF
  "${pip[@]}" -c "$work/pins.txt" -r "$work/rest.txt"
  "$VENV/bin/python" -c "import sys, torch, transformers, tokenizers; print('python', sys.version.split()[0], \
'| torch', torch.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__)"
  echo "venv size: $(du -sh "$VENV" | cut -f1)"

  echo "== 2/4 tests/model"
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/model || status=1

  echo "== 3/4 detour prepare (synthetic corpus)"
  local detour="$VENV/bin/detour"
  "$detour" prepare "synthetic:clinical?docs=300&seed=0" --tokenizer minilm-l6 --out "$work/data" --workers 1

  echo "== 4/4 detour twins (tiny-modernbert, shrunk)"
  local sets=(data.sources=["$work/data"] model.config.num_hidden_layers=3 data.seq_len=128
              batch.global_sequences=4 batch.micro_batch=4 phases.0.tokens=8k phases.0.lr.warmup_tokens=1k
              phases.1.tokens=2k checkpoint.every_tokens=4k)
  local args=(twins recipes/tiny-modernbert.yaml --out "$work/twins" --no-progress)
  for s in "${sets[@]}"; do args+=(--set "$s"); done
  "$detour" "${args[@]}" || status=1
  "$VENV/bin/python" - "$work/twins/twins.json" <<'EOF' || status=1
import json, math, sys
report = json.load(open(sys.argv[1]))
losses = {k: v for k, v in report["end_of_decay_mlm_loss"].items() if k != "phase"}
ok = all(report["checks"].values()) and all(math.isfinite(v) and v > 0 for v in losses.values())
print("twins checks:", report["checks"], "| end-of-decay MLM loss:", {k: round(v, 4) for k, v in losses.items()})
print("twins:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
EOF
  return "${status:-0}"
}

mkdir -p bench/results
main 2>&1 | scrub | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "compat: $([ "$rc" = 0 ] && echo passed || echo FAILED) (log: $LOG)"
exit "$rc"
