#!/usr/bin/env bash
# Span head (nested NER, all entities) next to the flat IOB2 tagger (outermost entities only) on
# the same reduced budget, MiniLM, one seed. Writes runs/nested-vs-flat/results.{json,md};
# docs/nested-ner.md reports the figures. About an hour on 2 busy CPU cores (4 runs).
#   bash scripts/nested_vs_flat.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(.venv/bin/python -c "from detour.paths import minilm_path; print(minilm_path())")}
.venv/bin/detour eval "$MODEL" \
  --tasks quaero-emea,social-history \
  --task-spec docs/nested-ner/quaero-emea-flat.yaml --task-spec docs/nested-ner/social-history-flat.yaml \
  --seeds 1 --epochs 4 --max-train 300 --max-eval 200 --max-length 256 --batch-size 16 \
  --out runs/nested-vs-flat "${@:2}"
