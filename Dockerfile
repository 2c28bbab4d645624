# specdec images, two targets from one file:
#   model        torch + the whole project + the bundled checkpoints; runs specdec.target_service and
#                specdec.draft_service (and everything else: `specdec up`, bench, tests' code paths).
#   coordinator  no torch, no transformers: the coordinator never imports them (DESIGN.md),
#                so its image is a fraction of the size and starts fast.
#
#   docker build --target model -t specdec/model .
#   docker build --target coordinator -t specdec/coordinator .
#   docker build --target gateway -t specdec/gateway .
#
# GPU build of the model image (FlashInfer attention over the FP8 KV cache):
#   docker build --target model -t specdec/model:gpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 --build-arg EXTRAS=gpu .
# FlashInfer may JIT-compile kernels at first use; that needs nvcc, i.e. a CUDA "devel" base
# with Python 3.11 given as --build-arg PYTHON_IMAGE=...

ARG PYTHON_IMAGE=python:3.11-slim

# ---- base: a venv, a non-root user, and the dependency lister ----------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && useradd --system --create-home --uid 10001 specdec
# Prints pyproject.toml's [project] dependencies, less the names given as arguments. The
# dependency layers are then built from pyproject.toml alone (cached across code changes),
# and pyproject.toml stays the one list of versions.
RUN printf '%s\n' \
      'import re, sys, tomllib' \
      'deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]' \
      'skip = {name.lower() for name in sys.argv[1:]}' \
      'for dep in deps:' \
      '    if re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower() not in skip:' \
      '        print(dep)' \
      > /usr/local/bin/project_deps.py
WORKDIR /src

# ---- coordinator: the public API, the scheduler, metrics; no model code --------------------
FROM base AS coordinator
COPY pyproject.toml ./
# Model-side dependencies are left out; everything else (grpcio*, protobuf, tokenizers,
# opentelemetry-*, prometheus-client) comes with pyproject.toml's version bounds.
RUN python /usr/local/bin/project_deps.py torch safetensors gguf numpy > requirements.txt \
    && pip install -r requirements.txt
# The whole package (its sources are small); --no-deps keeps torch out, and the coordinator
# never imports the model-side parts.
COPY protos protos
COPY kernels kernels
COPY runtime runtime
COPY model_service model_service
COPY draft_service draft_service
COPY target_service target_service
COPY telemetry telemetry
COPY auth auth
COPY coordinator coordinator
COPY specdec specdec
RUN pip install --no-deps . && rm -rf build *.egg-info
# The tokenizer only (for text prompts and detokenising), not the 50 MB of weights.
WORKDIR /app
COPY models/target/tokenizer.json models/target/tokenizer_config.json models/target/
USER specdec
EXPOSE 50050 9090
CMD ["python", "-m", "specdec.coordinator", "--host", "0.0.0.0", "--port", "50050", \
     "--target", "target:50052", "--draft", "draft:50051", "--tokenizer", "models/target", \
     "--metrics-port", "9090"]

# ---- gateway: the SGLang Model Gateway (the OpenAI API in front of the coordinators) -------
FROM base AS gateway
COPY pyproject.toml ./
# The version bound of the [gateway] extra, from pyproject.toml.
RUN python -c 'import tomllib; extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gateway"]; print("\n".join(extra))' > requirements.txt \
    && pip install -r requirements.txt
USER specdec
EXPOSE 8000 29000
CMD ["smg", "launch", "--backend", "vllm", "--worker-urls", "grpc://coordinator:50050", \
     "--host", "0.0.0.0", "--port", "8000"]

# ---- model: torch + the whole project + the bundled checkpoints ---------------------------
# Last stage, so a plain `docker build .` gives the image that can run everything.
FROM base AS model
ARG TORCH_VERSION=2.13.0
# PyPI's Linux torch wheel is the multi-GB CUDA build; the CPU index serves the small one.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Project extras for the install, e.g. "gpu" (flashinfer-python).
ARG EXTRAS=""
# A C compiler for the CPU attention kernel (kernels/csrc), built when first needed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Torch first, from its own index, so the project's `torch>=2.4` is already satisfied below.
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
COPY pyproject.toml ./
RUN python /usr/local/bin/project_deps.py > requirements.txt \
    && pip install -r requirements.txt
COPY protos protos
COPY kernels kernels
COPY runtime runtime
COPY model_service model_service
COPY draft_service draft_service
COPY target_service target_service
COPY telemetry telemetry
COPY auth auth
COPY coordinator coordinator
COPY specdec specdec
RUN pip install --no-deps . \
    && if [ -n "$EXTRAS" ]; then pip install ".[$EXTRAS]"; fi \
    && rm -rf build *.egg-info
# The checkpoints are baked in (63 MB): the image runs anywhere as built, and an image tag
# pins code and weights together. To serve other checkpoints, mount a folder over
# /app/models read-only (see docker-compose.yml) or pass another --model.
WORKDIR /app
COPY models/target models/target
COPY models/draft models/draft
USER specdec
# Build the CPU attention kernel into the user's cache now, not at the first request.
RUN python -c "from specdec.kernels.native import load_library; load_library()"
EXPOSE 50051 50052
CMD ["python", "-m", "specdec.target_service", "--model", "models/target", \
     "--host", "0.0.0.0", "--port", "50052"]
