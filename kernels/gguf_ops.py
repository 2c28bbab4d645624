"""Weights in llama.cpp's GGUF block formats, kept as the file stores them (``csrc/gguf_ops.c``).

A :class:`GGUFWeight` is a matrix ``[out, in]`` whose rows are GGUF blocks: Q8_0, Q4_0, Q4_1,
Q4_K, Q5_K, Q6_K (what the common Q4_K_M / Q5_K_M files hold), or F32 / F16 / BF16 rows. It
may stack up to four parts along the output rows, each in its own type (a Q4_K_M file's
q and k projections are Q4_K where its v is Q6_K), so q/k/v and gate/up still run as one
linear. :func:`linear` dequantises in registers and accumulates in float32: it is float32
math on exactly ``gguf.quants.dequantize``'s values, batch-invariant like ``dense_ops.linear``
(a row's result does not depend on the rows computed beside it). :meth:`GGUFWeight.rows`
dequantises only the embedding rows a step reads.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from enum import IntEnum

import torch

from specdec.kernels.dense_ops import check_float32_rows
from specdec.kernels.native import load_library


class GGMLType(IntEnum):
    """The GGML type ids the kernels read (``gguf.GGMLQuantizationType``'s values)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# type -> (values a block, bytes a block)
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
}
MAX_PARTS = 4  # csrc/ops.h's specdec_gguf_weight
ISAS = {"portable": 0, "avx2": 1, "avx512": 2}


class UnsupportedGGMLType(ValueError):
    """A tensor type the kernels do not read."""


def row_bytes(ggml_type: int, in_features: int) -> int:
    """Bytes of one row of ``in_features`` values; ValueError when the width is not a whole
    number of the type's blocks."""
    try:
        block, nbytes = BLOCK_LAYOUT[GGMLType(ggml_type)]
    except (ValueError, KeyError):
        supported = ", ".join(t.name for t in BLOCK_LAYOUT)
        raise UnsupportedGGMLType(
            f"GGML type {ggml_type} is not supported (supported: {supported})"
        ) from None
    if in_features % block:
        raise ValueError(
            f"{GGMLType(ggml_type).name} rows hold blocks of {block} values; {in_features} "
            f"is not a multiple"
        )
    return in_features // block * nbytes


class _Part(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("rows", ctypes.c_int32), ("data", ctypes.c_void_p)]


class _Weight(ctypes.Structure):
    _fields_ = [("num_parts", ctypes.c_int32), ("parts", _Part * MAX_PARTS)]


@dataclass(frozen=True)
class GGUFPart:
    """``rows`` output rows of one GGML type: ``data`` uint8 ``[rows, row_bytes]``."""

    ggml_type: GGMLType
    data: torch.Tensor

    @property
    def rows(self) -> int:
        return self.data.shape[0]


@dataclass
class GGUFWeight:
    """A ``[out, in]`` matrix in GGUF blocks, parts stacked along the output rows."""

    in_features: int
    parts: list[GGUFPart]
    _struct: _Weight = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < len(self.parts) <= MAX_PARTS:
            raise ValueError(f"a GGUF weight has 1 to {MAX_PARTS} parts, got {len(self.parts)}")
        for part in self.parts:
            expected = row_bytes(part.ggml_type, self.in_features)
            data = part.data
            if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != expected:
                raise ValueError(
                    f"a {part.ggml_type.name} part of width {self.in_features} must be uint8 "
                    f"[rows, {expected}], got {data.dtype} {tuple(data.shape)}"
                )
            if not data.is_contiguous() or not data.is_cpu:
                raise ValueError("GGUF weight data must be contiguous CPU tensors")
        self._struct = _Weight(len(self.parts))
        for i, part in enumerate(self.parts):
            self._struct.parts[i] = _Part(int(part.ggml_type), part.rows, part.data.data_ptr())

    @property
    def out_features(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() for p in self.parts)

    @property
    def address(self) -> int:
        """The C descriptor's address (what ``csrc/decoder_layers.c`` takes as the weight)."""
        return ctypes.addressof(self._struct)

    def with_data(self, tensors: list[torch.Tensor]) -> GGUFWeight:
        """The same weight over other copies of its parts' bytes (e.g. on huge pages)."""
        parts = [GGUFPart(p.ggml_type, t) for p, t in zip(self.parts, tensors, strict=True)]
        return GGUFWeight(self.in_features, parts)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 ``[*ids.shape, in]``: the rows ``ids`` (int64, in range) dequantised."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < self.out_features:
            raise IndexError(f"row ids must lie in [0, {self.out_features})")
        out = torch.empty(flat.numel(), self.in_features, dtype=torch.float32)
        load_library().specdec_gguf_rows(
            self.address, flat.data_ptr(), flat.numel(), self.in_features, out.data_ptr()
        )
        return out.view(*ids.shape, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """float32 ``[out, in]``."""
        return self.rows(torch.arange(self.out_features))


def linear(
    x: torch.Tensor,
    weight: GGUFWeight,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ residual)`` for float32 ``x [M, in]``: float32 ``[M, out]``."""
    k, n = weight.in_features, weight.out_features
    for name, tensor, shape in (
        ("x", x, (x.shape[0], k)),
        ("bias", bias, (n,)),
        ("residual", residual, (x.shape[0], n)),
    ):
        if tensor is None:
            continue
        check_float32_rows(name, tensor)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    load_library().specdec_linear_gguf(
        x.data_ptr(), x.stride(0), weight.address,
        None if bias is None else bias.data_ptr(),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        out.data_ptr(), x.shape[0], k, n,
    )  # fmt: skip
    return out


def set_isa(name: str | None) -> str:
    """Run the kernels on one instruction set (``ISAS``; None: the best this CPU has).
    Returns the one in effect: a set the CPU lacks falls back to the best it has."""
    requested = -1 if name is None else ISAS[name]
    effective = load_library().specdec_gguf_set_isa(requested)
    return next(k for k, v in ISAS.items() if v == effective)
