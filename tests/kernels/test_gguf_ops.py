"""GGUF block-format linears against ``gguf.quants.dequantize`` and a float64 matmul, on every
instruction set this CPU has; batch invariance per format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from specdec.kernels import dense_ops, gguf_ops
from specdec.kernels.gguf_ops import BLOCK_LAYOUT, GGMLType, GGUFPart, GGUFWeight

pytestmark = pytest.mark.skipif(not dense_ops.library_loads(), reason="no C compiler here")

QUANTIZED = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q5_K,
             GGMLType.Q6_K]  # fmt: skip
FLOATS = [GGMLType.F32, GGMLType.F16, GGMLType.BF16]
# Where each block type keeps its float16 scales (random bits there could be inf / NaN).
SCALE_OFFSETS = {
    GGMLType.Q8_0: (0,),
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
}
ROW_COUNTS = [*range(1, 17), 64]


def random_part(ggml_type: GGMLType, rows: int, cols: int, seed: int) -> GGUFPart:
    """``rows`` rows of random blocks (every bit pattern a format allows) with finite,
    moderate scales; float types hold random normals."""
    rng = np.random.default_rng(seed)
    if ggml_type in FLOATS:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        if ggml_type == GGMLType.F32:
            data = values.view(np.uint8)
        elif ggml_type == GGMLType.F16:
            data = values.astype(np.float16).view(np.uint8)
        else:  # bfloat16: float32's top half
            data = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return GGUFPart(ggml_type, torch.from_numpy(np.ascontiguousarray(data)))
    block, nbytes = BLOCK_LAYOUT[ggml_type]
    blocks = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[ggml_type]:
        scale = rng.uniform(-0.02, 0.02, (rows, cols // block)).astype(np.float16)
        blocks[..., offset : offset + 2] = scale[..., None].view(np.uint8)
    return GGUFPart(ggml_type, torch.from_numpy(blocks.reshape(rows, -1)))


def reference(part: GGUFPart) -> np.ndarray:
    """``gguf.quants.dequantize`` (llama.cpp's Python reference), float64 ``[rows, cols]``."""
    if part.ggml_type == GGMLType.BF16:
        bits = part.data.numpy().view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return dequantize(part.data.numpy(), int(part.ggml_type)).astype(np.float64)


def width(ggml_type: GGMLType) -> int:
    return 512 if BLOCK_LAYOUT[ggml_type][0] == 256 else 96


@pytest.fixture(params=list(gguf_ops.ISAS))
def isa(request):
    """Each instruction set; one this CPU lacks is skipped with the reason."""
    effective = gguf_ops.set_isa(request.param)
    if effective != request.param:
        gguf_ops.set_isa(None)
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    gguf_ops.set_isa(None)


def assert_close_to_float64(y: torch.Tensor, x: torch.Tensor, w: np.ndarray) -> None:
    """``y`` is ``x @ w.T`` up to float32 summation order: within 1e-5 of ``|x| @ |w|.T``."""
    x64 = x.double().numpy()
    expected = x64 @ w.T
    bound = 1e-5 * (np.abs(x64) @ np.abs(w).T) + 1e-7
    error = np.abs(y.double().numpy() - expected)
    assert (error <= bound).all(), f"max error {error.max():.3g}, bound there {bound.max():.3g}"


@pytest.mark.parametrize("ggml_type", QUANTIZED + FLOATS, ids=lambda t: t.name)
def test_dequantized_rows_equal_gguf_reference(ggml_type, isa):
    part = random_part(ggml_type, 7, width(ggml_type), seed=1)
    weight = GGUFWeight(width(ggml_type), [part])
    rows = weight.rows(torch.tensor([6, 0, 3, 3]))
    expected = reference(part)[[6, 0, 3, 3]]
    np.testing.assert_array_equal(rows.double().numpy(), expected)


@pytest.mark.parametrize("ggml_type", QUANTIZED + FLOATS, ids=lambda t: t.name)
def test_linear_matches_dequantize_and_float64_matmul(ggml_type, isa):
    cols = width(ggml_type)
    part = random_part(ggml_type, 37, cols, seed=2)  # odd: pairs of rows and a lone one
    weight = GGUFWeight(cols, [part])
    w = reference(part)
    torch.manual_seed(0)
    for m in ROW_COUNTS:
        x = torch.randn(m, cols)
        assert_close_to_float64(gguf_ops.linear(x, weight), x, w)


@pytest.mark.parametrize(
    "ggml_type", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1], ids=lambda t: t.name
)
def test_rows_longer_than_one_pass_of_block_scales(ggml_type, isa):
    """83 blocks a row: the kernels widen 64 blocks' scales ahead of a pass, 16 a gather,
    so this row crosses a pass and ends in a partial gather."""
    cols = 83 * 32
    part = random_part(ggml_type, 5, cols, seed=7)
    weight = GGUFWeight(cols, [part])
    w = reference(part)
    np.testing.assert_array_equal(weight.rows(torch.tensor([4, 1])).double().numpy(), w[[4, 1]])
    torch.manual_seed(2)
    for m in (1, 2, 5, 9):
        x = torch.randn(m, cols)
        assert_close_to_float64(gguf_ops.linear(x, weight), x, w)


