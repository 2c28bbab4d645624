"""The speculation gate in the engine, on a fake target whose Verify takes the time a CPU
target's would: a forward each, and each proposal row a share of one."""

from __future__ import annotations

import asyncio

from coordinator_fakes import MAX_MODEL_LEN, FakeDraft, FakeTarget
from test_coordinator_engine import expected_output, make_engine, make_request, run

from specdec.coordinator.engine.metrics import create_metrics
from specdec.v1 import target_pb2

PROMPT = [1, 2, 3, 4]
MAX_TOKENS = MAX_MODEL_LEN - len(PROMPT)


def verify_seconds(forward_s: float, row_s: float):
    """A Verify's time: ``forward_s`` for its forward (the fake answers one forward even
    where a multi-step burst asks for more), ``row_s`` a proposal row."""

    def delay(request: target_pb2.VerifyRequest) -> float:
        return forward_s + row_s * sum(len(e.proposal_ids) for e in request.decode)

    return delay


def serve(draft: FakeDraft, target: FakeTarget):
    """The request's stats and the gate's Prometheus counts (held back, probes)."""
    engine = make_engine(
        draft,
        target,
        metrics=create_metrics(),
        speculative_gate="goodput",
        target_threads_beside_draft=1,
        num_scheduler_steps=8,
    )
    request = make_request("a", PROMPT, MAX_TOKENS)
    [(tokens, reason, error)] = asyncio.run(run(engine, request))
    assert (tokens, reason, error) == (expected_output(len(PROMPT), MAX_TOKENS), "length", None)
    sample = engine.metrics.registry.get_sample_value
    gate = sample("specdec_num_gate_held_back_total"), sample("specdec_num_gate_probes_total")
    return request.stats, gate


def test_speculation_that_loses_to_plain_decoding_is_turned_off():
    # Every proposal wrong, and a proposal row costs 40 % of a decode (a CPU verifying in
    # float32): one token for an 11 ms step, against 5 ms a token. Four tokens a step
    # would pay, so the gate probes.
    wrong = frozenset(range(2 * MAX_TOKENS))
    draft, target = FakeDraft(wrong_positions=wrong), FakeTarget(verify_seconds(0.005, 0.002))
    stats, (held_back, probes) = serve(draft, target)
    # The warm-up's four speculative steps, then plain multi-step bursts, and after 32
    # plain tokens a probe of two speculative steps, which lost (the next would come
    # after 64 more).
    assert stats.num_drafts == 4 + 2
    assert stats.num_k0_steps >= MAX_TOKENS - 4 * 6
    # Prometheus counts the gate's steps at K = 0 (bursts of up to 8 forwards) and its probe.
    assert stats.num_k0_steps / 8 <= held_back <= stats.num_k0_steps and probes == 1
    # Every proposal rejected: the draft never worked ahead (one branch where it shares the
    # target's cores), so every verify, plain or not, took every core.
    threads = {(bool(r.decode[0].proposal_ids), r.num_threads) for r in target.requests[1:]}
    assert threads == {(False, 0), (True, 0)}


def test_speculation_that_pays_keeps_running():
    # The draft is always right and a proposal row costs a tenth of a forward: four tokens
    # a 6.5 ms step, against 5 ms a token.
    draft, target = FakeDraft(), FakeTarget(verify_seconds(0.005, 0.0005))
    stats, (held_back, probes) = serve(draft, target)
    # One plain burst timed plain decoding after the warm-up; every other step speculated,
    # every proposal accepted.
    assert stats.num_k0_steps <= 8 and held_back == 1 and probes == 0
    # The draft worked ahead beside each verify after the first ones, on the core left it.
    threads = {(bool(r.decode[0].proposal_ids), r.num_threads) for r in target.requests[1:]}
    assert (True, 1) in threads and (False, 1) not in threads
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert stats.num_accepted_tokens + stats.num_drafts >= MAX_TOKENS - 8
