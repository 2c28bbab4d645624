"""Attention backends over the paged KV cache, chosen by :func:`create_attention_backend`."""

from __future__ import annotations

import torch

from kernels.attention.base import AttentionBackend, AttentionMetadata, build_attention_metadata
from kernels.attention.reference import ReferenceAttentionBackend

ATTENTION_BACKENDS = ("auto", "reference", "flashinfer")

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "ReferenceAttentionBackend",
    "build_attention_metadata",
    "create_attention_backend",
    "flashinfer_available",
]


def flashinfer_available(device: str | torch.device = "cuda") -> bool:
    """True when ``device`` is CUDA (and CUDA is up) and ``flashinfer`` imports."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def create_attention_backend(
    name: str = "auto", device: str | torch.device = "cpu"
) -> AttentionBackend:
    """``"reference"`` | ``"flashinfer"`` | ``"auto"`` (FlashInfer when it can run here).

    ValueError for an unknown name, RuntimeError when FlashInfer is asked for and cannot
    run (no CUDA device, or the package is not installed).
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; expected one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if name == "auto":
        name = "flashinfer" if flashinfer_available(device) else "reference"
    if name == "reference":
        return ReferenceAttentionBackend()
    if not flashinfer_available(device):
        raise RuntimeError(
            f"attention backend 'flashinfer' needs a CUDA device and the flashinfer package "
            f"(pip install flashinfer-python); device is {device!r}, CUDA available: "
            f"{torch.cuda.is_available()}. Use the 'reference' backend instead."
        )
    from kernels.attention.flashinfer_backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend(device)