@pytest.mark.parametrize("cols", [1, 40, 100])
def test_float_rows_of_any_width(cols, isa):
    part = random_part(GGMLType.F16, 5, cols, seed=3)
    x = torch.randn(3, cols)
    assert_close_to_float64(gguf_ops.linear(x, GGUFWeight(cols, [part])), x, reference(part))


def test_parts_of_different_types_stack_along_the_output_rows(isa):
    # A Q4_K_M file's q, k and v: v in Q6_K.
    parts = [random_part(t, n, 256, seed=i) for i, (t, n) in
             enumerate([(GGMLType.Q4_K, 8), (GGMLType.Q4_K, 3), (GGMLType.Q6_K, 3)])]  # fmt: skip
    weight = GGUFWeight(256, parts)
    w = np.concatenate([reference(p) for p in parts])
    bias, residual = torch.randn(14), torch.randn(5, 14)
    x = torch.randn(5, 256)
    y = gguf_ops.linear(x, weight, bias, residual)
    assert_close_to_float64(y - bias - residual, x, w)
    assert torch.equal(weight.dequantize(), torch.from_numpy(w).float())


@pytest.mark.parametrize("ggml_type", QUANTIZED + FLOATS, ids=lambda t: t.name)
def test_each_row_is_the_same_alone_and_in_any_batch(ggml_type, isa):
    """Batch invariance: a row's output bits do not depend on the rows beside it."""
    cols = width(ggml_type)
    weight = GGUFWeight(cols, [random_part(ggml_type, 33, cols, seed=4)])
    torch.manual_seed(1)
    x = torch.randn(64, cols)
    alone = torch.cat([gguf_ops.linear(x[i : i + 1], weight) for i in range(64)])
    for m in ROW_COUNTS:
        assert torch.equal(gguf_ops.linear(x[:m], weight), alone[:m]), f"{m} rows"


def test_avx2_and_avx512_give_the_same_bits():
    have = [isa for isa in ("avx2", "avx512") if gguf_ops.set_isa(isa) == isa]
    gguf_ops.set_isa(None)
    if len(have) < 2:
        pytest.skip("this CPU lacks AVX2 or AVX-512")
    weight = GGUFWeight(512, [random_part(GGMLType.Q4_K, 9, 512, seed=5)])
    x = torch.randn(11, 512)
    outputs = []
    for isa in have:
        gguf_ops.set_isa(isa)
        outputs.append(gguf_ops.linear(x, weight))
    gguf_ops.set_isa(None)
    assert torch.equal(*outputs)


def test_weights_that_do_not_fit_their_type_are_refused():
    part = random_part(GGMLType.Q4_K, 2, 256, seed=6)
    with pytest.raises(ValueError, match="blocks of 256 values; 96 is not a multiple"):
        GGUFWeight(96, [part])
    with pytest.raises(ValueError, match=r"must be uint8 \[rows, 144\]"):
        GGUFWeight(256, [GGUFPart(GGMLType.Q4_K, part.data[:, :100].contiguous())])
    with pytest.raises(gguf_ops.UnsupportedGGMLType, match="GGML type 6 is not supported"):
        gguf_ops.row_bytes(6, 256)  # Q5_0
    weight = GGUFWeight(256, [part])
    with pytest.raises(ValueError, match=r"x has shape \(1, 255\), expected \(1, 256\)"):
        gguf_ops.linear(torch.randn(1, 255), weight)
    with pytest.raises(IndexError, match=r"row ids must lie in \[0, 2\)"):
        weight.rows(torch.tensor([2]))
