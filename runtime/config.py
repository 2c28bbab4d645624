"""Runtime configuration: one frozen dataclass; everything derived from it is cached."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from specdec.kernels.names import KV_CACHE_DTYPES
from specdec.runtime.model_config import ModelConfig

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
# Weight quantization at load (vLLM's --quantization): "int8" holds every linear (the
# head included) as int8 with one float32 scale per output channel, weight-only.
QUANTIZATIONS = ("none", "int8")
# The pool when no size is given: 16 sequences of 2048 tokens.
DEFAULT_KV_CACHE_TOKENS = 32768


@dataclass(frozen=True)
class RuntimeConfig:
    """How one model is run.

    ``num_pages`` wins over ``kv_cache_memory_bytes``; with neither, the cache gets the
    pages of ``DEFAULT_KV_CACHE_TOKENS`` tokens. ``max_model_len`` defaults to (and may not
    exceed) the checkpoint's ``max_position_embeddings``. ``kv_scales_path`` names a JSON
    ``KVScaleTable`` that overrides the checkpoint's scales. ``enable_prefix_caching``: full
    KV blocks are kept and shared between sequences by content (``runtime.prefix_cache``).

    ``dtype`` is the weights' dtype. Where the CPU kernels run (``cpu_kernels``) the
    activations, and with them an ``auto`` KV cache, stay float32 whatever it is (the
    kernels widen 16-bit weights as they read them); elsewhere everything runs in it.
    ``quantization`` "int8" then quantizes the linears' weights (``QUANTIZATIONS``): the C
    kernels read them as int8; elsewhere they hold the dequantized values.
    """

    model: str
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    page_size: int = 16
    num_pages: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    attention_backend: str = "auto"
    device: str = "cpu"
    kv_scales_path: str | None = None
    seed: int = 0
    quantization: str = "none"
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {COMPUTE_DTYPES}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; expected one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            )
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        if self.num_pages is not None and self.num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {self.num_pages}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive")

    @cached_property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_pretrained(self.model)

    @cached_property
    def torch_dtype(self):  # -> torch.dtype
        import torch

        return getattr(torch, self.dtype)

    @cached_property
    def cpu_kernels(self) -> bool:
        """Whether the model runs on the C kernels: the CPU, an attention backend that
        takes them (``auto`` or ``cpu``), and a compiler to build them."""
        if self.device != "cpu" or self.attention_backend not in ("auto", "cpu"):
            return False
        from specdec.kernels import dense_ops

        return dense_ops.library_loads()

    @cached_property
    def compute_dtype(self):  # -> torch.dtype
        """The activations' dtype: float32 on the C kernels, else ``dtype``."""
        import torch

        return torch.float32 if self.cpu_kernels else self.torch_dtype

    @cached_property
    def kv_torch_dtype(self):  # -> torch.dtype
        from specdec.kernels.fp8 import resolve_kv_cache_dtype

        return resolve_kv_cache_dtype(self.kv_cache_dtype, self.compute_dtype)

    @cached_property
    def resolved_max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.max_model_len is None:
            return limit
        if not 0 < self.max_model_len <= limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} must be in [1, {limit}] "
                f"(the checkpoint's max_position_embeddings)"
            )
        return self.max_model_len

    @cached_property
    def page_bytes(self) -> int:
        """Bytes one page takes over all layers (K and V)."""
        mc = self.model_config
        itemsize = self.kv_torch_dtype.itemsize
        return mc.num_layers * 2 * self.page_size * mc.num_kv_heads * mc.head_dim * itemsize

    @cached_property
    def resolved_num_pages(self) -> int:
        if self.num_pages is not None:
            return self.num_pages
        if self.kv_cache_memory_bytes is None:
            return -(-DEFAULT_KV_CACHE_TOKENS // self.page_size)
        num_pages = self.kv_cache_memory_bytes // self.page_bytes
        if num_pages <= 0:
            raise ValueError(
                f"kv_cache_memory_bytes={self.kv_cache_memory_bytes} is smaller than one page "
                f"({self.page_bytes} B)"
            )
        return num_pages
