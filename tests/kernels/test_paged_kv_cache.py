"""Page bookkeeping of the paged KV cache and its FlashInfer page-table layout."""

from __future__ import annotations

import pytest
import torch

from specdec.kernels.fp8 import dequantize_fp8, fp8_max, quantize_fp8, resolve_kv_cache_dtype
from specdec.kernels.paged_kv_cache import OutOfPagesError, PageAllocator, PagedKVCache


def make_cache(num_pages: int = 8, page_size: int = 4, dtype=torch.float32) -> PagedKVCache:
    return PagedKVCache(2, num_pages, page_size, num_kv_heads=2, head_dim=3, dtype=dtype)


def test_kv_layers_use_flashinfer_nhd_shape_and_storage_dtype():
    cache = make_cache(dtype=torch.float8_e4m3fn)
    assert len(cache.kv_layers) == 2
    assert cache.kv_layers[0].shape == (8, 2, 4, 2, 3)
    assert cache.kv_layers[1].dtype == torch.float8_e4m3fn


def test_reserve_returns_slots_across_pages_in_batch_order():
    cache = make_cache()
    cache.open("a")
    cache.open("b")
    slots = cache.reserve(["a", "b"], [5, 2])
    # a gets pages 0, 1 (5 tokens); b gets page 2.
    assert cache.page_table("a") == [0, 1] and cache.page_table("b") == [2]
    assert slots.dtype == torch.int64
    assert slots.tolist() == [0, 1, 2, 3, 4, 8, 9]
    slots = cache.reserve(["b", "a"], [3, 1])
    # b fills page 2 then opens page 3; a continues in page 1.
    assert slots.tolist() == [10, 11, 12, 5]
    assert cache.seq_len("a") == 6 and cache.seq_len("b") == 5
    assert cache.num_free_pages == 4


def test_write_stores_k_and_v_at_their_slots():
    cache = make_cache()
    cache.open("a")
    slots = cache.reserve(["a"], [6])
    k = torch.arange(6 * 6, dtype=torch.float32).view(6, 2, 3)
    cache.write(1, cache.slot_rows(slots), k, -k)
    layer = cache.kv_layers[1]
    torch.testing.assert_close(layer[0, 0], k[:4])  # page 0, K
    torch.testing.assert_close(layer[1, 0, :2], k[4:])  # page 1, K
    torch.testing.assert_close(layer[1, 1, :2], -k[4:])  # page 1, V
    assert not cache.kv_layers[0].any()  # other layers untouched


@pytest.mark.parametrize("c_copy", [True, False], ids=["c-copy", "index-copy"])
def test_write_takes_token_rows_of_strided_k_and_v(c_copy):
    cache = make_cache()
    assert cache.use_cpu_kernels(c_copy) == c_copy  # float32 on the CPU with a compiler
    cache.open("a")
    slots = cache.reserve(["a"], [5])
    qkv = torch.randn(5, 6, 3)  # as the model's packed projection: q, k, v heads per token
    k, v = qkv[:, 2:4], qkv[:, 4:6]
    cache.write(0, cache.slot_rows(slots), k, v)
    layer = cache.kv_layers[0]
    assert torch.equal(layer[0, 0], k[:4]) and torch.equal(layer[1, 0, :1], k[4:])
    assert torch.equal(layer[0, 1], v[:4]) and torch.equal(layer[1, 1, :1], v[4:])
    assert not layer[2:].any()


def test_write_refuses_slots_outside_the_cache_and_miscounted_rows():
    assert not make_cache().slot_rows(torch.tensor([0])).checked  # PyTorch writes check
    cache = make_cache()
    assert cache.use_cpu_kernels(True)  # the C copy trusts slot_rows' check
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 32\)"):
        cache.slot_rows(torch.tensor([3, 32]))
    rows = cache.slot_rows(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="2 slots given for 3 tokens"):
        cache.write(0, rows, torch.zeros(3, 2, 3), torch.zeros(3, 2, 3))


