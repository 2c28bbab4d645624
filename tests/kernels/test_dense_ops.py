"""The C elementwise kernels compute what their PyTorch forms compute, to float32 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels import dense_ops
from specdec.runtime.model_config import RopeConfig
from specdec.runtime.rotary import RotaryEmbedding, apply_rotary

gen = torch.Generator().manual_seed(0)


def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def test_kernels_are_available_for_float32_cpu_tensors_only():
    assert dense_ops.available(torch.zeros(1))
    assert not dense_ops.available(torch.zeros(1, dtype=torch.bfloat16))


@pytest.mark.parametrize("shape", [(7, 256), (2, 3, 96), (1, 40)])
def test_rms_norm_matches_torch(shape):
    x, weight = randn(*shape, scale=3.0), randn(shape[-1])
    out = dense_ops.rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape
    torch.testing.assert_close(out, F.rms_norm(x, (shape[-1],), weight, 1e-6))


def test_rms_norm_reads_strided_rows():
    wide = randn(5, 80)
    x, weight = wide[:, :64], randn(64)  # rows 80 floats apart
    torch.testing.assert_close(
        dense_ops.rms_norm(x, weight, 1e-5), F.rms_norm(x, (64,), weight, 1e-5)
    )


def torch_qk_norm_rope(qkv, num_heads, weight, eps, rotary, positions):
    qk = qkv[:, :num_heads]
    if weight is not None:
        qk = F.rms_norm(qk, (qkv.shape[2],), None, eps) * weight
    rows = rotary.for_step(positions, torch.float32, in_kernel=False)
    return apply_rotary(qk, rows.cos, rows.sin_signed)


@pytest.mark.parametrize("with_norm", [True, False], ids=["qwen3", "llama"])
@pytest.mark.parametrize("head_dim", [64, 128, 16])
def test_qk_norm_rope_matches_torch_and_leaves_v_alone(with_norm, head_dim):
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), head_dim, max_positions=300)
    tokens, num_q, num_kv = 9, 4, 2
    qkv = randn(tokens, num_q + 2 * num_kv, head_dim, scale=2.0)
    weight = randn(num_q + num_kv, head_dim) if with_norm else None
    positions = torch.tensor([0, 1, 2, 17, 18, 150, 151, 298, 299])
    want = torch_qk_norm_rope(qkv, num_q + num_kv, weight, 1e-6, rotary, positions)
    v_before = qkv[:, num_q + num_kv :].clone()
    dense_ops.qk_norm_rope_(
        qkv, num_q + num_kv, weight, 1e-6, rotary.cos, rotary.sin_signed, positions
    )
    torch.testing.assert_close(qkv[:, : num_q + num_kv], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, num_q + num_kv :], v_before)


def test_silu_and_mul_matches_torch_across_the_exp_range():
    gate_up = randn(6, 2 * 300, scale=4.0)
    gate_up[0, :4] = torch.tensor([-120.0, -90.0, 90.0, 120.0])  # past exp's clamp
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(dense_ops.silu_and_mul(gate_up), F.silu(gate) * up)


def test_bad_arguments_are_refused_before_the_kernel_reads_memory():
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), 16, max_positions=8)
    with pytest.raises(ValueError, match="float32"):
        dense_ops.rms_norm(randn(2, 8).bfloat16(), randn(8), 1e-6)
    with pytest.raises(ValueError, match="weight has shape"):
        dense_ops.rms_norm(randn(2, 8), randn(9), 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        dense_ops.qk_norm_rope_(
            randn(3, 16, 4).transpose(1, 2), 2, None, 0.0, rotary.cos, rotary.sin_signed,
            torch.zeros(3, dtype=torch.int64),
        )  # fmt: skip
    with pytest.raises(ValueError, match="positions must be int64"):
        dense_ops.qk_norm_rope_(
            randn(3, 4, 16), 2, None, 0.0, rotary.cos, rotary.sin_signed, torch.zeros(3)
        )
    with pytest.raises(ValueError, match="norm_weight"):
        dense_ops.qk_norm_rope_(
            randn(3, 4, 16), 2, randn(3, 16), 1e-6, rotary.cos, rotary.sin_signed,
            torch.zeros(3, dtype=torch.int64),
        )  # fmt: skip
    with pytest.raises(ValueError, match="2 \\* intermediate_size"):
        dense_ops.silu_and_mul(randn(2, 7))


def test_rotary_positions_past_the_table_are_an_error():
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), 16, max_positions=8)
    for in_kernel in (True, False):
        with pytest.raises(IndexError, match=r"\[0, 8\)"):
            rotary.for_step(torch.tensor([3, 8]), torch.float32, in_kernel=in_kernel)


PACKED_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8]


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 8, 13, 17, 40, 300])  # tiles of 4 or 8, the rest
@pytest.mark.parametrize("extras", ["plain", "bias", "bias+residual"])
@pytest.mark.parametrize("dtype", PACKED_DTYPES)
def test_linear_on_packed_weights_matches_matmul(rows, extras, dtype):
    # 16-bit weights: the product of the rounded weights, which the kernel widens exactly;
    # int8: of the dequantized ones (q * scale).
    k, n = 96, 160
    wide = randn(rows, k + 5)
    x = wide[:, :k]  # rows k + 5 floats apart
    packed = dense_ops.pack_linear_weight(randn(k, n), dtype)
    bias = randn(n) if "bias" in extras else None
    residual = randn(rows, n) if "residual" in extras else None
    want = x @ dense_ops.unpack_linear_weight(packed)
    if bias is not None:
        want = want + bias
    if residual is not None:
        want = want + residual
    out = dense_ops.linear(x, packed, bias, residual)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
def test_linear_is_batch_invariant(dtype):
    # A row's result is bit for bit the same alone, among a few rows, or in a prefill-sized
    # batch, wherever it falls in a tile. (MKL's GEMM is not: one row alone and the same
    # row among five differ in the last bits, enough to round an FP8 KV entry apart.)
    # Tiles of 4 or 8 rows (AVX-512); 16-bit weights widen in each tile, or from 16 rows on
    # once per block.
    k, n = 576, 1536
    packed = dense_ops.pack_linear_weight(randn(k, n), dtype)
    bias, x, residual = randn(n), randn(300, k), randn(300, n)
    full = dense_ops.linear(x, packed, bias, residual)
    for start, rows in ((0, 1), (0, 2), (5, 6), (7, 17), (100, 200)):
        part = dense_ops.linear(
            x[start : start + rows], packed, bias, residual[start : start + rows]
        )
        assert torch.equal(part, full[start : start + rows]), (start, rows)


def test_packing_round_trips_and_needs_whole_column_blocks():
    weight = randn(7, 64)
    packed = dense_ops.pack_linear_weight(weight)
    assert packed.shape == (2, 7, 32)
    assert torch.equal(dense_ops.unpack_linear_weight(packed), weight)
    with pytest.raises(ValueError, match="blocks of 32"):
        dense_ops.pack_linear_weight(randn(7, 48))


def test_int8_packing_quantizes_each_output_column_to_its_absmax():
    weight = randn(50, 64) * torch.linspace(0.01, 3.0, 64)  # columns of different ranges
    weight[:, 5] = 0.0
    packed = dense_ops.pack_linear_weight(weight, torch.int8)
    assert packed.shape == (2, 50 + dense_ops.INT8_SCALE_ROWS, 32)
    assert packed.dtype == torch.int8  # a quarter of float32's bytes, the scales included
    q, scale = dense_ops.quantize_int8(weight)
    assert torch.equal(scale[5], torch.tensor(1.0))  # an all-zero column: nothing to scale
    assert q.abs().amax(0)[torch.arange(64) != 5].eq(127).all()
    dequantized = dense_ops.unpack_linear_weight(packed)
    assert torch.equal(dequantized, q.float() * scale)
    # Every weight within half a step of its column's grid, and no column shares a scale.
    assert ((dequantized - weight).abs() <= scale / 2 + 1e-7).all()
    assert scale.unique().numel() == 64
    # The kernel uses each column's own scale: a linear by one column picks it out.
    x = torch.zeros(1, 50)
    x[0, 3] = 1.0
    assert torch.allclose(dense_ops.linear(x, packed)[0], dequantized[3], rtol=0, atol=1e-6)


def test_linear_refuses_mismatched_shapes():
    packed = dense_ops.pack_linear_weight(randn(8, 32))
    with pytest.raises(ValueError, match=r"takes \[M, 8\]"):
        dense_ops.linear(randn(2, 9), packed)
    with pytest.raises(ValueError, match="bias has shape"):
        dense_ops.linear(randn(2, 8), packed, randn(31))
    with pytest.raises(ValueError, match="residual has shape"):
        dense_ops.linear(randn(2, 8), packed, None, randn(3, 32))
