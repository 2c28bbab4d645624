"""The CPU backend's C kernel: the reference's function, checked on the same float64 oracle."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from specdec.kernels.attention import ReferenceAttentionBackend
from specdec.kernels.attention.cpu_backend import CpuAttentionBackend
from specdec.kernels.fp8 import fp8_max

# As in test_reference_attention: prefill chunk behind a prefix, decode, 1+3 verify, all
# crossing page boundaries; plus a fresh prefill.
MIXED = dict(prefix_lens=[5, 9, 6], query_lens=[7, 1, 4])
DECODE = dict(prefix_lens=[5, 12, 1, 7], query_lens=[1, 1, 1, 1])
FRESH = dict(prefix_lens=[0], query_lens=[11])
SHAPES = {"mixed": MIXED, "decode": DECODE, "fresh": FRESH}
KV_DTYPES = {
    "f32": torch.float32,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}
ALWAYS_NATIVE = 1 << 30


def run(backend, batch) -> tuple[torch.Tensor, float]:
    head_dim = batch.q.shape[2]
    backend.plan(
        batch.meta,
        batch.q.shape[1],
        batch.cache.num_kv_heads,
        head_dim,
        batch.q.dtype,
        batch.cache.dtype,
    )
    sm_scale = 1.0 / math.sqrt(head_dim)
    layer = batch.cache.kv_layers[0]
    return backend.forward(0, batch.q, layer, batch.k_scale, batch.v_scale, sm_scale), sm_scale


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("kv_dtype", KV_DTYPES.values(), ids=KV_DTYPES.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_kernel_matches_float64_attention(ragged_batch, naive, kv_dtype, shape):
    batch = ragged_batch(**shape, kv_dtype=kv_dtype)
    backend = CpuAttentionBackend(native_max_rows=ALWAYS_NATIVE)
    out, sm_scale = run(backend, batch)
    assert backend.uses_native_kernel
    assert out.shape == batch.q.shape and out.dtype == torch.float32
    # FP8 pages against attention over the dequantised values, with both scales != 1.
    assert rel_l2(out, naive(batch, sm_scale, quantised=True)) < 1e-5


@pytest.mark.parametrize(
    ("head_dim", "page_size"),
    [(64, 16), (128, 4), (40, 32), (64, 5)],
    ids=["d64-p16", "d128-p4", "d40-p32", "d64-p5"],
)
def test_kernel_head_and_page_sizes(ragged_batch, naive, head_dim, page_size):
    # 64 and 128 have their own compiled variants; 40 takes the generic one. Pages of
    # 32 hold two blocks of 16 keys, pages of 5 a partial one.
    batch = ragged_batch(
        prefix_lens=[37, 70, 3], query_lens=[3, 1, 6], head_dim=head_dim, page_size=page_size
    )
    out, sm_scale = run(CpuAttentionBackend(native_max_rows=ALWAYS_NATIVE), batch)
    assert rel_l2(out, naive(batch, sm_scale)) < 1e-5


def test_first_query_of_fresh_prefill_returns_its_own_value(ragged_batch):
    batch = ragged_batch(prefix_lens=[0], query_lens=[3], num_qo_heads=2, num_kv_heads=2)
    out, _ = run(CpuAttentionBackend(native_max_rows=ALWAYS_NATIVE), batch)
    torch.testing.assert_close(out[0], batch.v["s0"][0], rtol=0, atol=1e-6)


def test_bf16_cache_and_queries_give_the_reference_result(ragged_batch):
    batch = ragged_batch(**MIXED, kv_dtype=torch.bfloat16, q_dtype=torch.bfloat16)
    out, _ = run(CpuAttentionBackend(native_max_rows=ALWAYS_NATIVE), batch)
    ref, _ = run(ReferenceAttentionBackend(), batch)
    assert out.dtype == torch.bfloat16
    # Same float32 math on the same bf16 values; only the final bf16 rounding may differ.
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=8e-3)


def test_short_segments_take_the_kernel_long_ones_the_reference(ragged_batch, naive):
    backend = CpuAttentionBackend()  # group 3 here: a 13-token segment is 39 rows > 36
    decode = ragged_batch(**DECODE)
    out, sm_scale = run(backend, decode)
    assert backend.uses_native_kernel
    assert rel_l2(out, naive(decode, sm_scale)) < 1e-5
    long = ragged_batch(prefix_lens=[5, 9], query_lens=[13, 1])
    out, sm_scale = run(backend, long)
    assert not backend.uses_native_kernel
    torch.testing.assert_close(out, run(ReferenceAttentionBackend(), long)[0], rtol=0, atol=0)


@pytest.mark.parametrize("kv_dtype", list(KV_DTYPES.values())[1:], ids=["e4m3", "e5m2"])
def test_saturated_fp8_pages_give_finite_output(ragged_batch, kv_dtype):
    batch = ragged_batch(**DECODE, kv_dtype=kv_dtype)
    huge = torch.full((1, 2, 16), 10 * fp8_max(kv_dtype))
    rows = batch.cache.slot_rows(batch.meta.slot_mapping[:1])
    batch.cache.write(0, rows, huge, -huge, 1.0, 1.0)
    out, _ = run(CpuAttentionBackend(native_max_rows=ALWAYS_NATIVE), batch)
    assert torch.isfinite(out).all()


def test_bad_calls_are_refused_before_the_kernel_reads_memory(ragged_batch):
    batch = ragged_batch(**DECODE)
    backend = CpuAttentionBackend()
    layer = batch.cache.kv_layers[0]
    with pytest.raises(RuntimeError, match="before plan"):
        backend.forward(0, batch.q, layer, 1.0, 1.0, 0.25)
    run(backend, batch)
    with pytest.raises(ValueError, match="q has shape"):
        backend.forward(0, batch.q[:2], layer, 1.0, 1.0, 0.25)
    with pytest.raises(ValueError, match="does not hold the planned pages"):
        backend.forward(0, batch.q, layer[:1], 1.0, 1.0, 0.25)
    with pytest.raises(ValueError, match="contiguous torch.float32"):
        backend.forward(0, batch.q, layer.to(torch.bfloat16), 1.0, 1.0, 0.25)
    with pytest.raises(ValueError, match="cannot read"):
        backend.plan(batch.meta, 6, 2, 16, torch.float32, torch.float16)
    short_table = dataclasses.replace(batch.meta, kv_lens=(99, *batch.meta.kv_lens[1:]))
    with pytest.raises(ValueError, match="inconsistent"):
        backend.plan(short_table, 6, 2, 16, torch.float32, torch.float32)
