#!/usr/bin/env bash
# Regenerate the Python stubs in protos/specdec/v1 (imported as specdec.v1) from its
# *.proto with the pinned grpcio-tools (see pyproject's [dev] extra). Run from anywhere;
# never edit the output. An argument writes them under that folder instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${1:-protos}
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I protos --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" protos/specdec/v1/*.proto
