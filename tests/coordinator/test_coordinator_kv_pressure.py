"""KV pages under pressure: the engine preempts (recompute) instead of failing a step,
refuses at admission only what could never fit, and never trips the draft breaker."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from coordinator_fakes import FakeDraft, FakePool, FakeTarget, rpc_error
from test_coordinator_engine import expected_output, make_engine, make_request, run

from specdec.coordinator.engine.errors import ResourceExhausted

PROMPT_LEN, MAX_TOKENS, NUM_REQUESTS = 10, 30, 8


def requests() -> list:
    return [
        make_request(f"r{i}", list(range(1, PROMPT_LEN + 1)), MAX_TOKENS)
        for i in range(NUM_REQUESTS)
    ]


def total_pages(page_size: int = 4) -> int:
    """Pages every request would hold at its end, all at once."""
    return NUM_REQUESTS * -(-(PROMPT_LEN + MAX_TOKENS) // page_size)


@pytest.mark.parametrize("short", ["target", "draft"])
def test_requests_exceeding_a_pool_threefold_all_complete_unchanged_through_preemption(short):
    # The short pool holds a third of what the requests need together (and one request
    # with room to spare); the other is large enough for all of them.
    small, large = FakePool(total_pages() // 3), FakePool(10 * total_pages())
    draft = FakeDraft(
        wrong_positions=frozenset({13, 21}), pool=small if short == "draft" else large
    )
    target = FakeTarget(pool=small if short == "target" else large)
    engine = make_engine(draft, target, max_num_batched_tokens=64)
    outs = asyncio.run(run(engine, *requests()))
    for tokens, reason, error in outs:
        assert error is None and reason == "length"
        assert tokens == expected_output(PROMPT_LEN, MAX_TOKENS)
    assert engine.totals.num_preemptions > 0
    assert small.num_refused == 0 and large.num_refused == 0  # planned within the pages
    assert small.peak_used <= small.num_pages
    assert engine.draft_breaker.closed and engine.totals.num_drafts > 0
    assert target.held == {} and draft.logs == {}  # everything released at the end


def test_without_page_accounting_the_same_load_overflows_the_pool():
    """The test above can fail: with the pools unknown to the scheduler, the small target
    pool refuses steps and requests fail."""
    target = FakeTarget(pool=FakePool(total_pages() // 3))
    engine = make_engine(FakeDraft(), target, max_num_batched_tokens=64)
    engine.scheduler.target_pool = None
    outs = asyncio.run(run(engine, *requests()))
    assert target.pool.num_refused > 0
    assert any(error is not None for _, _, error in outs)


def test_a_request_larger_than_a_pool_is_refused_at_admission_and_its_neighbours_run():
    target = FakeTarget(pool=FakePool(12))  # 48 tokens
    engine = make_engine(FakeDraft(pool=FakePool(100)), target)

    async def scenario():
        engine.start()
        try:
            fits = make_request("fits", list(range(1, 11)), 20)
            engine.add_request(fits)
            with pytest.raises(ResourceExhausted, match="holds 48 tokens"):
                engine.add_request(make_request("huge", list(range(1, 31)), 30))
            from test_coordinator_engine import collect

            return await collect(fits)
        finally:
            await engine.stop()

    tokens, reason, error = asyncio.run(scenario())
    assert error is None and tokens == expected_output(10, 20)


@pytest.mark.parametrize("service", ["target", "draft"])
def test_a_service_out_of_pages_for_another_caller_fails_no_request(service):
    """Pages another coordinator took: the refused step changes nothing, the next one fits."""
    draft, target = FakeDraft(pool=FakePool(400)), FakeTarget(pool=FakePool(400))
    stub = target if service == "target" else draft
    stub.errors = [rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "KV cache is full")] * 2
    engine = make_engine(draft, target)
    outs = asyncio.run(run(engine, make_request("a", [1, 2, 3], 12)))
    assert outs == [(expected_output(3, 12), "length", None)]
    assert engine.draft_breaker.closed
