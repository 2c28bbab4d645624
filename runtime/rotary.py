"""Rotary position embedding over flat token positions (default and Llama-3 scaling)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from specdec.runtime.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """float32 ``[head_dim // 2]``, computed as ``transformers`` does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "default":
        return inv_freq
    # llama3: stretch low frequencies by `factor`, interpolate the middle band.
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Holds a ``[max_positions, head_dim]`` cos/sin table; ``lookup`` gathers once per step.

    ``sin_signed`` folds the sign of ``rotate_half`` into the table so applying RoPE is
    ``x * cos + roll(x, head_dim // 2) * sin_signed``: three elementwise kernels per tensor.
    """

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin_signed", torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the float32 tables, e.g. after the model was built on the meta device."""
        if device is None:
            device = self.cos.device if self.cos.device.type != "meta" else "cpu"
        with torch.device("cpu"):  # real numbers even inside a meta-device build
            inv_freq = inverse_frequencies(self.rope, self.head_dim)
            positions = torch.arange(self.max_positions, dtype=torch.float32)
            freqs = positions[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            half = self.head_dim // 2
            sin = emb.sin()
        self.cos = emb.cos().to(device)
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device)

    def for_step(self, positions: torch.Tensor, dtype: torch.dtype, in_kernel: bool) -> RotaryStep:
        """One step's RoPE inputs for int64 ``positions [T]`` (looked up once per step).

        ``in_kernel``: for the C kernel, which indexes the whole tables itself; else the
        step's rows ``[T, 1, head_dim]`` in ``dtype``. IndexError for a position past the
        tables either way.
        """
        if positions.numel() and not 0 <= int(positions.min()) <= int(positions.max()) < (
            self.max_positions
        ):
            raise IndexError(f"positions must lie in [0, {self.max_positions})")
        if in_kernel:
            return RotaryStep(self.cos, self.sin_signed, positions)
        cos = self.cos.index_select(0, positions).to(dtype).unsqueeze(1)
        sin = self.sin_signed.index_select(0, positions).to(dtype).unsqueeze(1)
        return RotaryStep(cos, sin, None)


@dataclass(frozen=True)
class RotaryStep:
    """``cos`` / ``sin_signed``: the step's rows ``[T, 1, D]`` (``positions`` None), or the
    whole ``[max_positions, D]`` tables plus the ``positions`` to read (the C kernel)."""

    cos: torch.Tensor
    sin_signed: torch.Tensor
    positions: torch.Tensor | None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE for ``x [T, H, D]`` (rotate-half convention, as Llama / Qwen3 checkpoints use)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)
