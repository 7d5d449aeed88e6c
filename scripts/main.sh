#!/usr/bin/env bash
# Set up a virtual environment and run the main job: `detour demo`, a small but complete matched
# study (pretrained MiniLM-L6, the detour, its MLM twin and a second-seed twin on the embedded
# SYNTHETIC clinical corpus; a SYNTHETIC NER task over 3 seeds; CKA with its noise floor; the
# report). On 2 CPU cores, offline (5.3-12.5 minutes measured on 2 idle cores, 39.5 on busy ones).
# Rerunning continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e .
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# tcmalloc, where it is installed, holds CPU training near the memory it uses (README: CPU memory)
preload=$(.venv/bin/python -c "from detour.train.heap import preload_environment as p; print((p('tcmalloc') or {}).get('LD_PRELOAD', ''))")
if [ -n "$preload" ]; then export LD_PRELOAD="$preload"; fi
.venv/bin/detour demo --out "${OUT:-runs/demo}" "$@"
