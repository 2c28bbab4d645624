"""Attention backends over the paged KV cache, chosen by :func:`create_attention_backend`."""

from __future__ import annotations

import logging

import torch

from specdec.kernels.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    build_attention_metadata,
)
from specdec.kernels.attention.reference import ReferenceAttentionBackend
from specdec.kernels.names import ATTENTION_BACKENDS

log = logging.getLogger(__name__)

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
    """``"reference"`` | ``"cpu"`` | ``"flashinfer"`` | ``"auto"``.

    ``auto`` takes FlashInfer on CUDA when it is installed, else the C kernel backend on
    the CPU when it builds here (a warning names the reason when it does not), else the
    reference. ValueError for an unknown name; RuntimeError when ``flashinfer`` is asked
    for and cannot run (no CUDA device, or the package is not installed);
    ``NativeBuildError`` when ``cpu`` is asked for and its kernel cannot be built.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; expected one of {', '.join(ATTENTION_BACKENDS)}"
        )
    device = torch.device(device)
    if name == "auto":
        if flashinfer_available(device):
            name = "flashinfer"
        elif device.type == "cpu":
            return _cpu_backend_or_reference()
        else:
            name = "reference"
    if name == "reference":
        return ReferenceAttentionBackend()
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention backend 'cpu' runs on the CPU, not on {device}")
        from specdec.kernels.attention.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend()
    if not flashinfer_available(device):
        raise RuntimeError(
            f"attention backend 'flashinfer' needs a CUDA device and the flashinfer package "
            f"(pip install flashinfer-python); device is {str(device)!r}, CUDA available: "
            f"{torch.cuda.is_available()}. Use the 'cpu' or 'reference' backend instead."
        )
    from specdec.kernels.attention.flashinfer_backend import FlashInferAttentionBackend

    return FlashInferAttentionBackend(device)


def _cpu_backend_or_reference() -> AttentionBackend:
    from specdec.kernels.attention.cpu_backend import CpuAttentionBackend
    from specdec.kernels.native import NativeBuildError

    try:
        return CpuAttentionBackend()
    except NativeBuildError as exc:
        log.warning("CPU attention kernel unavailable, using the reference backend: %s", exc)
        return ReferenceAttentionBackend()
