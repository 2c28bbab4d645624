#!/usr/bin/env bash
# Regenerate the Python stubs in protos/ from protos/specdec/v1/*.proto with the pinned
# grpcio-tools (see pyproject's [dev] extra). Run from anywhere; never edit the output.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${1:-.}
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" protos/specdec/v1/*.proto
