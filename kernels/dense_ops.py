"""A Llama layer's dense ops as C calls (``csrc/dense_ops.c``), float32 on the CPU.

RMSNorm, Qwen3's q/k norm with RoPE, and SiLU-and-mul are each one call where eager
PyTorch runs three to seven ops; at decode batch sizes the per-op cost, not the
arithmetic, is what those spend. ``linear`` multiplies rows by a weight packed in column
blocks, streaming it once at close to memory bandwidth (MKL's GEMM reaches about half of
it at a few rows). It is batch-invariant: a row's result does not depend on how many rows
come with it (MKL's does: one row alone and the same row among five differ in the last
bits), which an FP8 KV cache needs for speculative output to equal target-only output.
At prefill sizes it takes about 1.5x MKL's time.

float32 on the CPU only: :func:`available` says whether a tensor qualifies and the kernels
were built; callers keep their PyTorch form for everything else. Results match PyTorch's
to float32 rounding (sums run in a different order).
"""

from __future__ import annotations

import functools

import torch

from specdec.kernels.native import NativeBuildError, load_library

MAX_HEAD_DIM = 512  # the RoPE kernel's scratch row
LINEAR_COLS = 32  # columns per packed weight block (LINEAR_COLS in csrc/dense_ops.c)


@functools.cache
def library_loads() -> bool:
    """Whether the kernels are built (or can be) here."""
    try:
        load_library()
    except NativeBuildError:
        return False
    return True


def set_num_threads(num_threads: int) -> int:
    """Threads the linears split their column blocks over (the caller's included; results
    do not depend on it). Returns the count in effect; 1 where the kernels do not build."""
    if not library_loads():
        return 1
    return load_library().specdec_set_num_threads(num_threads)


def num_threads() -> int:
    """Threads the linears split over now (1 where the kernels do not build)."""
    return load_library().specdec_num_threads() if library_loads() else 1


def available(x: torch.Tensor) -> bool:
    """True when ``x`` is float32 on the CPU and the kernels are built."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and library_loads()


def check_float32_rows(name: str, x: torch.Tensor) -> None:
    """ValueError unless ``x`` is float32 on the CPU with contiguous rows."""
    # Runs several times a layer: attribute tests only (x.device would build an object).
    if x.dtype is not torch.float32 or not x.is_cpu or x.stride(-1) != 1:
        raise ValueError(f"{name} must be float32 on the CPU with contiguous rows")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x², -1) + eps) * weight`` for ``x [..., dim]``."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    check_float32_rows("x", rows)
    check_float32_rows("weight", weight)
    if weight.shape != (dim,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({dim},)")
    out = torch.empty(x.shape, dtype=torch.float32)
    load_library().specdec_rms_norm(
        rows.data_ptr(), rows.stride(0), weight.data_ptr(), eps, out.data_ptr(), dim,
        rows.shape[0], dim,
    )  # fmt: skip
    return out


def qk_norm_rope_(
    qkv: torch.Tensor,
    num_heads: int,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """In place on the first ``num_heads`` heads of ``qkv [T, H, D]`` (contiguous): the
    per-head RMSNorm with ``norm_weight [num_heads, D]`` when given, then RoPE with the
    ``[max_positions, D]`` tables ``cos`` / ``sin_signed`` (rotate-half convention).

    ``positions`` must lie in ``[0, max_positions)``: they are not range-checked here (per
    layer that would cost as much as the op); ``RotaryEmbedding.for_step`` checks them once
    a step."""
    tokens, total_heads, head_dim = qkv.shape
    check_float32_rows("qkv", qkv)
    if not qkv.is_contiguous() or not 0 < num_heads <= total_heads:
        raise ValueError(f"qkv must be contiguous [T, H >= {num_heads}, D]")
    if head_dim > MAX_HEAD_DIM or head_dim % 2:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {head_dim}")
    for name, table in (("cos", cos), ("sin_signed", sin_signed)):
        check_float32_rows(name, table)
        if not table.is_contiguous() or table.shape[1:] != (head_dim,):
            raise ValueError(f"{name} must be a contiguous [max_positions, {head_dim}] table")
    if positions.dtype != torch.int64 or positions.shape != (tokens,):
        raise ValueError(f"positions must be int64 [{tokens}]")
    weight_ptr = None
    if norm_weight is not None:
        check_float32_rows("norm_weight", norm_weight)
        if norm_weight.shape != (num_heads, head_dim) or not norm_weight.is_contiguous():
            raise ValueError(f"norm_weight must be a contiguous [{num_heads}, {head_dim}]")
        weight_ptr = norm_weight.data_ptr()
    positions = positions.contiguous()
    load_library().specdec_qk_norm_rope(
        qkv.data_ptr(), tokens, qkv.stride(0), num_heads, head_dim, weight_ptr, eps,
        cos.data_ptr(), sin_signed.data_ptr(), positions.data_ptr(),
    )  # fmt: skip


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up [T, 2 * inter]`` (contiguous) -> ``[T, inter]``."""
    check_float32_rows("gate_up", gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not gate_up.is_contiguous():
        raise ValueError("gate_up must be a contiguous [tokens, 2 * intermediate_size]")
    tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, inter, dtype=torch.float32)
    load_library().specdec_silu_and_mul(gate_up.data_ptr(), tokens, inter, out.data_ptr())
    return out


