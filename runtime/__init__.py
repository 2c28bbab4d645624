"""specdec runtime: HF checkpoint loading and Llama/Qwen3 forward over the paged KV cache."""

from runtime.calibration import calibrate
from runtime.config import RuntimeConfig
from runtime.kv_scales import KVScalesMismatchError, KVScaleTable
from runtime.model_runner import ModelRunner
from runtime.sequence import SequenceChunk

__all__ = [
    "KVScaleTable",
    "KVScalesMismatchError",
    "ModelRunner",
    "RuntimeConfig",
    "SequenceChunk",
    "calibrate",
]
