#!/usr/bin/env bash
# Set up a virtual environment and run the main job on the embedded synthetic corpus:
# tokenize it, then run the tiny CLM-detour twins (detour + matched MLM baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
export HF_HUB_OFFLINE=1
OUT=${OUT:-runs/main}
TOK=$(.venv/bin/python -c "from detour.paths import minilm_path; print(minilm_path())")
.venv/bin/detour prepare synthetic:clinical:3000:seed=0 --tokenizer "$TOK" --out "$OUT/data"
