#!/usr/bin/env bash
# Install what is missing (the real pair fetched and converted included), then run the
# main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh dev
exec .venv/bin/specdec demo "$@"