# The packed weight's dtype -> the C function multiplying by it (activations are float32).
LINEAR_KERNELS = {
    torch.float32: "specdec_linear",
    torch.bfloat16: "specdec_linear_bf16",
    torch.float16: "specdec_linear_f16",
    torch.int8: "specdec_linear_i8",
}
INT8_MAX = 127
# An int8 block ends with its LINEAR_COLS float32 scales, 4 bytes each: 4 more rows.
INT8_SCALE_ROWS = 4


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output column (symmetric, weight-only): ``[in, out]`` float32 -> the int8
    values ``[in, out]`` and the float32 scales ``[out]`` (absmax / 127; 1 for an all-zero
    column), ``weight ≈ q * scale``."""
    scale = weight.abs().amax(0) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[in, out]`` -> ``[out / LINEAR_COLS, in, LINEAR_COLS]`` (each column block a
    stream), stored as ``dtype`` (one of LINEAR_KERNELS: 16 bits halve the bytes a step
    reads; the kernel widens them to float32). ``torch.int8`` quantizes per output column
    (:func:`quantize_int8`) and appends each block's scales as ``INT8_SCALE_ROWS`` more
    rows: ``[out / LINEAR_COLS, in + INT8_SCALE_ROWS, LINEAR_COLS]``, a quarter of the
    bytes. ValueError unless ``out`` is a multiple of LINEAR_COLS."""
    check_float32_rows("weight", weight)
    if dtype not in LINEAR_KERNELS:
        raise ValueError(f"no linear kernel for {dtype} weights")
    k, n = weight.shape
    if n % LINEAR_COLS:
        raise ValueError(f"cannot pack {n} output columns in blocks of {LINEAR_COLS}")
    if dtype == torch.int8:
        weight, scale = quantize_int8(weight)
    blocks = weight.reshape(k, n // LINEAR_COLS, LINEAR_COLS).permute(1, 0, 2).to(dtype)
    if dtype == torch.int8:
        scales = scale.reshape(n // LINEAR_COLS, LINEAR_COLS).contiguous().view(torch.int8)
        blocks = torch.cat([blocks, scales.view(-1, INT8_SCALE_ROWS, LINEAR_COLS)], 1)
    return blocks.contiguous()


def packed_in_features(packed: torch.Tensor) -> int:
    """The ``in`` of a weight packed by :func:`pack_linear_weight`."""
    return packed.shape[1] - (INT8_SCALE_ROWS if packed.dtype == torch.int8 else 0)


def unpack_linear_weight(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_linear_weight`: ``[in, out]`` float32, contiguous (for
    int8, the dequantized ``q * scale``)."""
    blocks, _, cols = packed.shape
    k = packed_in_features(packed)
    weight = packed[:, :k].permute(1, 0, 2).reshape(k, blocks * cols).float()
    if packed.dtype == torch.int8:
        scale = packed[:, k:].contiguous().view(torch.float32).reshape(blocks * cols)
        weight = weight * scale
    return weight


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W (+ bias) (+ residual)`` for float32 ``x [M, in]`` and ``W`` packed by
    :func:`pack_linear_weight` (any of its dtypes); float32 ``[M, out]``."""
    blocks, _, cols = packed.shape
    k, n = packed_in_features(packed), blocks * cols
    check_float32_rows("x", x)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x has shape {tuple(x.shape)}, the weight takes [M, {k}]")
    if bias is not None:
        check_float32_rows("bias", bias)
        if bias.shape != (n,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({n},)")
    if residual is not None:
        check_float32_rows("residual", residual)
        if residual.shape != (x.shape[0], n):
            raise ValueError(
                f"residual has shape {tuple(residual.shape)}, expected {(x.shape[0], n)}"
            )
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    getattr(load_library(), LINEAR_KERNELS[packed.dtype])(
        x.data_ptr(), x.stride(0), packed.data_ptr(),
        None if bias is None else bias.data_ptr(),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        out.data_ptr(), x.shape[0], k, n,
    )  # fmt: skip
    return out
