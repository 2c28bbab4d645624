"""FP8 KV-cache dtypes: the `--kv-cache-dtype` flag, and per-tensor quantise / dequantise.

Stored value: ``x8 = fp8(clamp(x / scale, -max, +max))``; read back as ``x8 * scale``. The
clamp comes before the cast because PyTorch's CPU cast turns out-of-range values into NaN
(e4m3fn has no infinity), and a NaN in one KV entry poisons every attention row that reads it.
"""

from __future__ import annotations

import torch

from specdec.kernels.names import KV_CACHE_DTYPES

_FP8_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def resolve_kv_cache_dtype(kv_cache_dtype: str, compute_dtype: torch.dtype) -> torch.dtype:
    """Map the vLLM-style ``--kv-cache-dtype`` value to the storage dtype.

    ``"auto"`` stores in the model's compute dtype; ``"fp8"`` is an alias of ``"fp8_e4m3"``.
    Raises ValueError for anything else.
    """
    if kv_cache_dtype == "auto":
        return compute_dtype
    try:
        return _FP8_DTYPES[kv_cache_dtype]
    except KeyError:
        raise ValueError(
            f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of "
            f"{', '.join(KV_CACHE_DTYPES)}"
        ) from None


def is_fp8(dtype: torch.dtype) -> bool:
    """True for the two FP8 formats the KV cache can use."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    if not is_fp8(dtype):
        raise ValueError(f"{dtype} is not an fp8 dtype")
    return float(torch.finfo(dtype).max)


def quantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``fp8(clamp(x / scale, -max, +max))``: saturates out-of-range values, never NaN."""
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize_fp8(
    x8: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``x8.to(dtype) * scale``, the inverse of :func:`quantize_fp8` up to rounding."""
    return (fp8_to_float32(x8) * scale).to(dtype)


_FLOAT32_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def fp8_code_table(dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 ``[256]``: the value of each byte code of an FP8 dtype (cached)."""
    key = (dtype, torch.device(device))
    table = _FLOAT32_TABLES.get(key)
    if table is None:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        table = _FLOAT32_TABLES[key] = codes.view(dtype).to(torch.float32).to(key[1])
    return table


def fp8_to_float32(x8: torch.Tensor) -> torch.Tensor:
    """Exact ``x8.to(torch.float32)``, fast on CPU.

    PyTorch's CPU fp8 cast converts element by element (~5x slower than a gather), which
    would dominate CPU decode. An FP8 byte has only 256 values, so on CPU we look them up
    in :func:`fp8_code_table` instead; other devices use the native cast.
    """
    if x8.device.type != "cpu":
        return x8.to(torch.float32)
    table = fp8_code_table(x8.dtype, x8.device)
    codes = x8.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return table.index_select(0, codes).view(x8.shape)
