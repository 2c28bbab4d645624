"""A seed reproduces sampled speculative output exactly: across runs, batchings (under a
K schedule too) and a draft rebuilt from the committed log in the middle of the request."""

from __future__ import annotations

import pytest
from e2e_stack import running_stack

from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently
from specdec.coordinator.engine.config import DEFAULT_SPECULATIVE_CONFIG

SPEC_CONFIG = '{"num_speculative_tokens": 3}'
SEEDS = range(8)


def params(seed: int | None) -> GenerateParams:
    return GenerateParams(max_tokens=32, temperature=0.9, top_k=20, seed=seed, ignore_eos=True)


def together(address: str, prompts: list) -> list[list[int]]:
    _, outs = generate_concurrently(address, prompts, [params(s) for s in SEEDS])
    return [o.token_ids for o in outs]


def one_at_a_time(address: str, prompts: list, seeds=SEEDS) -> list[list[int]]:
    with CoordinatorClient(address) as client:
        pairs = zip(prompts, seeds, strict=True)
        return [client.generate(p, params(s)).token_ids for p, s in pairs]


@pytest.fixture(scope="module")
def prompts(prompt_ids):
    return [prompt_ids[i % 4] for i in SEEDS]


@pytest.fixture(scope="module")
def reference(prompts):
    with running_stack(speculative_config=SPEC_CONFIG) as stack:
        first = together(stack.address, prompts)
        _, unseeded = generate_concurrently(stack.address, [prompts[0]] * 4, params(None))
        return (
            first,
            together(stack.address, prompts),
            one_at_a_time(stack.address, prompts),
            [o.token_ids for o in unseeded],
        )


def test_a_seed_reproduces_output_across_runs_and_batchings(reference):
    first, again, alone, _ = reference
    assert again == first
    assert alone == first
    assert len({tuple(t) for t in first}) == len(first)  # different seeds, different output


def test_a_seed_reproduces_output_when_the_draft_is_rebuilt_from_the_log_every_step(
    reference, prompts
):
    # The draft drops each sequence and re-ingests it from 0 before every proposal: what a
    # restarted or replaced draft does once the coordinator re-syncs it.
    config = dict(speculative_config=SPEC_CONFIG, draft_rebuild_every_step=True)
    with running_stack(**config) as stack:
        rebuilt = together(stack.address, prompts)
        stats = generate_concurrently(stack.address, prompts[:1], [params(0)])[1][0].stats
    assert rebuilt == reference[0]
    assert stats["num_drafts"] > 0 and stats["num_ingest_plans"] >= stats["num_drafts"]


def test_unseeded_requests_draw_fresh_entropy(reference):
    unseeded = reference[3]
    assert len({tuple(t) for t in unseeded}) == len(unseeded)


def test_a_seeded_request_gives_the_same_tokens_beside_eight_others_under_the_k_schedule(
    prompt_ids,
):
    # The default schedule drafts K = 6 alone, 4 beside one other and none from three on:
    # a seeded request keeps its batch-size-1 K, so the crowd does not change its tokens.
    seeds = range(20)
    prompts = [prompt_ids[i % len(prompt_ids)] for i in seeds]
    neighbours = GenerateParams(max_tokens=32, temperature=0.9, ignore_eos=True)
    with running_stack(speculative_config=DEFAULT_SPECULATIVE_CONFIG) as stack:
        alone = one_at_a_time(stack.address, prompts, seeds)
        crowded = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            crowd = [prompt] + [prompt_ids[(seed + j) % len(prompt_ids)] for j in range(1, 9)]
            _, outs = generate_concurrently(stack.address, crowd, [params(seed)] + [neighbours] * 8)
            crowded.append(outs[0].token_ids)
    assert crowded == alone
    assert len({tuple(t) for t in alone}) == len(alone)
