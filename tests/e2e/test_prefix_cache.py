"""Automatic prefix caching on both services, on real processes (the tiny pair): a shared
prefix is computed once, output and proposals do not change with it, and a pool full of
other prefixes never serves a stale block."""

from __future__ import annotations

import pytest
from e2e_stack import TARGET, running_stack, service_info
from test_kv_pressure import PAGE_TOKENS, page_bytes

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently

SPEC = '{"num_speculative_tokens": 3}'
PREFIX_TOKENS, SUFFIX_TOKENS = 1000, 24


@pytest.fixture(scope="module")
def prefix(prompt_ids) -> list[int]:
    ids = [t for p in prompt_ids for t in p]
    assert len(ids) >= PREFIX_TOKENS + 8 * SUFFIX_TOKENS
    return ids[:PREFIX_TOKENS]


def suffixes(prompt_ids, n: int) -> list[list[int]]:
    return [prompt_ids[-1 - i][:SUFFIX_TOKENS] for i in range(n)]


def counters(stack) -> dict[str, tuple[int, int, int]]:
    """(queries, hits, computed tokens) of each service."""
    out = {}
    for name, draft in (("target", False), ("draft", True)):
        info = service_info(stack, draft)
        out[name] = (info.prefix_cache_queries, info.prefix_cache_hits, info.num_computed_tokens)
    return out


def test_a_second_request_sharing_a_long_prefix_computes_one_block_and_its_suffix(
    prefix, prompt_ids
):
    first, second = (prefix + s for s in suffixes(prompt_ids, 2))
    # K = 3 and 8 new tokens: the draft computes each prompt in its prefill step (eager).
    params = GenerateParams(max_tokens=8, ignore_eos=True)
    with running_stack(speculative_config=SPEC) as stack, CoordinatorClient(stack.address) as c:
        c.generate(first, params)
        before = counters(stack)
        out = c.generate(second, params)
        after = counters(stack)
    shared_blocks = PREFIX_TOKENS // PAGE_TOKENS
    for name in ("target", "draft"):
        hits = after[name][1] - before[name][1]
        assert hits >= (shared_blocks - 1) * PAGE_TOKENS, (name, hits)
        assert after[name][0] > before[name][0]
    # The target computed the rest of the prompt, and one token per proposal and step.
    computed = after["target"][2] - before["target"][2]
    decode = out.stats["num_steps"] * 4
    assert computed <= len(second) - (shared_blocks - 1) * PAGE_TOKENS + decode
    assert out.stats["num_cached_tokens"] == after["target"][1] - before["target"][1]


def test_output_and_proposals_are_the_same_with_prefix_caching_on_and_off(prefix, prompt_ids):
    prompts = [prefix[:300] + s for s in suffixes(prompt_ids, 6)]
    params = GenerateParams(max_tokens=32, ignore_eos=True)
    runs = {}
    for caching in (True, False):
        with running_stack(speculative_config=SPEC, enable_prefix_caching=caching) as stack:
            with CoordinatorClient(stack.address) as client:
                client.generate(prompts[0], params)  # the shared prefix is cached, or not
            _, runs[caching] = generate_concurrently(stack.address, prompts, params)
    on, off = runs[True], runs[False]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    # Same proposals: the same drafts, accepted at the same positions.
    keys = ("num_drafts", "num_draft_tokens", "accepted_per_position")
    assert [[o.stats[k] for k in keys] for o in on] == [[o.stats[k] for k in keys] for o in off]
    # Every request found the shared 18 blocks, but one where its chunk was cut.
    assert sum(o.stats["num_cached_tokens"] for o in on) >= 6 * (288 - 16)
    assert sum(o.stats["num_cached_tokens"] for o in off) == 0


def test_a_pool_filled_with_other_prefixes_never_serves_a_stale_block(prefix, prompt_ids):
    """The pool holds ~3 of these prompts: the others evict the first one's blocks (or
    some of them), and asking again gives the same output, computed or cached."""
    memory = str(200 * page_bytes(TARGET))
    params = GenerateParams(max_tokens=16, ignore_eos=True)
    others = [prompt_ids[i][:20] * 40 for i in range(8)]  # 800 tokens each, all different
    with (
        running_stack(speculative_config=SPEC, kv_cache_memory=memory) as stack,
        CoordinatorClient(stack.address) as client,
    ):
        first = client.generate(prefix, params)
        for other in others:
            client.generate(other[:900], params)
        again = client.generate(prefix, params)
    assert again.token_ids == first.token_ids
    assert again.stats["num_cached_tokens"] < PREFIX_TOKENS - PAGE_TOKENS  # evicted, partly
