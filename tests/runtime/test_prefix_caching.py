"""Automatic prefix caching in ModelRunner: what a chunk takes from the cache, what it
still computes, and that the logits are those of a runner that computed every token."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime import KVScaleTable, ModelRunner, SequenceChunk

PAGE_SIZE = 4
PREFIX = [(7 * i + 3) % 256 for i in range(44)]  # 11 blocks
REST = [200, 201, 202, 203, 204, 205]
NUM_LOGITS = 3


def make_runner(path, caching: bool = True, **overrides) -> ModelRunner:
    config = {"num_pages": 64, "page_size": PAGE_SIZE, **overrides}
    return ModelRunner.from_pretrained(path, enable_prefix_caching=caching, **config)


def run(runner: ModelRunner, seq_id: str, tokens: list[int], num_logits: int) -> torch.Tensor:
    runner.open(seq_id)
    return runner.extend([SequenceChunk(seq_id, tokens, num_logits)])[0]


def pieced(path, num_cached: int, **overrides) -> torch.Tensor:
    """B's logits from a runner without caching that computes B as the cache pieces it
    together: the prefix as A's chunk computed it, cut to the ``num_cached`` tokens the
    cache gave, then the rest of B in one chunk. (The C kernels' numbers depend on a
    chunk's row count in the last bits, so this is the run that must agree bit for bit.)"""
    runner = make_runner(path, caching=False, **overrides)
    run(runner, "b", PREFIX, 1)
    runner.truncate("b", num_cached)
    chunk = SequenceChunk("b", (PREFIX + REST)[num_cached:], NUM_LOGITS)
    return runner.extend([chunk])[0]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_shared_prefix_is_computed_once_and_changes_no_logit(qwen3_path, kv_cache_dtype):
    runner = make_runner(qwen3_path, kv_cache_dtype=kv_cache_dtype)
    run(runner, "a", PREFIX, 1)
    assert runner.last_prefix_hits == {"a": 0}
    logits = run(runner, "b", PREFIX + REST, NUM_LOGITS)
    assert runner.last_prefix_hits == {"b": 44}
    assert runner.seq_len("b") == 50
    # A looked up the 10 blocks before its logits token, B the 11 before its 3.
    assert (runner.prefix_cache_queries, runner.prefix_cache_hits) == (40 + 44, 44)
    assert runner.num_computed_tokens == 44 + 6
    assert torch.equal(logits, pieced(qwen3_path, 44, kv_cache_dtype=kv_cache_dtype))


@pytest.mark.parametrize(
    "tokens, num_logits, num_hit",
    [
        (PREFIX, 1, 40),  # the last token is computed: its block is not taken
        (PREFIX, 0, 40),  # ... even with no logits asked for
        (PREFIX, 9, 32),  # every token whose logits are asked for is computed
        (PREFIX[:3], 1, 0),  # no full block before the last token
    ],
)
def test_a_chunk_computes_its_last_token_and_every_token_with_logits(
    qwen3_path, tokens, num_logits, num_hit
):
    runner = make_runner(qwen3_path)
    run(runner, "a", PREFIX + REST, 1)
    run(runner, "b", tokens, num_logits)
    assert runner.last_prefix_hits == {"b": num_hit}
    assert runner.seq_len("b") == len(tokens)


def test_only_a_sequence_on_a_block_boundary_looks_up(qwen3_path):
    runner = make_runner(qwen3_path)
    run(runner, "a", PREFIX + REST, 1)
    run(runner, "b", PREFIX[:2], 1)
    queries = runner.prefix_cache_queries
    runner.extend([SequenceChunk("b", PREFIX[2:], 1)])
    assert runner.last_prefix_hits == {"b": 0} and runner.prefix_cache_queries == queries
    runner.extend([SequenceChunk("b", REST[:2], 1)])  # 46 tokens: on a boundary again
    assert runner.prefix_cache_queries == queries  # ... but a 2-token chunk has no block


def test_a_new_kv_scale_table_finds_no_block_written_under_the_old(qwen3_path):
    runner = make_runner(qwen3_path, kv_cache_dtype="fp8")
    run(runner, "a", PREFIX, 1)
    same_scales = KVScaleTable.ones(runner.num_layers, "fp8", version=2)
    assert same_scales.k_scale == runner.kv_scales.k_scale
    runner.set_kv_scales(same_scales)
    run(runner, "b", PREFIX + REST, NUM_LOGITS)
    assert runner.last_prefix_hits == {"b": 0}
    run(runner, "c", PREFIX + REST, NUM_LOGITS)  # b's blocks, written under version 2
    assert runner.last_prefix_hits == {"c": 44}


def test_a_cut_and_rewritten_block_is_never_served(qwen3_path):
    runner = make_runner(qwen3_path)
    run(runner, "a", PREFIX, 1)
    runner.truncate("a", 42)  # into block 10, which was published
    runner.extend([SequenceChunk("a", [99], 1)])  # overwrites a slot of block 10's page
    logits = run(runner, "b", PREFIX + REST, NUM_LOGITS)
    assert runner.last_prefix_hits == {"b": 40}
    assert torch.equal(logits, pieced(qwen3_path, 40))


def test_eviction_under_pressure_never_serves_a_stale_block(qwen3_path):
    """A's blocks, released, are evicted (its later blocks first) as other prompts fill
    the pool; B then takes what is left of them, and gets the logits of what it took."""
    hits = []
    for num_fills in range(4):
        runner = make_runner(qwen3_path, num_pages=24)
        run(runner, "a", PREFIX, 1)
        runner.release("a")
        for i in range(num_fills):
            other = [(11 * t + 5 * i + 1) % 256 for t in range(40)]
            run(runner, f"fill{i}", other, 1)
            runner.release(f"fill{i}")
        logits = run(runner, "b", PREFIX + REST, NUM_LOGITS)
        hits.append(runner.last_prefix_hits["b"])
        assert torch.equal(logits, pieced(qwen3_path, hits[-1]))
    assert hits == [44, 44, 16, 0]  # every page free, then fewer and fewer of A's left


def test_decode_greedy_publishes_the_tokens_it_keeps(qwen3_path):
    runner = make_runner(qwen3_path)
    if not runner.decodes_greedy_in_c:
        pytest.skip("no C greedy loop here")
    run(runner, "a", PREFIX[:5], 1)
    (picks,) = runner.decode_greedy(["a"], [PREFIX[5]], 8)
    held = PREFIX[:6] + picks[:-1]  # the fed token, then every pick but the last
    assert runner.seq_len("a") == len(held) == 13
    run(runner, "b", [*held, picks[-1]], 1)
    assert runner.last_prefix_hits == {"b": 12}
    assert runner.num_computed_tokens == 5 + 8 + 2


def test_with_prefix_caching_off_nothing_is_looked_up_or_kept(qwen3_path):
    runner = make_runner(qwen3_path, caching=False)
    run(runner, "a", PREFIX, 1)
    run(runner, "b", PREFIX + REST, NUM_LOGITS)
    assert runner.last_prefix_hits == {}
    assert (runner.prefix_cache_queries, runner.prefix_cache_hits) == (0, 0)
    assert runner.num_computed_tokens == 44 + 50
    runner.release("a")
    runner.release("b")
    assert runner.num_free_pages == 64


def test_released_sequences_leave_every_page_free_and_their_blocks_cached(qwen3_path):
    runner = make_runner(qwen3_path)
    run(runner, "a", PREFIX, 1)
    run(runner, "b", PREFIX + REST, NUM_LOGITS)
    runner.release("a")
    runner.release("b")
    assert runner.num_free_pages == 64
    run(runner, "c", PREFIX + REST, NUM_LOGITS)
    assert runner.last_prefix_hits == {"c": 44}