def test_fp8_write_quantises_with_the_layer_scales():
    cache = make_cache(dtype=torch.float8_e4m3fn)
    cache.open("a")
    slots = cache.reserve(["a"], [2])
    k = torch.tensor([0.5, -1.0, 2.0]).repeat(2, 2, 1)
    cache.write(0, cache.slot_rows(slots), k, 4 * k, k_scale=0.5, v_scale=2.0)
    stored_k = cache.kv_layers[0][0, 0, :2]
    stored_v = cache.kv_layers[0][0, 1, :2]
    torch.testing.assert_close(stored_k.float(), k / 0.5)
    torch.testing.assert_close(dequantize_fp8(stored_v, 2.0), 4 * k)


def test_truncate_frees_trailing_pages_and_keeps_prefix():
    cache = make_cache()
    cache.open("a")
    cache.reserve(["a"], [10])
    assert cache.page_table("a") == [0, 1, 2]
    cache.truncate("a", 5)
    assert cache.seq_len("a") == 5 and cache.page_table("a") == [0, 1]
    assert cache.num_free_pages == 6
    cache.truncate("a", 4)  # page boundary: page 1 is no longer needed
    assert cache.page_table("a") == [0]
    with pytest.raises(ValueError, match="holds 4"):
        cache.truncate("a", 5)


def test_freed_pages_are_reused():
    cache = make_cache(num_pages=3)
    cache.open("a")
    cache.reserve(["a"], [12])
    pages = cache.page_table("a")
    cache.free("a")
    assert not cache.has("a") and cache.num_free_pages == 3
    cache.open("b")
    cache.reserve(["b"], [12])
    assert sorted(cache.page_table("b")) == sorted(pages)


def test_out_of_pages_leaves_every_sequence_unchanged():
    cache = make_cache(num_pages=4)
    cache.open("a")
    cache.open("b")
    cache.reserve(["a", "b"], [3, 4])
    before = (cache.page_table("a"), cache.page_table("b"), cache.num_free_pages)
    with pytest.raises(OutOfPagesError) as err:
        cache.reserve(["a", "b"], [6, 9])  # a needs 2 more pages, b 3 more: 5 > 2 free
    assert err.value.num_needed == 5 and err.value.num_free == 2
    assert "free" in str(err.value) and "pages" in str(err.value)
    after = (cache.page_table("a"), cache.page_table("b"), cache.num_free_pages)
    assert after == before
    assert cache.seq_len("a") == 3 and cache.seq_len("b") == 4


def test_unknown_and_duplicate_sequences_are_refused():
    cache = make_cache()
    cache.open("a")
    with pytest.raises(ValueError, match="already open"):
        cache.open("a")
    with pytest.raises(KeyError, match="zzz"):
        cache.reserve(["a", "zzz"], [1, 1])
    assert cache.seq_len("a") == 0 and cache.num_free_pages == 8


def test_flashinfer_layout_on_hand_checked_example():
    cache = make_cache()
    for s in ("a", "b", "c"):
        cache.open(s)
    cache.reserve(["a", "b"], [5, 4])  # a: pages 0, 1; b: page 2
    cache.reserve(["c", "a"], [1, 4])  # c: page 3; a: 9 tokens -> page 4
    indptr, indices, last = cache.flashinfer_layout(["a", "b", "c"])
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.tolist() == [0, 3, 4, 5]
    assert indices.tolist() == [0, 1, 4, 2, 3]
    assert last.tolist() == [1, 4, 1]


def test_page_allocator_is_all_or_nothing_and_refuses_double_free():
    alloc = PageAllocator(3)
    pages = alloc.allocate(2)
    with pytest.raises(OutOfPagesError):
        alloc.allocate(2)
    assert alloc.num_free == 1
    alloc.free(pages)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(pages[:1])
    assert alloc.num_free == 3


