"""How a model service runs: its flags, and the message sizes it accepts."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.flags import parse
from specdec.kernels.names import ATTENTION_BACKENDS, KV_CACHE_DTYPES
from specdec.runtime.config import (
    COMPUTE_DTYPES,
    DEFAULT_KV_CACHE_TOKENS,
    QUANTIZATIONS,
    RuntimeConfig,
)

# Draft probabilities are K x vocab float32 per proposed token (8 x 152k x 4 B is ~5 MB):
# above gRPC's 4 MB. A step carries at most this many proposed tokens' probabilities.
MAX_SAMPLED_TOKENS_PER_STEP = 512


def message_limits(vocab_size: int) -> list[tuple[str, int]]:
    """Explicit message size limits, from the model: one step's draft probabilities
    (``MAX_SAMPLED_TOKENS_PER_STEP`` x vocab float32) plus 16 MiB for the rest."""
    size = 16 * 1024 * 1024 + MAX_SAMPLED_TOKENS_PER_STEP * vocab_size * 4
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]


_SIZE_UNITS = {
    "": 1,
    **{unit: 1000 ** (i + 1) for i, unit in enumerate("KMGT")},
    **{f"{unit}I": 1024 ** (i + 1) for i, unit in enumerate("KMGT")},
}


def parse_size(text: str) -> int:
    """Bytes from ``1073741824``, ``512MiB``, ``2GiB``, ``1G`` (K/M/G/T: powers of 1000,
    KiB/MiB/GiB/TiB: of 1024; a trailing B is optional, case is ignored)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?)?B?\s*", text.upper())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (1073741824) or a number with a unit "
            f"(512MiB, 2GiB, 1G)"
        )
    return int(float(match[1]) * _SIZE_UNITS[match[2] or ""])


@dataclass(frozen=True)
class ServiceConfig:
    """How a model service runs; flags are vLLM's names (``--block-size``, ...)."""

    model: str = field(
        metadata={"help": "a Hugging Face folder, a .gguf file, or a folder holding one"}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind (0 = any free port)"})
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "choices": KV_CACHE_DTYPES,
            "help": "auto: the weights' dtype; fp8 (e4m3, e5m2): 8-bit KV with per-layer scales",
        },
    )
    dtype: str = field(
        default="float32",
        metadata={"choices": COMPUTE_DTYPES, "help": "the weights' and activations' dtype"},
    )
    quantization: str = field(
        default="none",
        metadata={
            "choices": QUANTIZATIONS,
            "help": "int8: the linears' weights as int8 with a scale per output channel "
            "(weight-only), a quarter of float32's bytes per token",
        },
    )
    block_size: int = field(default=16, metadata={"help": "tokens per KV page"})
    num_gpu_blocks_override: int | None = field(
        default=None, metadata={"help": "number of KV pages (default: from the memory budget)"}
    )
    kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata={
            "flags": ("--kv-cache-memory", "--kv-cache-memory-bytes"),
            "type": parse_size,
            "help": "KV cache size in bytes, or with a unit: 512MiB, 2GiB, 1G (default: "
            f"pages for {DEFAULT_KV_CACHE_TOKENS} tokens)",
        },
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={"help": "keep full KV blocks and share them between requests by content"},
    )
    max_model_len: int | None = field(default=None, metadata={"help": "default: checkpoint's"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1, ..."})
    attention_backend: str = field(
        default="auto",
        metadata={
            "choices": ATTENTION_BACKENDS,
            "help": "auto: flashinfer on CUDA, the C kernel (cpu) on the CPU, else reference",
        },
    )
    grace_s: float = field(default=5.0, metadata={"help": "drain time on SIGTERM"})
    num_threads: int = field(
        default=0,
        metadata={"help": "threads for model work, torch's and the C kernels' (0: all cores)"},
    )
    tls_cert: str = field(default="", metadata={"help": "PEM certificate: serve TLS"})
    tls_key: str = field(default="", metadata={"help": "PEM private key of --tls-cert"})
    tls_ca: str = field(
        default="", metadata={"help": "PEM CA: mutual TLS, only clients it signed get in"}
    )
    sequence_idle_timeout: float = field(
        default=600.0,
        metadata={"help": "seconds after which a sequence no call has touched is released"},
    )

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            model=self.model,
            dtype=self.dtype,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            page_size=self.block_size,
            num_pages=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            max_model_len=self.max_model_len,
            device=self.device,
            attention_backend=self.attention_backend,
            enable_prefix_caching=self.enable_prefix_caching,
        )

    @classmethod
    def from_args(cls, prog: str, argv: Sequence[str] | None = None) -> ServiceConfig:
        """Parse the flags (one per field, see ``specdec.flags``)."""
        return parse(cls, prog, argv)
