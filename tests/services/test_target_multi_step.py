"""Multi-step decoding at the target (VerifyRequest.num_steps): several K = 0 forwards in
one Verify emit exactly what as many one-step Verify calls would."""

from __future__ import annotations

import functools

import grpc
import pytest
from service_testing import PAGE_SIZE, chunk, entry, greedy_decode, status_of, verify
from test_target_service import PROMPT

from specdec.target_service.server import create_server
from specdec.v1 import target_pb2, target_pb2_grpc


@pytest.fixture(params=["fp8", "auto"], ids=["fp8-forward-by-forward", "auto-one-c-call"])
def target_kv(request, start_server):
    """A target whose greedy multi-step runs forward by forward (FP8 cache) or in one C
    call (``auto``); its runner counts the C calls."""
    server = start_server(create_server, kv_cache_dtype=request.param)
    runner = server.runner
    native = runner.decode_greedy
    runner.c_calls = 0

    def counted(*args, **kwargs):
        picks = native(*args, **kwargs)
        runner.c_calls += picks is not None
        return picks

    runner.decode_greedy = counted
    server.uses_c_loop = request.param == "auto"
    return server, target_pb2_grpc.TargetServiceStub(server.channel)


def multi_step(stub, entries, num_steps) -> list[target_pb2.VerifyResult]:
    request = target_pb2.VerifyRequest(decode=entries, num_steps=num_steps)
    return list(stub.Verify(request).results)


def capped(e: target_pb2.VerifyEntry, max_new_tokens=0, stops=()) -> target_pb2.VerifyEntry:
    e.max_new_tokens = max_new_tokens
    e.stop_token_ids.extend(stops)
    return e


def start(stub, rid, prompt, **sampling) -> int:
    """Prefills ``rid``; returns its first token."""
    (first,) = verify(stub, [chunk(rid, 0, prompt, True, **sampling)])
    return first.token_ids[0]


def test_greedy_multi_step_equals_one_token_per_forward(target_kv, make_runner):
    server, stub = target_kv
    make_runner = functools.partial(make_runner, kv_cache_dtype=server.runner.kv_cache_dtype)
    short = PROMPT[:11]
    expected = {
        "a": greedy_decode(make_runner(), PROMPT, 9),
        "b": greedy_decode(make_runner(), short, 4),
    }
    first = {"a": start(stub, "a", PROMPT), "b": start(stub, "b", short)}
    results = multi_step(
        stub,
        [
            entry("a", len(PROMPT), first["a"], []),
            capped(entry("b", len(short), first["b"], []), max_new_tokens=3),
        ],
        num_steps=8,
    )
    for r, prompt in zip(results, (PROMPT, short), strict=True):
        assert not r.error_code
        tokens = [first[r.request_id], *r.token_ids]
        assert tokens == expected[r.request_id]
        # The target holds every emitted token but the last, as after one-step verifies.
        assert r.num_cached_tokens == len(prompt) + len(r.token_ids)
        assert server.runner.seq_len(r.request_id) == r.num_cached_tokens
        assert r.num_accepted == 0
    assert server.runner.c_calls == server.uses_c_loop


def test_seeded_sampling_draws_the_same_tokens_in_one_multi_step_as_step_by_step(target):
    _, stub = target
    sampling = dict(temperature=1.5, seed=11)
    first = {rid: start(stub, rid, PROMPT, **sampling) for rid in ("one", "many")}
    assert first["one"] == first["many"]
    stepwise, last = [], first["one"]
    for i in range(12):
        (r,) = verify(stub, [], [entry("one", len(PROMPT) + i, last, [], **sampling)])
        stepwise += r.token_ids
        last = r.token_ids[0]
    (r,) = multi_step(stub, [entry("many", len(PROMPT), first["many"], [], **sampling)], 12)
    assert list(r.token_ids) == stepwise
    assert len(set(stepwise)) > 3  # a real sample, not a repeated token


def test_an_entry_stops_after_its_stop_token_while_another_goes_on(target_kv, make_runner):
    server, stub = target_kv
    make_runner = functools.partial(make_runner, kv_cache_dtype=server.runner.kv_cache_dtype)
    expected = greedy_decode(make_runner(), PROMPT, 7)
    stop = expected[3]
    emitted = expected[1 : expected.index(stop, 1) + 1]  # up to the stop's first repeat
    other = PROMPT[:13]
    first = {"a": start(stub, "a", PROMPT), "b": start(stub, "b", other)}
    stopping = capped(entry("a", len(PROMPT), first["a"], []), stops=[stop])
    results = multi_step(stub, [stopping, entry("b", len(other), first["b"], [])], 6)
    assert [list(r.token_ids) for r in results] == [
        emitted,
        greedy_decode(make_runner(), other, 7)[1:],
    ]
    assert server.runner.seq_len("a") == len(PROMPT) + len(emitted)
    assert server.runner.seq_len("b") == len(other) + 6
    assert server.runner.c_calls == server.uses_c_loop


def test_a_full_cache_ends_multi_step_early_and_the_next_verify_reports_it(target, make_runner):
    server, stub = target
    prompt = PROMPT[:18]  # 4.5 pages: two more tokens fit before a new page is needed
    first = start(stub, "a", prompt)
    free = server.runner.num_free_pages
    verify(stub, [chunk("filler", 0, [3] * (PAGE_SIZE * free), True)])
    assert server.runner.num_free_pages == 0
    (r,) = multi_step(stub, [entry("a", len(prompt), first, [])], 6)
    assert not r.error_code
    assert [first, *r.token_ids] == greedy_decode(make_runner(), prompt, 3)
    next_step = [entry("a", r.num_cached_tokens, r.token_ids[-1], [])]
    error = status_of(lambda: verify(stub, [], next_step))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.runner.seq_len("a") == len(prompt) + 2


@pytest.mark.parametrize("kind", ["proposals", "prefill"])
def test_multi_step_takes_k0_decode_entries_only(target, kind):
    _, stub = target
    first = start(stub, "a", PROMPT)
    request = target_pb2.VerifyRequest(num_steps=4)
    if kind == "proposals":
        request.decode.append(entry("a", len(PROMPT), first, [5, 6]))
    else:
        request.decode.append(entry("a", len(PROMPT), first, []))
        request.prefill.append(chunk("b", 0, PROMPT, True))
    error = status_of(lambda: stub.Verify(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "num_steps" in error.details()


def test_an_ended_burst_stops_before_its_next_forward_keeping_what_it_emitted(
    target_kv, make_runner
):
    """EndBurst (a request arrived at the coordinator): here it comes before the burst
    starts, as it may when the request races the Verify, so the burst stops after its
    first forward; a burst of another step id runs whole."""
    server, stub = target_kv
    expected = greedy_decode(make_runner(kv_cache_dtype=server.runner.kv_cache_dtype), PROMPT, 12)
    first = start(stub, "a", PROMPT)
    assert stub.EndBurst(target_pb2.EndBurstRequest(step_id=5)).ended is False  # not running
    request = target_pb2.VerifyRequest(
        step_id=5, decode=[entry("a", len(PROMPT), first, [])], num_steps=8
    )
    (ended,) = stub.Verify(request).results
    assert list(ended.token_ids) == expected[1:2]
    assert server.runner.seq_len("a") == len(PROMPT) + 1
    request = target_pb2.VerifyRequest(
        step_id=6, decode=[entry("a", len(PROMPT) + 1, expected[1], [])], num_steps=8
    )
    (whole,) = stub.Verify(request).results
    assert list(whole.token_ids) == expected[2:10]
