#!/usr/bin/env bash
# Install what is missing, lint, check the generated stubs, run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/pytest -q "$@"
