"""KV pools under pressure, on real processes (the tiny pair): 32 concurrent requests
whose KV together is three times a service's pool all complete with the output each gives
alone, through preemption; a request larger than a pool is refused at admission alone."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import grpc
import pytest
from e2e_stack import DRAFT, TARGET, running_stack

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently

NUM_REQUESTS, NEW_TOKENS, PAGE_TOKENS = 32, 48, 16
SPEC = '{"num_speculative_tokens": 3}'


def page_bytes(model: str) -> int:
    """Bytes of one float32 KV page of ``model`` (all layers, K and V)."""
    c = json.loads(Path(model, "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * PAGE_TOKENS * c["num_key_value_heads"] * head_dim * 4


def pages_needed(prompts: list[list[int]]) -> int:
    return sum(-(-(len(p) + NEW_TOKENS) // PAGE_TOKENS) for p in prompts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture(scope="module")
def prompts(prompt_ids) -> list[list[int]]:
    return [prompt_ids[i % len(prompt_ids)][: 40 + i] for i in range(NUM_REQUESTS)]


@pytest.fixture(scope="module")
def alone(prompts) -> list[list[int]]:
    """Each request's greedy output run alone, on pools with room to spare."""
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(speculative_config=SPEC) as stack, CoordinatorClient(stack.address) as c:
        return [c.generate(p, params).token_ids for p in prompts]


@pytest.mark.parametrize("short", ["target", "draft"])
def test_requests_three_times_a_pool_all_complete_unchanged_through_preemption(
    short, prompts, alone
):
    model = TARGET if short == "target" else DRAFT
    memory = str(pages_needed(prompts) // 3 * page_bytes(model))
    flag = "kv_cache_memory" if short == "target" else "draft_kv_cache_memory"
    port = free_port()
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with running_stack(
        speculative_config=SPEC,
        max_num_seqs=NUM_REQUESTS,
        metrics_port=port,
        enable_prefix_caching=False,  # every page is its request's own
        **{flag: memory},
    ) as stack:
        _, outs = generate_concurrently(stack.address, prompts, params)
        with CoordinatorClient(stack.address) as client:
            totals = client.totals()
        draft_failures = metric(port, "specdec_num_draft_failures_total")
    assert [o.token_ids for o in outs] == alone
    assert totals.num_preemptions > 0
    assert sum(o.stats["num_preemptions"] for o in outs) == totals.num_preemptions
    assert draft_failures == 0  # no page shortage reads as a dead draft
    assert totals.num_drafts > 0


def test_a_request_larger_than_the_pool_is_refused_at_admission_and_neighbours_run(prompts):
    memory = str(8 * page_bytes(TARGET))  # 128 tokens
    params = GenerateParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    with (
        running_stack(speculative_config=SPEC, kv_cache_memory=memory) as stack,
        CoordinatorClient(stack.address) as client,
    ):
        with pytest.raises(grpc.RpcError) as refused:
            client.generate(prompts[0] * 3, params)
        fits = client.generate(prompts[0][:40], params)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "KV cache holds 128 tokens" in refused.value.details()
    assert len(fits.token_ids) == NEW_TOKENS
