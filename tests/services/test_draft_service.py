"""DraftService over real gRPC: ingest, propose, re-sync rules, KV-scale versions."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from service_testing import NUM_PAGES, greedy_decode, status_of

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.server import create_server
from specdec.draft_service.servicer import DraftServicer
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

PROMPT = [17, 203, 5, 88, 140, 61, 9, 230, 44, 101, 12]
OTHER = [3, 250, 77, 18, 96]
VOCAB = 256


@pytest.fixture
def draft(start_server):
    server = start_server(create_server)
    return server, draft_pb2_grpc.DraftServiceStub(server.channel)


def ingest(rid: str, start: int, tokens: list[int]) -> draft_pb2.IngestPlan:
    return draft_pb2.IngestPlan(request_id=rid, start_position=start, token_ids=tokens)


def propose(rid: str, k: int, **sampling) -> draft_pb2.ProposeEntry:
    params = common_pb2.SamplingParams(**sampling)
    return draft_pb2.ProposeEntry(request_id=rid, num_tokens=k, sampling=params)


def step(stub, ingest_plans=(), proposals=(), **kw) -> draft_pb2.DraftStepResponse:
    request = draft_pb2.DraftStepRequest(ingest=ingest_plans, propose=proposals, **kw)
    return stub.Step(request)


def cached(response) -> dict[str, int]:
    return {c.request_id: c.num_cached_tokens for c in response.cached}


def refused(response) -> dict[str, tuple[str, str]]:
    """Requests the step refused alone: request id -> (status code name, message)."""
    return {f.request_id: (f.code, f.message) for f in response.failed}


def test_ingest_then_propose_returns_greedy_continuation(draft, make_runner):
    server, stub = draft
    response = step(stub, [ingest("r1", 0, PROMPT)], [propose("r1", 4)])
    (proposal,) = response.proposals
    assert proposal.request_id == "r1"
    assert list(proposal.token_ids) == greedy_decode(make_runner(), PROMPT, 4)
    assert len(proposal.draft_probs) == 0
    assert cached(response) == {"r1": len(PROMPT)}
    # The draft fed itself K - 1 proposals; the last one needs no KV yet.
    assert server.runner.seq_len("r1") == len(PROMPT) + 3


def test_k0_steps_only_record_committed_tokens_until_a_proposal_needs_them(draft, make_runner):
    server, stub = draft
    response = step(stub, [ingest("r1", 0, PROMPT[:6])])
    assert list(response.proposals) == []
    assert cached(response) == {"r1": 6}
    response = step(stub, [ingest("r1", 6, PROMPT[6:])])
    assert cached(response) == {"r1": len(PROMPT)}
    assert server.runner.seq_len("r1") == 0  # lazy ingest: no forward at K = 0
    info = stub.GetInfo(common_pb2.InfoRequest())
    assert (info.num_steps, info.num_ingest_plans, info.num_ingested_tokens) == (2, 2, 11)
    assert info.num_sequences == 1
    (proposal,) = step(stub, [], [propose("r1", 3)]).proposals
    assert list(proposal.token_ids) == greedy_decode(make_runner(), PROMPT, 3)
    assert server.runner.seq_len("r1") == len(PROMPT) + 2


def test_a_wrong_start_position_fails_that_request_alone(draft, make_runner):
    server, stub = draft
    step(stub, [ingest("r1", 0, PROMPT), ingest("r2", 0, OTHER)], [propose("r1", 1)])
    response = step(
        stub, [ingest("r2", len(OTHER), [40, 41]), ingest("r1", 14, [7])], [propose("r2", 2)]
    )
    code, message = refused(response)["r1"]
    assert code == "FAILED_PRECONDITION" and "request r1" in message
    assert "starts at 14" in message and f"holds {len(PROMPT)}" in message
    # r1 is as before; r2's plan and proposal went on.
    assert server.runner.seq_len("r1") == len(PROMPT)
    assert cached(response) == {"r2": len(OTHER) + 2}
    reference = make_runner()
    (proposal,) = response.proposals
    assert list(proposal.token_ids) == greedy_decode(reference, OTHER + [40, 41], 2)
    response = step(stub, [], [propose("r1", 2)])
    assert [list(p.token_ids) for p in response.proposals] == [greedy_decode(reference, PROMPT, 2)]


def test_propose_for_unknown_request_is_not_found(draft):
    _, stub = draft
    code, message = refused(step(stub, [], [propose("ghost", 3)]))["ghost"]
    assert code == "NOT_FOUND" and "ghost" in message


@pytest.mark.parametrize(
    ("plans", "proposals", "needle"),
    [
        ([ingest("r1", 0, [5, VOCAB])], [], "token id 256"),
        ([ingest("r1", 0, [5, 6])], [propose("r1", 0)], "num_tokens must be > 0"),
        ([ingest("r1", 0, [5] * 510)], [propose("r1", 3)], "max_model_len=512"),
    ],
)
def test_a_bad_entry_is_invalid_argument_for_its_request_only(draft, plans, proposals, needle):
    server, stub = draft
    response = step(stub, [*plans, ingest("ok", 0, OTHER)], [*proposals, propose("ok", 2)])
    code, message = refused(response)["r1"]
    assert code == "INVALID_ARGUMENT" and needle in message
    assert not server.runner.has("r1")
    assert cached(response) == {"ok": len(OTHER)} and len(response.proposals) == 1


def test_a_malformed_step_is_refused_whole(draft):
    server, stub = draft
    error = status_of(lambda: step(stub, [ingest("", 0, [5, 6]), ingest("ok", 0, OTHER)]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id must not be empty" in error.details()
    assert not server.runner.has("ok")


def test_step_stream_refuses_a_malformed_step_in_its_reply_and_answers_the_next(draft):
    server, stub = draft
    bad = draft_pb2.DraftStepRequest(ingest=[ingest("", 0, [5, 6])])
    good = draft_pb2.DraftStepRequest(ingest=[ingest("s", 0, PROMPT)], propose=[propose("s", 3)])
    replies = list(stub.StepStream(iter([bad, good, good]), timeout=30))
    assert [r.WhichOneof("result") for r in replies] == ["error", "response", "response"]
    assert replies[0].error.code == "INVALID_ARGUMENT"
    assert "request_id must not be empty" in replies[0].error.message
    # The same step as Step answers: the greedy continuation, the prompt held.
    assert list(replies[1].response.proposals[0].token_ids) == greedy_decode(
        server.runner, PROMPT, 3
    )
    assert cached(replies[1].response) == {"s": len(PROMPT)}
    # Ingesting from 0 again is out of sync for that request alone, as in Step.
    assert refused(replies[2].response)["s"][0] == "FAILED_PRECONDITION"


def test_partly_accepted_proposals_keep_matching_prefix_and_equal_a_rebuilt_draft(
    draft, start_server
):
    server, stub = draft
    first = list(step(stub, [ingest("r1", 0, PROMPT)], [propose("r1", 4)]).proposals[0].token_ids)
    # The target accepted two proposals and answered with a token of its own.
    bonus = (first[2] + 1) % VOCAB
    committed = PROMPT + first[:2] + [bonus]
    fed: list[list[int]] = []
    forward = server.runner.forward_chunks
    server.runner.forward_chunks = lambda chunks: (
        fed.append([list(c.token_ids) for c in chunks]) or forward(chunks)
    )
    response = step(stub, [ingest("r1", len(PROMPT), first[:2] + [bonus])])
    assert cached(response) == {"r1": len(committed)}
    assert server.runner.seq_len("r1") == len(committed) - 1  # the bonus waits (K = 0)
    assert fed == []
    incremental = list(step(stub, [], [propose("r1", 4)]).proposals[0].token_ids)
    # The two accepted proposals' KV was kept, not recomputed: the catch-up fed the bonus.
    assert fed[0] == [[bonus]]

    rebuilt = start_server(create_server)
    rebuilt_stub = draft_pb2_grpc.DraftServiceStub(rebuilt.channel)
    response = step(rebuilt_stub, [ingest("r1", 0, committed)], [propose("r1", 4)])
    assert list(response.proposals[0].token_ids) == incremental


def test_all_accepted_proposals_then_bonus_feed_only_the_last_two(draft, make_runner):
    server, stub = draft
    first = list(step(stub, [ingest("r1", 0, PROMPT)], [propose("r1", 3)]).proposals[0].token_ids)
    committed = PROMPT + first + [99]
    response = step(stub, [ingest("r1", len(PROMPT), first + [99])], [propose("r1", 2)])
    assert cached(response) == {"r1": len(committed)}
    assert list(response.proposals[0].token_ids) == greedy_decode(make_runner(), committed, 2)


def kv_table(version: int, scale: float) -> common_pb2.KVScaleTable:
    return common_pb2.KVScaleTable(
        version=version, dtype="fp8", k_scale=[scale] * 2, v_scale=[scale] * 2
    )


def test_kv_scales_version_mismatch_is_failed_precondition(draft):
    server, stub = draft
    # A proposal makes the draft write r1's KV under version 1.
    step(
        stub, [ingest("r1", 0, PROMPT)], [propose("r1", 1)], kv_scales_version=1,
        kv_scales=kv_table(1, 1.0),
    )  # fmt: skip
    response = step(
        stub,
        [ingest("r1", len(PROMPT), [4]), ingest("r2", 0, OTHER)],
        kv_scales_version=2,
        kv_scales=kv_table(2, 0.5),
    )
    code, message = refused(response)["r1"]
    assert code == "FAILED_PRECONDITION" and "request r1" in message
    assert "version 1" in message and "version 2" in message
    assert server.runner.seq_len("r1") == len(PROMPT)
    assert cached(response) == {"r2": len(OTHER)}  # a new sequence, under version 2
    # A version the draft has no table for.
    error = status_of(lambda: step(stub, [ingest("r2", 0, OTHER)], kv_scales_version=3))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "version 3" in error.details()
    # The coordinator's answer: release, re-ingest from 0 under the new table.
    stub.Release(common_pb2.ReleaseRequest(request_ids=["r1"]))
    response = step(
        stub, [ingest("r1", 0, PROMPT)], kv_scales_version=2, kv_scales=kv_table(2, 0.5)
    )
    assert cached(response) == {"r1": len(PROMPT)}
    info = stub.GetInfo(common_pb2.InfoRequest())
    assert info.kv_scales.version == 2
    assert list(info.kv_scales.k_scale) == [0.5, 0.5]


def test_sampled_proposals_are_reproducible_with_a_seed_and_carry_probs(draft):
    _, stub = draft
    k = 5
    sampling = dict(temperature=1.5, top_p=0.95, seed=1234)
    response = step(
        stub,
        [ingest("a", 0, PROMPT), ingest("b", 0, PROMPT), ingest("c", 0, PROMPT)],
        [propose("a", k, **sampling), propose("b", k, **sampling), propose("c", k, **sampling)],
    )
    a, b, c = response.proposals
    assert len(a.draft_probs) == k
    probs = np.zeros((k, VOCAB), dtype=np.float32)
    for i, q in enumerate(a.draft_probs):
        assert list(q.token_ids) == sorted(set(q.token_ids))
        probs[i, list(q.token_ids)] = list(q.probs)
    assert list(a.token_ids) == list(b.token_ids) == list(c.token_ids)
    assert list(a.draft_probs) == list(b.draft_probs)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert all(probs[i, t] > 0 for i, t in enumerate(a.token_ids))
    assert (probs == 0).any()  # top_p removed the tail


def test_out_of_pages_is_resource_exhausted_and_changes_nothing(draft):
    server, stub = draft
    step(stub, [ingest("r1", 0, PROMPT)], [propose("r1", 1)])
    free = server.runner.num_free_pages
    long_prompt = list(range(3, 3 + 4 * NUM_PAGES))[: 4 * (NUM_PAGES - 2)]
    error = status_of(
        lambda: step(stub, [ingest("r2", 0, long_prompt)], [propose("r1", 4), propose("r2", 1)])
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.runner.num_free_pages == free
    assert not server.runner.has("r2")
    assert server.runner.seq_len("r1") == len(PROMPT)


def test_release_is_idempotent_and_get_info_reports_the_model(draft):
    server, stub = draft
    step(stub, [ingest("r1", 0, PROMPT)])
    released = stub.Release(common_pb2.ReleaseRequest(request_ids=["r1", "r1", "nope"]))
    assert released.num_released == 1
    assert released.num_free_pages == NUM_PAGES
    assert stub.Release(common_pb2.ReleaseRequest(request_ids=["r1"])).num_released == 0
    info = stub.GetInfo(common_pb2.InfoRequest())
    assert (info.vocab_size, info.max_model_len, info.num_layers) == (VOCAB, 512, 2)
    assert (info.kv_cache_dtype, info.page_size, info.num_total_pages) == ("fp8", 4, NUM_PAGES)
    assert list(info.eos_token_ids) == [2]
    assert info.num_sequences == 0


def test_a_changed_table_under_a_used_version_is_refused_but_replaces_an_unused_one(draft):
    server, stub = draft
    # No pages written yet: a pinned table (e.g. from the coordinator's file) replaces v1.
    step(stub, [ingest("r1", 0, PROMPT)], kv_scales_version=1, kv_scales=kv_table(1, 0.25))
    assert server.runner.kv_scales.k_scale == (0.25, 0.25)
    step(stub, [], [propose("r1", 1)], kv_scales_version=1)  # now r1's pages are written
    error = status_of(
        lambda: step(stub, [ingest("r2", 0, OTHER)], kv_scales_version=1, kv_scales=kv_table(1, 2))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request r1" in error.details() and "new version" in error.details()
    assert server.runner.kv_scales.k_scale == (0.25, 0.25)


def test_steps_of_two_coordinators_run_as_one_and_answer_each_its_own(make_runner):
    runner = make_runner()
    servicer = DraftServicer(Drafter(runner), executor=None)
    a = draft_pb2.DraftStepRequest(ingest=[ingest("a1", 0, PROMPT)], propose=[propose("a1", 3)])
    b = draft_pb2.DraftStepRequest(ingest=[ingest("b1", 0, OTHER)], propose=[propose("b1", 2)])
    replies = servicer._step_many([(a, "coordinator-a"), (b, "coordinator-b")])
    assert servicer.model.num_steps == 1  # one batched step for both callers
    assert [p.request_id for p in replies[0].proposals] == ["a1"]
    assert list(replies[0].proposals[0].token_ids) == greedy_decode(make_runner(), PROMPT, 3)
    assert list(replies[1].proposals[0].token_ids) == greedy_decode(make_runner(), OTHER, 2)
    assert cached(replies[1]) == {"b1": len(OTHER)}
    # The same request id from another coordinator: the steps run apart, and the
    # sequence stays with the coordinator that opened it.
    mine = draft_pb2.DraftStepRequest(propose=[propose("a1", 1)])
    foreign = draft_pb2.DraftStepRequest(ingest=[ingest("a1", 0, OTHER)])
    replies = servicer._step_many([(mine, "coordinator-a"), (foreign, "c")])
    assert servicer.model.num_steps == 3
    assert len(replies[0].proposals) == 1 and refused(replies[1])["a1"][0] == "NOT_FOUND"
    # A step refused whole (here: a table version the draft never saw) reaches its caller
    # alone; the other caller's step still runs.
    bad = draft_pb2.DraftStepRequest(kv_scales_version=99, ingest=[ingest("c1", 0, OTHER)])
    good = draft_pb2.DraftStepRequest(propose=[propose("b1", 1)])
    replies = servicer._step_many([(bad, "c"), (good, "coordinator-b")])
    assert isinstance(replies[0], Exception) and len(replies[1].proposals) == 1
    assert servicer.model.num_steps == 4
