#!/usr/bin/env bash
# Install what is missing, then run the main job on the bundled models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev
exec .venv/bin/specdec demo "$@"
