"""The engine's step loop against in-process fake draft and target services."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from coordinator_fakes import (
    EOS,
    FIXED_K4,
    MAX_MODEL_LEN,
    FakeDraft,
    FakeTarget,
    model_info,
    next_token,
    rpc_error,
)

from specdec.coordinator.api.server import kv_pool
from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.coordinator.engine.core import Engine, ModelLimits
from specdec.coordinator.engine.errors import Cancelled, InvalidRequest, ServiceError
from specdec.coordinator.engine.request import Request, SamplingParams
from specdec.coordinator.engine.stats import SpecStats


def make_engine(draft: FakeDraft, target: FakeTarget, metrics=None, **config) -> Engine:
    config.setdefault("speculative_config", '{"num_speculative_tokens": 3}')
    config.setdefault("draft_retry_interval", 0.0)
    # The scenarios assume their K every step; the gate's tests turn it on.
    config.setdefault("speculative_gate", "off")
    info = model_info()
    limits = ModelLimits(
        vocab_size=info.vocab_size,
        max_model_len=info.max_model_len,
        eos_token_ids=frozenset(info.eos_token_ids),
        draft_kv_scales=info.kv_scales,
        target_kv=kv_pool("target", target.pool.info({}), MAX_MODEL_LEN) if target.pool else None,
        draft_kv=kv_pool("draft", draft.pool.info({}), MAX_MODEL_LEN) if draft.pool else None,
    )
    config.setdefault("speculative_config", FIXED_K4)  # what the fakes' scenarios assume
    return Engine(CoordinatorConfig(**config), draft, target, limits, metrics)


def make_request(rid: str, prompt: list[int], max_tokens: int = 12, **kw) -> Request:
    return Request(rid, prompt, SamplingParams(), max_tokens, **kw)


def expected_output(prompt_len: int, max_tokens: int) -> list[int]:
    return [next_token(n) for n in range(prompt_len, prompt_len + max_tokens)]


async def collect(request: Request) -> tuple[list[int], str | None, Exception | None]:
    tokens: list[int] = []
    while True:
        out = await asyncio.wait_for(request.outputs.get(), 5)
        tokens += out.token_ids
        if out.finished:
            return tokens, out.finish_reason, out.error


async def run(engine: Engine, *requests: Request) -> list[tuple]:
    engine.start()
    try:
        for r in requests:
            engine.add_request(r)
        return await asyncio.gather(*(collect(r) for r in requests))
    finally:
        await engine.stop()


def test_greedy_output_matches_the_target_and_the_draft_log_matches_the_commit_log():
    draft, target = FakeDraft(wrong_positions=frozenset({9, 14})), FakeTarget()
    engine = make_engine(draft, target, max_num_batched_tokens=4)
    a = make_request("a", [5, 6, 7, 8, 9, 10], max_tokens=12)
    b = make_request("b", [1, 2, 3], max_tokens=7)
    results = asyncio.run(run(engine, a, b))
    assert results[0] == (expected_output(6, 12), "length", None)
    assert results[1] == (expected_output(3, 7), "length", None)
    # The draft held exactly the committed log (minus the last token) at release.
    for r in (a, b):
        assert (
            draft.released_logs[r.request_id]
            == r.token_ids[: len(draft.released_logs[r.request_id])]
        )
        assert len(draft.released_logs[r.request_id]) >= r.num_tokens - 4
        assert r.request_id in target.released
    assert a.stats.num_drafts > 0
    assert a.stats.num_accepted_tokens < a.stats.num_draft_tokens  # positions 9, 14 rejected
    totals = SpecStats()
    for r in (a, b):
        totals.num_draft_tokens += r.stats.num_draft_tokens
        totals.num_accepted_tokens += r.stats.num_accepted_tokens
    assert engine.totals.num_draft_tokens == totals.num_draft_tokens
    assert engine.totals.num_accepted_tokens == totals.num_accepted_tokens
    assert engine.totals.accepted_per_position[0] >= engine.totals.accepted_per_position[-1]
    assert engine.totals.mean_acceptance_length == pytest.approx(
        1 + engine.totals.num_accepted_tokens / engine.totals.num_drafts
    )


def test_every_step_ingests_including_k0_steps():
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target, speculative_config='{"num_speculative_tokens": 0}')
    r = make_request("a", [1, 2, 3], max_tokens=5)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(3, 5), "length", None)
    assert r.stats.num_k0_steps == 4 and r.stats.num_drafts == 0
    # Prefill and each of the 4 decode steps each carried an ingest plan.
    assert [len(s.ingest) for s in draft.requests] == [1, 1, 1, 1, 1]
    assert all(not s.propose for s in draft.requests)
    assert draft.released_logs["a"] == r.token_ids[:-1]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL])
def test_draft_error_runs_k0_then_resyncs_the_whole_log(code):
    # INTERNAL too: a draft that failed mid-step may keep part of what it ingested, so the
    # coordinator trusts none of it and rebuilds every sequence from its log. Not
    # pipelined: one draft call per step, before the verify it feeds.
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target, pipeline="off")
    r = make_request("a", [1, 2, 3, 4], max_tokens=14)

    async def scenario():
        engine.start()
        engine.add_request(r)
        tokens = []
        while len(tokens) < 5:  # prefill + a decode step
            out = await asyncio.wait_for(r.outputs.get(), 5)
            tokens += out.token_ids
        draft.fail_after_ingest = code == grpc.StatusCode.INTERNAL
        draft.errors.append(rpc_error(code, "draft failed"))
        rest, reason, error = await collect(r)
        await engine.stop()
        return tokens + rest, reason, error

    tokens, reason, error = asyncio.run(scenario())
    assert (tokens, reason, error) == (expected_output(4, 14), "length", None)
    failed = next(i for i, s in enumerate(draft.requests) if s is draft.failed_request)
    # The verify after the failure had no proposals (K = 0) ...
    k0_verify = next(v for v in target.requests if v.step_id == draft.failed_request.step_id)
    assert [list(d.proposal_ids) for d in k0_verify.decode] == [[]]
    assert r.stats.num_k0_steps >= 1 and engine.draft_breaker.num_trips == 1
    # ... and the next draft call released and re-ingested the whole log from 0.
    assert draft.releases[0] == ["a"]
    resync = draft.requests[failed + 1]
    assert resync.ingest[0].start_position == 0
    assert resync.HasField("kv_scales") and resync.kv_scales.version == 7
    assert draft.released_logs["a"] == r.token_ids[: len(draft.released_logs["a"])]


def test_draft_deadline_miss_is_a_k0_step():
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target, draft_timeout=0.05)

    async def slow_step(request, timeout=None, metadata=None):
        await asyncio.sleep(1)

    calls = []
    original = draft.Step

    async def step(request, timeout=None, metadata=None):
        calls.append(request)
        if len(calls) == 2:
            return await slow_step(request)
        return await original(request)

    draft.Step = step
    r = make_request("a", [1, 2, 3], max_tokens=8)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(3, 8), "length", None)
    assert r.stats.num_k0_steps >= 1
    assert any(s.ingest and s.ingest[0].start_position == 0 for s in calls[2:3])


def test_rebuild_every_step_reingests_from_zero_and_keeps_output():
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target, draft_rebuild_every_step=True, pipeline="off")
    r = make_request("a", [1, 2, 3], max_tokens=9)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(3, 9), "length", None)
    assert all(s.ingest[0].start_position == 0 for s in draft.requests)
    assert len(draft.releases) >= len(draft.requests)


@pytest.mark.parametrize("wrong", [(), (15,)], ids=["guesses-hold", "one-miss"])
def test_pipelined_steps_use_the_proposals_prepared_during_the_last_verify(wrong):
    """One branch (all accepted), as at batch 2 and up or when sampling."""
    draft, target = FakeDraft(wrong_positions=frozenset(wrong)), FakeTarget()
    engine = make_engine(draft, target, pipeline_branches=1)
    r = make_request("a", [1, 2, 3, 4], max_tokens=21)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(4, 21), "length", None)
    ahead = [s for s in draft.requests if s.propose and s.propose[0].ahead_of]
    fresh = [s for s in draft.requests if s.propose and not s.propose[0].ahead_of]
    # Every verified draft came from a draft call before its verify or was prepared
    # during the verify before; work ahead starts once a verify accepted everything.
    assert r.stats.num_drafts == len(fresh) + r.stats.num_ahead_used
    assert r.stats.num_ahead_proposals == len(ahead) > r.stats.num_ahead_used > 0
    if not wrong:  # the first two decode steps draft first; every later one was prepared
        assert len(fresh) == 2
    for s in ahead:  # proposed after the proposals the target was verifying
        (verify,) = [v for v in target.requests if v.step_id == s.step_id]
        assert list(s.propose[0].ahead_of) == list(verify.decode[0].proposal_ids)
    assert draft.released_logs["a"] == r.token_ids[: len(draft.released_logs["a"])]


def test_a_draft_cut_short_is_verified_and_never_worked_ahead_of():
    """--draft-p-min reaches the draft; a draft that stops before K stopped where it was
    unsure of the next token, which work ahead would have to guess."""
    draft, target = FakeDraft(max_proposals=2), FakeTarget()
    engine = make_engine(draft, target, draft_p_min=0.4, pipeline_branches=1)
    r = make_request("a", [1, 2, 3, 4], max_tokens=21)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(4, 21), "length", None)
    entries = [e for s in draft.requests for e in s.propose]
    assert entries and all(e.min_prob == pytest.approx(0.4) for e in entries)
    assert r.stats.num_accepted_tokens == r.stats.num_draft_tokens > 0
    # Every draft but the last (K capped by the room left) stopped at 2 of K = 3 tokens,
    # and no work ahead followed one of those.
    assert r.stats.num_draft_tokens == 2 * (r.stats.num_drafts - 1) + 1
    assert not any(len(e.ahead_of) == 2 for e in entries)


def test_branches_prepare_every_outcome_of_the_verify_at_batch_1():
    """With a branch for each rejected position beside the all-accepted one, every step
    after the first two (branches start once a verify was timed) uses prepared
    proposals, whichever proposal the target rejects."""
    draft, target = FakeDraft(wrong_positions=frozenset({9, 14})), FakeTarget()
    engine = make_engine(draft, target, pipeline_branches=4)
    r = make_request("a", [1, 2, 3, 4], max_tokens=21)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(4, 21), "length", None)
    fresh = [s for s in draft.requests if s.propose and not s.propose[0].ahead_of]
    ahead = [e for s in draft.requests for e in s.propose if e.ahead_of]
    assert len(fresh) == 2 and [e.num_branches for e in ahead][1:] == [4] * (len(ahead) - 1)
    assert all(e.branch_budget_s > 0 for e in ahead[1:])
    assert r.stats.num_drafts == 2 + r.stats.num_ahead_used
    assert r.stats.num_accepted_tokens < r.stats.num_draft_tokens  # some were rejected


def test_a_draft_sharing_the_targets_cores_prepares_the_all_accepted_branch_only():
    """Branches would have every verify run beside the draft's work ahead, on the threads
    it leaves the target; with one, a verify after a rejection keeps them all."""
    draft, target = FakeDraft(wrong_positions=frozenset({9, 14})), FakeTarget()
    engine = make_engine(draft, target, pipeline_branches=4, target_threads_beside_draft=1)
    r = make_request("a", [1, 2, 3, 4], max_tokens=21)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(4, 21), "length", None)
    ahead = [e for s in draft.requests for e in s.propose if e.ahead_of]
    assert ahead and all(e.num_branches == 1 for e in ahead)
    verifies = [v for v in target.requests if v.decode and v.decode[0].proposal_ids]
    threads = {v.num_threads for v in verifies}
    assert threads == {0, 1}  # beside work ahead, and alone after a rejection


def test_pipeline_off_drafts_then_verifies_in_turn():
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target, pipeline="off")
    r = make_request("a", [1, 2, 3, 4], max_tokens=12)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(4, 12), "length", None)
    assert not any(e.ahead_of for s in draft.requests for e in s.propose)
    assert r.stats.num_ahead_proposals == r.stats.num_ahead_used == 0


def test_eos_from_the_target_stops_the_request():
    draft, target = FakeDraft(), FakeTarget()
    target.override[6] = EOS
    engine = make_engine(draft, target)
    r = make_request("a", [1, 2, 3], max_tokens=20)
    (result,) = asyncio.run(run(engine, r))
    assert result == (expected_output(3, 3) + [EOS], "stop", None)


def test_target_error_fails_that_steps_requests_with_its_code():
    draft, target = FakeDraft(), FakeTarget()
    target.errors.append(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "KV cache full"))
    engine = make_engine(draft, target)

    async def scenario():
        engine.start()
        a = make_request("a", [1, 2, 3], max_tokens=4)
        engine.add_request(a)
        first = await collect(a)
        b = make_request("b", [1, 2, 3], max_tokens=4)
        engine.add_request(b)
        second = await collect(b)
        await engine.stop()
        return first, second

    first, second = asyncio.run(scenario())
    assert isinstance(first[2], ServiceError) and first[2].code == "RESOURCE_EXHAUSTED"
    assert "KV cache full" in str(first[2])
    assert "a" in target.released and any("a" in ids for ids in draft.releases)
    assert second == (expected_output(3, 4), "length", None)


def test_an_entry_the_target_refuses_fails_only_its_request():
    draft, target = FakeDraft(), FakeTarget()
    target.entry_errors["bad"] = ("INVALID_ARGUMENT", "request bad: draft_probs are NaN")
    engine = make_engine(draft, target)
    requests = [make_request(rid, [1, 2, 3], max_tokens=10) for rid in ("a", "bad", "b", "c")]
    results = dict(zip(["a", "bad", "b", "c"], asyncio.run(run(engine, *requests)), strict=True))
    error = results.pop("bad")[2]
    assert isinstance(error, ServiceError) and error.code == "INVALID_ARGUMENT"
    assert "request bad" in str(error) and "NaN" in str(error)
    assert all(r == (expected_output(3, 10), "length", None) for r in results.values())
    assert "bad" in target.released and any("bad" in ids for ids in draft.releases)


def test_a_request_the_draft_refuses_alone_is_rebuilt_and_the_others_go_on():
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target)
    draft.refuse_once.add("b")
    requests = [make_request(rid, [1, 2, 3], max_tokens=12) for rid in ("a", "b")]
    results = asyncio.run(run(engine, *requests))
    assert results == [(expected_output(3, 12), "length", None)] * 2
    assert engine.draft_breaker.num_trips == 0  # the draft itself is fine
    # The refused request was re-ingested from 0 at the next step; the other never was.
    starts = {
        rid: [p.start_position for s in draft.requests for p in s.ingest if p.request_id == rid]
        for rid in ("a", "b")
    }
    assert starts["b"][:2] == [0, 0] and starts["a"].count(0) == 1


def test_abort_releases_the_request_on_both_services():
    draft, target = FakeDraft(), FakeTarget(delay=0.01)
    engine = make_engine(draft, target)
    r = make_request("a", [1, 2, 3], max_tokens=MAX_MODEL_LEN - 3, ignore_eos=True)

    async def scenario():
        engine.start()
        engine.add_request(r)
        await asyncio.wait_for(r.outputs.get(), 5)
        engine.abort("a")
        for _ in range(100):
            if "a" in target.released and any("a" in ids for ids in draft.releases):
                break
            await asyncio.sleep(0.01)
        await engine.stop()

    asyncio.run(scenario())
    assert "a" in target.released and any("a" in ids for ids in draft.releases)
    assert "a" not in target.held and "a" not in draft.logs
    assert engine.num_unfinished == 0


def test_abort_ends_the_stream_with_cancelled_saying_why():
    engine = make_engine(FakeDraft(), FakeTarget(delay=0.01))
    r = make_request("a", [1, 2, 3], max_tokens=MAX_MODEL_LEN - 3, ignore_eos=True)

    async def scenario():
        engine.start()
        engine.add_request(r)
        await asyncio.wait_for(r.outputs.get(), 5)
        assert engine.abort("a", "VllmEngine.Abort") and not engine.abort("a")
        outcome = await collect(r)  # ends at once: no hang until the client's deadline
        await engine.stop()
        return outcome

    _, reason, error = asyncio.run(scenario())
    assert reason is None and isinstance(error, Cancelled)
    assert "'a' was aborted: VllmEngine.Abort" in str(error)


def test_a_value_the_services_cannot_carry_fails_its_request_before_it_joins_a_batch():
    engine = make_engine(FakeDraft(), FakeTarget())
    bad = Request("bad", [1, 2, 3], SamplingParams(temperature=0.5, seed=-1), 4)
    good = make_request("good", [1, 2, 3], max_tokens=4)

    async def scenario():
        engine.start()
        with pytest.raises(InvalidRequest, match="sampling parameters: Value out of range: -1"):
            engine.add_request(bad)
        engine.add_request(good)
        outcome = await collect(good)
        await engine.stop()
        return outcome

    assert asyncio.run(scenario()) == (expected_output(3, 4), "length", None)


def test_stopping_mid_release_still_releases_on_both_services():
    draft, target = FakeDraft(), FakeTarget()
    target.release_delay = 0.2
    engine = make_engine(draft, target)

    async def scenario():
        outcome = await run_until_release_starts(engine, make_request("a", [1, 2, 3], 4))
        await engine.stop()  # cancels the loop inside its Release call
        return outcome

    tokens, reason, _ = asyncio.run(scenario())
    assert reason == "length" and len(tokens) == 4
    assert "a" in target.released and not target.held
    assert any("a" in ids for ids in draft.releases) and not draft.logs


async def run_until_release_starts(engine: Engine, request: Request) -> tuple:
    engine.start()
    engine.add_request(request)
    outcome = await collect(request)
    await asyncio.sleep(0.05)  # the loop is now inside the slow Release
    return outcome


def test_metrics_count_what_the_stats_count():
    from specdec.coordinator.engine.metrics import create_metrics

    draft, target = FakeDraft(wrong_positions=frozenset({7})), FakeTarget()
    engine = make_engine(draft, target)
    engine.metrics = create_metrics()
    r = make_request("a", [1, 2, 3], max_tokens=10)
    asyncio.run(run(engine, r))
    sample = engine.metrics.registry.get_sample_value
    assert sample("spec_decode_num_drafts_total") == engine.totals.num_drafts > 0
    assert sample("spec_decode_num_draft_tokens_total") == engine.totals.num_draft_tokens
    assert sample("spec_decode_num_accepted_tokens_total") == engine.totals.num_accepted_tokens
    assert [
        sample("spec_decode_num_accepted_tokens_per_pos_total", {"position": str(i)}) or 0
        for i in range(len(engine.totals.accepted_per_position))
    ] == engine.totals.accepted_per_position
    assert sample("request_success_total", {"finished_reason": "length"}) == 1


def test_step_spans_carry_k_accepted_batch_size_and_propagate_context():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test installed a tracer provider first")
    draft, target = FakeDraft(), FakeTarget()
    engine = make_engine(draft, target)
    asyncio.run(run(engine, make_request("a", [1, 2, 3], max_tokens=6)))
    steps = [s for s in exporter.get_finished_spans() if s.name == "specdec.step"]
    assert steps and all({"specdec.k", "specdec.batch_size"} <= set(s.attributes) for s in steps)
    assert any(s.attributes.get("specdec.accepted", 0) > 0 for s in steps)
    trace_ids = {format(s.context.trace_id, "032x") for s in steps}
    assert all(md.get("traceparent", "").split("-")[1] in trace_ids for md in target.metadata)


def test_a_hung_draft_costs_one_deadline_then_steps_skip_it_until_a_probe_answers():
    draft, target = FakeDraft(), FakeTarget(delay=0.01)
    engine = make_engine(
        draft, target, draft_timeout=0.05, draft_retry_interval=0.02, draft_max_retry_interval=0.1
    )
    hung = {"on": True}
    step_calls = []
    original_step, original_info = draft.Step, draft.GetInfo

    async def hang(timeout):  # as a stopped process: nothing until the deadline
        await asyncio.sleep(timeout)
        raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    async def step(request, timeout=None, metadata=None):
        step_calls.append(hung["on"])
        return await (hang(timeout) if hung["on"] else original_step(request))

    async def get_info(request, timeout=None, metadata=None, wait_for_ready=None):
        return await (hang(timeout) if hung["on"] else original_info(request))

    draft.Step, draft.GetInfo = step, get_info
    r = make_request("a", [1, 2, 3], max_tokens=60)

    async def scenario():
        engine.start()
        engine.add_request(r)
        tokens = []
        while len(tokens) < 40:
            out = await asyncio.wait_for(r.outputs.get(), 5)
            tokens += out.token_ids
        hung["on"] = False
        rest, reason, error = await collect(r)
        await engine.stop()
        return tokens + rest, reason, error

    tokens, reason, error = asyncio.run(scenario())
    assert (tokens, reason, error) == (expected_output(3, 60), "length", None)
    # The hung draft met one step (one deadline); after that it was only probed, with
    # waits that grow up to the cap, while the steps ran K = 0 without it.
    assert step_calls.count(True) == 1
    assert engine.draft_breaker.num_trips == 1 and engine.draft_breaker.num_failed_probes >= 2
    waits = engine.draft_breaker.waits
    assert waits[:4] == [0.02, 0.05, 0.1, 0.1][: len(waits)] and len(waits) >= 3
    # Once a probe answered, drafting resumed: later steps proposed and were accepted.
    assert r.stats.num_drafts > 0 and r.stats.num_accepted_tokens > 0


def test_a_request_arriving_during_a_burst_ends_it_at_the_target():
    """Multi-step decoding: the burst in flight is ended (EndBurst with its step id) so the
    newcomer's prefill starts at the next step; once, whatever else arrives."""
    draft, target = FakeDraft(), FakeTarget(delay=0.05)
    engine = make_engine(
        draft, target, speculative_config='{"num_speculative_tokens": 0}', num_scheduler_steps=8
    )

    async def scenario():
        engine.start()
        try:
            first = make_request("first", [1, 2, 3], 40)
            engine.add_request(first)
            while not any(r.num_steps > 1 for r in target.requests):
                await asyncio.sleep(0.005)
            burst = next(r for r in target.requests if r.num_steps > 1)
            late = [make_request(f"late{i}", [4, 5], 4) for i in range(3)]
            for request in late:
                engine.add_request(request)
            await asyncio.gather(*(collect(r) for r in [first, *late]))
            return burst.step_id
        finally:
            await engine.stop()

    step_id = asyncio.run(scenario())
    assert target.ended_bursts == [step_id]
