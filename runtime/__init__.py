"""specdec runtime: HF checkpoint loading and Llama/Qwen3 forward over the paged KV cache.

The names below load on first use, so that a torch-free caller (a service's flags, the
stack's configuration) can import ``specdec.runtime.config`` without torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KVScaleTable": "specdec.runtime.kv_scales",
    "KVScalesMismatchError": "specdec.runtime.kv_scales",
    "ModelRunner": "specdec.runtime.model_runner",
    "RuntimeConfig": "specdec.runtime.config",
    "SequenceChunk": "specdec.runtime.sequence",
    "calibrate": "specdec.runtime.calibration",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