def test_kv_cache_dtype_flag_resolves_like_vllm():
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.float32) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2
    with pytest.raises(ValueError, match="auto, fp8, fp8_e4m3, fp8_e5m2"):
        resolve_kv_cache_dtype("int8", torch.float32)
    assert fp8_max(torch.float8_e4m3fn) == 448.0 and fp8_max(torch.float8_e5m2) == 57344.0


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_saturates_out_of_range_values(dtype):
    x = torch.tensor([1e9, -1e9, 3.0, float(fp8_max(dtype))])
    x8 = quantize_fp8(x, 1.0, dtype)
    assert x8.dtype == dtype
    back = dequantize_fp8(x8, 1.0)
    assert not torch.isnan(back).any()
    assert back.tolist() == [fp8_max(dtype), -fp8_max(dtype), 3.0, fp8_max(dtype)]


# ---- shared and published pages (prefix caching) ---------------------------------------


def filled(cache: PagedKVCache, seq_id: str, num_tokens: int, value: float) -> None:
    """Open ``seq_id`` with ``num_tokens`` tokens whose K and V are all ``value``."""
    cache.open(seq_id)
    rows = cache.slot_rows(cache.reserve([seq_id], [num_tokens]))
    kv = torch.full((num_tokens, cache.num_kv_heads, cache.head_dim), value)
    for layer in range(cache.num_layers):
        cache.write(layer, rows, kv, kv)


def test_attach_shares_full_pages_and_needs_a_page_boundary():
    cache = make_cache()
    filled(cache, "a", 8, 1.0)
    cache.open("b")
    cache.attach("b", cache.page_table("a"))
    assert cache.page_table("b") == cache.page_table("a") and cache.seq_len("b") == 8
    cache.free("a")
    assert cache.num_free_pages == 6  # b still holds both pages
    cache.reserve(["b"], [1])
    with pytest.raises(ValueError, match="inside a page"):
        cache.attach("b", [5])
    assert cache.seq_len("b") == 9


def test_published_pages_of_a_freed_sequence_stay_findable_until_evicted():
    cache = make_cache(num_pages=2)
    filled(cache, "a", 8, 1.0)
    cache.publish("a", 0, "block0")
    page = cache.page_table("a")[0]
    with pytest.raises(ValueError, match="not full"):
        cache.publish("a", 2, "block2")
    cache.free("a")
    assert cache.lookup("block0") == page and cache.num_free_pages == 2
    filled(cache, "b", 8, 2.0)  # needs every page: evicts the cached one
    assert cache.lookup("block0") is None


def test_a_cut_into_a_published_page_unpublishes_it():
    cache = make_cache()
    filled(cache, "a", 8, 1.0)
    cache.publish("a", 0, "block0")
    cache.publish("a", 1, "block1")
    cache.truncate("a", 6)  # page 1 will be written again
    assert cache.lookup("block1") is None and cache.lookup("block0") is not None
    cache.truncate("a", 4)  # a page boundary: page 0 stays whole, and published
    assert cache.lookup("block0") == cache.page_table("a")[0]


def test_a_cut_into_a_page_another_sequence_holds_gives_the_cutter_a_copy():
    cache = make_cache()
    filled(cache, "a", 8, 1.0)
    cache.publish("a", 1, "block1")
    shared = cache.page_table("a")[1]
    cache.open("b")
    cache.attach("b", cache.page_table("a"))
    cache.truncate("b", 6)
    copy = cache.page_table("b")[1]
    assert copy != shared and cache.lookup("block1") == shared
    for layer in cache.kv_layers:
        assert torch.equal(layer[copy], layer[shared])
    # b writes on into its copy; a's page, and what the cache serves, are untouched.
    rows = cache.slot_rows(cache.reserve(["b"], [2]))
    kv = torch.full((2, cache.num_kv_heads, cache.head_dim), 9.0)
    cache.write(0, rows, kv, kv)
    assert bool((cache.kv_layers[0][shared] == 1.0).all())
    cache.free("a")
    cache.free("b")
    assert cache.num_free_pages == 8


def test_a_copy_that_finds_no_free_page_changes_nothing():
    cache = make_cache(num_pages=2)
    filled(cache, "a", 8, 1.0)
    cache.open("b")
    cache.attach("b", cache.page_table("a"))
    with pytest.raises(OutOfPagesError):
        cache.truncate("b", 6)
    assert cache.seq_len("b") == 8 and cache.page_table("b") == cache.page_table("a")
