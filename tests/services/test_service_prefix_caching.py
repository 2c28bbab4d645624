"""Prefix caching at the services: the target reports the prompt tokens it took from its
cache and its free pages; the draft proposes exactly as it does with caching off."""

from __future__ import annotations

import pytest
from service_testing import NUM_PAGES, PAGE_SIZE, chunk, entry, greedy_decode, verify

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.server import create_server as create_draft_server
from specdec.draft_service.steps import DraftStep, IngestPlan, ProposeEntry
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2

SHARED = [17, 203, 5, 88, 140, 61, 9, 230, 44, 101, 12, 7]  # 3 blocks of PAGE_SIZE
FIRST = [*SHARED, 150, 33, 64, 2, 91]
SECOND = [*SHARED, 180, 55, 23, 96, 3, 250]


def test_the_target_reports_the_prompt_tokens_its_cache_gave_and_its_free_pages(
    target, make_runner
):
    server, stub = target
    response = stub.Verify(target_pb2.VerifyRequest(prefill=[chunk("r1", 0, FIRST, True)]))
    assert response.results[0].num_prefix_cached_tokens == 0
    assert response.num_free_pages == NUM_PAGES - 5  # 17 tokens
    response = stub.Verify(target_pb2.VerifyRequest(prefill=[chunk("r2", 0, SECOND, True)]))
    (result,) = response.results
    assert result.num_prefix_cached_tokens == len(SHARED)
    assert result.num_cached_tokens == len(SECOND)
    assert list(result.token_ids) == greedy_decode(make_runner(), SECOND, 1)
    assert response.num_free_pages == NUM_PAGES - 5 - 2  # r2 took 3 of r1's 5 pages
    assert response.num_free_pages == server.runner.num_free_pages
    info = stub.GetInfo(common_pb2.InfoRequest())
    assert info.prefix_caching
    # Each looked up the 4 blocks before its last token; r2 found the first 3.
    assert (info.prefix_cache_queries, info.prefix_cache_hits) == (16 + 16, 12)
    assert info.num_computed_tokens == len(FIRST) + len(SECOND) - 12


def test_the_target_reports_free_pages_after_a_multi_step_burst(target):
    server, stub = target
    (first,) = verify(stub, [chunk("r1", 0, FIRST, True)])
    request = target_pb2.VerifyRequest(
        decode=[entry("r1", len(FIRST), first.token_ids[0], [])], num_steps=6
    )
    response = stub.Verify(request)
    assert len(response.results[0].token_ids) == 6
    assert server.runner.seq_len("r1") == len(FIRST) + 6
    assert response.num_free_pages == server.runner.num_free_pages == NUM_PAGES - 6


def proposals_over_a_few_steps(drafter: Drafter) -> list[list[int]]:
    """Two requests sharing SHARED: ingested with proposals, a K = 0 stretch (lazy), then
    commits of part of each proposal and a correction, proposing again each time."""
    log = {"a": [], "b": []}
    out = []

    def step(commits: dict[str, list[int]], k: int) -> None:
        plans = tuple(IngestPlan(r, len(log[r]), tuple(t)) for r, t in commits.items())
        propose = tuple(ProposeEntry(r, k) for r in commits) if k else ()
        result = drafter.step(DraftStep(ingest=plans, propose=propose))
        assert not result.failed
        for r, tokens in commits.items():
            log[r] += tokens
        out.extend(p.token_ids for p in result.proposals)

    step({"a": FIRST}, 3)
    step({"b": SECOND}, 3)
    step({"a": [out[0][0], 77], "b": [5]}, 0)
    for round_ in range(3):
        step({r: [out[-2 + i][0], 40 + round_] for i, r in enumerate("ab")}, 3)
        step({r: out[-2 + i][:2] for i, r in enumerate("ab")}, 2)
    return out


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_draft_proposals_are_the_same_with_prefix_caching_on_and_off(make_runner, kv_cache_dtype):
    def drafter(caching: bool) -> Drafter:
        runner = make_runner(kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=caching)
        return Drafter(runner)

    on = drafter(True)
    got = proposals_over_a_few_steps(on)
    assert got == proposals_over_a_few_steps(drafter(False))
    assert len(got) == 14 and on.runner.prefix_cache_hits >= len(SHARED)


@pytest.mark.parametrize("prompt", [SHARED, [*SHARED, 1, 2, 3, 4]], ids=["same", "longer"])
def test_a_whole_block_prompt_computed_ahead_still_proposes_when_shared(make_runner, prompt):
    """A prompt of whole blocks ingested eagerly, then proposed for with nothing new: the
    draft feeds its last committed token again (cutting into its last block). Another
    request with the same prompt takes all but that block from the cache; one with a
    longer prompt takes that block too, and the cut gives the cutter a copy of it."""
    runner = make_runner(kv_cache_dtype="auto")
    drafter = Drafter(runner)
    drafter.step(DraftStep(ingest=(IngestPlan("x", 0, tuple(SHARED), eager=True),)))
    drafter.step(DraftStep(ingest=(IngestPlan("y", 0, tuple(prompt), eager=True),)))
    assert runner.last_prefix_hits == {"y": 8 if prompt == SHARED else 12}
    result = drafter.step(DraftStep(propose=(ProposeEntry("x", 3), ProposeEntry("y", 3))))
    assert not result.failed
    x, y = result.proposals
    reference = make_runner(kv_cache_dtype="auto", enable_prefix_caching=False)
    assert x.token_ids == greedy_decode(reference, SHARED, 3)
    assert y.token_ids == greedy_decode(reference, prompt, 3)


def test_the_draft_reports_free_pages_less_those_pending_tokens_will_take(start_server):
    server = start_server(create_draft_server)
    stub = draft_pb2_grpc.DraftServiceStub(server.channel)

    def ingest_lazily(rid: str, tokens: list[int]) -> draft_pb2.DraftStepResponse:
        plan = draft_pb2.IngestPlan(request_id=rid, start_position=0, token_ids=tokens)
        return stub.Step(draft_pb2.DraftStepRequest(ingest=[plan]))

    response = ingest_lazily("r1", FIRST)  # 17 tokens, no forward yet
    assert server.runner.num_free_pages == NUM_PAGES
    assert response.num_free_pages == NUM_PAGES - (len(FIRST) + PAGE_SIZE - 1) // PAGE_SIZE
    response = ingest_lazily("r2", [t % 256 for t in range(300)])  # 75 pages; 59 are left
    assert response.num_free_pages == 0
