"""TargetService over real gRPC: chunked prefill, verify, dropped KV, errors, health."""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from service_testing import ServerThread, chunk, entry, greedy_decode, status_of, verify

from specdec.kernels import dense_ops
from specdec.target_service.server import create_server
from specdec.target_service.verifier import Verifier
from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc

PROMPT = [17, 203, 5, 88, 140, 61, 9, 230, 44, 101, 12, 7, 150, 33, 64, 2, 91, 180, 55, 23]
VOCAB = 256


class EntryError(NamedTuple):
    """A failed entry's error, read like a grpc.RpcError."""

    code_name: str
    message: str

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode[self.code_name]

    def details(self) -> str:
        return self.message


def entry_error(results: list[target_pb2.VerifyResult]) -> EntryError:
    """The error of the one failed entry (a bad entry fails alone, in its result)."""
    (failed,) = [r for r in results if r.error_code]
    return EntryError(failed.error_code, failed.error_message)


def prefill(stub, rid: str, tokens: list[int], chunk_size: int = 8) -> int:
    """Chunked prefill; returns the first generated token."""
    for start in range(0, len(tokens), chunk_size):
        piece = tokens[start : start + chunk_size]
        is_last = start + chunk_size >= len(tokens)
        (result,) = verify(stub, [chunk(rid, start, piece, is_last)])
        assert result.num_cached_tokens == start + len(piece)
        assert len(result.token_ids) == int(is_last)
    return result.token_ids[0]


def test_chunked_prefill_and_greedy_verify_equal_plain_greedy_decoding(target, make_runner):
    server, stub = target
    expected = greedy_decode(make_runner(), PROMPT, 16)
    out = [prefill(stub, "r1", PROMPT)]
    # Proposals that are right for the first `good` positions, then wrong.
    for good, k in [(0, 3), (2, 4), (4, 4), (1, 2), (3, 3)]:
        start = len(PROMPT) + len(out) - 1
        truth = expected[len(out) : len(out) + k]
        proposals = truth[:good] + [(t + 1) % VOCAB for t in truth[good:]]
        (result,) = verify(stub, [], [entry("r1", start, out[-1], proposals)])
        assert result.num_accepted == min(good, k)
        assert result.num_cached_tokens == start + 1 + result.num_accepted
        assert server.runner.seq_len("r1") == result.num_cached_tokens
        out += list(result.token_ids)
    assert out == expected[: len(out)]
    assert len(out) == 1 + (1 + 3 + 5 + 2 + 4)


def test_a_resumed_request_recomputes_its_log_emitting_nothing_then_decodes_on(target, make_runner):
    """A preempted request comes back as prefill chunks over its committed log but the last
    token, the last of them ``resumes``: no token is emitted there (it was committed
    before), and verify entries continue exactly where greedy decoding would."""
    _, stub = target
    expected = greedy_decode(make_runner(), PROMPT, 8)
    log = PROMPT + expected[:4]  # committed before the preemption
    first = chunk("r", 0, log[:10])
    last = chunk("r", 10, log[10:-1], True)
    last.resumes = True
    results = verify(stub, [first]) + verify(stub, [last])
    assert [list(r.token_ids) for r in results] == [[], []]
    assert results[-1].num_cached_tokens == len(log) - 1
    (result,) = verify(stub, [], [entry("r", len(log) - 1, log[-1], expected[4:7])])
    assert list(result.token_ids) == expected[4:8] and result.num_accepted == 3


def test_prefill_and_verify_run_in_one_step_for_different_requests(target, make_runner):
    server, stub = target
    first = prefill(stub, "old", PROMPT[:9])
    reference = make_runner()
    expected_old = greedy_decode(reference, PROMPT[:9], 3)
    results = verify(
        stub,
        [chunk("new", 0, PROMPT[9:], is_last=True)],
        [entry("old", 9, first, expected_old[1:3])],
    )
    assert [r.request_id for r in results] == ["new", "old"]
    assert list(results[0].token_ids) == greedy_decode(reference, PROMPT[9:], 1)
    assert (results[1].num_accepted, results[1].num_cached_tokens) == (2, 12)
    assert results[1].token_ids[:2] == expected_old[1:3]


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_out_of_sync_start_position_is_failed_precondition(target, where):
    server, stub = target
    if where == "prefill":
        verify(stub, [chunk("r1", 0, PROMPT)])  # not the last chunk
        request = ([chunk("r1", 3, [5], is_last=True)], [])
    else:
        first = prefill(stub, "r1", PROMPT)
        request = ([], [entry("r1", len(PROMPT) + 2, first, [4, 5])])
    error = entry_error(verify(stub, *request))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "request r1" in error.details()
    assert f"holds {len(PROMPT)}" in error.details()
    assert server.runner.seq_len("r1") == len(PROMPT)


def test_a_prefill_chunk_after_the_last_one_and_a_verify_before_it_are_refused(target):
    server, stub = target
    verify(stub, [chunk("early", 0, PROMPT)])  # prefill not finished
    error = entry_error(verify(stub, [], [entry("early", len(PROMPT), 5, [])]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "before its prefill finished" in error.details()
    prefill(stub, "done", PROMPT)
    error = entry_error(verify(stub, [chunk("done", len(PROMPT), [5, 6], is_last=True)]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already prefilled" in error.details()
    assert server.runner.seq_len("done") == len(PROMPT)


def sparse(ids, probs) -> common_pb2.SparseProbs:
    return common_pb2.SparseProbs(token_ids=ids, probs=probs)


def probs_with(change) -> list[common_pb2.SparseProbs]:
    """Two uniform rows over the whole vocabulary, changed."""
    q = np.full((2, VOCAB), 1.0 / VOCAB, dtype="<f4")
    change(q)
    return [sparse(range(VOCAB), row.tolist()) for row in q]


UNIFORM = sparse(range(VOCAB), [1.0 / VOCAB] * VOCAB)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda q: q.__setitem__((0, 9), -0.5), "finite and >= 0"),
        (lambda q: q.__setitem__((1, 9), np.inf), "finite and >= 0"),
        (lambda q: q.__setitem__((1, 9), np.nan), "finite and >= 0"),
        (lambda q: q.__setitem__(0, 0.0), "row 0 sums to 0"),
        (lambda q: q.__setitem__(1, 2.0 / VOCAB), "row 1 sums to 2"),
        (lambda q: (q.__setitem__((1, 5), 0.0), q.__setitem__((1, 6), 2.0 / VOCAB)), "token 5"),
        ([UNIFORM, sparse([4, 5, VOCAB], [0.5, 0.25, 0.25])], "outside [0, 256)"),
        ([UNIFORM, sparse([5, 4], [0.5, 0.5])], "must ascend"),
        ([UNIFORM, sparse([4, 5], [1.0])], "2 token ids and 1 probs"),
        ([UNIFORM], "1 distributions, expected one per proposal (K = 2)"),
    ],
)
def test_draft_probs_that_no_proposal_was_drawn_from_are_invalid(target, change, needle):
    server, stub = target
    first = prefill(stub, "r1", PROMPT)
    probs = change if isinstance(change, list) else probs_with(change)
    bad = entry("r1", len(PROMPT), first, [4, 5], probs, temperature=1.0)
    error = entry_error(verify(stub, [], [bad]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request r1: draft_probs" in error.details() and needle in error.details()
    assert server.runner.seq_len("r1") == len(PROMPT)


def test_a_bad_entry_fails_alone_and_the_rest_of_the_step_goes_on(target, make_runner):
    server, stub = target
    first = prefill(stub, "r1", PROMPT)
    results = verify(
        stub,
        [chunk("r2", 0, PROMPT, is_last=True)],
        [entry("r1", len(PROMPT), first, [4, VOCAB + 7])],
    )
    error = entry_error(results)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "263" in error.details() and "vocab size 256" in error.details()
    assert server.runner.seq_len("r1") == len(PROMPT)  # unchanged
    (healthy,) = [r for r in results if r.request_id == "r2"]
    assert list(healthy.token_ids) == greedy_decode(make_runner(), PROMPT, 1)


def test_an_entry_whose_sampling_parameters_do_not_parse_fails_alone(target):
    server, stub = target
    first = prefill(stub, "r1", PROMPT)
    results = verify(
        stub,
        [chunk("r2", 0, PROMPT, is_last=True, temperature=float("inf"))],
        [entry("r1", len(PROMPT), first, [4])],
    )
    assert entry_error(results).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not server.runner.has("r2")
    (healthy,) = [r for r in results if r.request_id == "r1"]
    assert healthy.num_cached_tokens == server.runner.seq_len("r1") > len(PROMPT)


def test_verify_for_unknown_request_is_not_found(target):
    _, stub = target
    error = entry_error(verify(stub, [], [entry("ghost", 0, 5, [1])]))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_sampled_verify_needs_a_draft_distribution_per_proposal(target):
    _, stub = target
    first = prefill(stub, "r1", PROMPT)
    error = entry_error(
        verify(stub, [], [entry("r1", len(PROMPT), first, [4, 5], temperature=1.0)])
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "holds 0 distributions" in error.details()
    # A distribution over a few tokens is enough when it is the one drawn from.
    few = [sparse([4, 9], [0.75, 0.25]), sparse([1, 5, 200], [0.5, 0.25, 0.25])]
    (ok,) = verify(stub, [], [entry("r1", len(PROMPT), first, [4, 5], few, temperature=1.0)])
    assert not ok.error_code and 1 <= len(ok.token_ids) <= 3


def test_sampled_verify_is_reproducible_with_a_seed(target):
    server, stub = target
    q = [UNIFORM] * 3
    outputs = []
    for rid in ("a", "b"):
        (first,) = verify(stub, [chunk(rid, 0, PROMPT, True, temperature=0.9, seed=7)])
        (result,) = verify(
            stub, [], [entry(rid, len(PROMPT), first.token_ids[0], [4, 5, 6], q, temperature=0.9)]
        )
        assert result.num_cached_tokens == len(PROMPT) + 1 + result.num_accepted
        assert server.runner.seq_len(rid) == result.num_cached_tokens
        outputs.append((list(first.token_ids), list(result.token_ids), result.num_accepted))
    assert outputs[0] == outputs[1]


def test_out_of_pages_is_resource_exhausted_and_opens_nothing(target):
    server, stub = target
    prefill(stub, "r1", PROMPT)
    free = server.runner.num_free_pages
    error = status_of(lambda: verify(stub, [chunk("big", 0, [3] * (4 * free + 1), True)]))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not server.runner.has("big")
    assert server.runner.num_free_pages == free


def test_health_is_serving_and_reflection_lists_the_services(target):
    server, stub = target
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", "specdec.v1.TargetService"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (response,) = list(reflection.ServerReflectionInfo(iter([request])))
    names = {s.name for s in response.list_services_response.service}
    assert {"specdec.v1.TargetService", "grpc.health.v1.Health"} <= names
    info = stub.GetInfo(common_pb2.InfoRequest())
    assert (info.kv_cache_dtype, info.kv_scales.version, info.kv_scales.dtype) == ("fp8", 1, "fp8")


@pytest.mark.parametrize("temperature", [1e-38, 1e-45])
def test_a_temperature_too_small_to_divide_by_is_greedy_at_the_target(
    target, make_runner, temperature
):
    _, stub = target
    (result,) = verify(stub, [chunk("t", 0, PROMPT, True, temperature=temperature, top_k=3)])
    assert list(result.token_ids) == greedy_decode(make_runner(), PROMPT, 1)


def test_sequences_nobody_touches_are_reclaimed_and_live_ones_stay(service_config, make_runner):
    config = dataclasses.replace(service_config, sequence_idle_timeout=0.6)
    server = ServerThread(create_server, config, make_runner())
    try:
        stub = target_pb2_grpc.TargetServiceStub(server.channel)
        free = server.runner.num_free_pages
        prefill(stub, "abandoned", PROMPT)
        first = prefill(stub, "live", PROMPT)
        deadline = time.monotonic() + 10
        while server.runner.has("abandoned") and time.monotonic() < deadline:
            # "live" keeps verifying (K = 0) while "abandoned" is never called again.
            (result,) = verify(stub, [], [entry("live", server.runner.seq_len("live"), first, [])])
            first = result.token_ids[0]
            time.sleep(0.05)
        assert not server.runner.has("abandoned") and server.runner.has("live")
        stub.Release(common_pb2.ReleaseRequest(request_ids=["live"]))
        assert server.runner.num_free_pages == free
    finally:
        server.close()


def test_a_sequence_belongs_to_the_coordinator_that_opened_it(target):
    server, stub = target
    a, b = (("x-specdec-coordinator", "a"),), (("x-specdec-coordinator", "b"),)
    opening = target_pb2.VerifyRequest(prefill=[chunk("r1", 0, PROMPT, True)])
    (first,) = stub.Verify(opening, metadata=a).results
    step = target_pb2.VerifyRequest(decode=[entry("r1", len(PROMPT), first.token_ids[0], [])])
    (foreign,) = stub.Verify(step, metadata=b).results
    assert foreign.error_code == "NOT_FOUND" and "another coordinator" in foreign.error_message
    stub.Release(common_pb2.ReleaseRequest(request_ids=["r1"]), metadata=b)  # ignored
    assert server.runner.seq_len("r1") == len(PROMPT)
    (own,) = stub.Verify(step, metadata=a).results
    assert not own.error_code and own.num_cached_tokens == len(PROMPT) + 1
    stub.Release(common_pb2.ReleaseRequest(request_ids=["r1"]), metadata=a)
    assert not server.runner.has("r1")


def test_release_all_of_caller_frees_only_that_coordinators_sequences(target):
    server, stub = target
    a, b = (("x-specdec-coordinator", "a"),), (("x-specdec-coordinator", "b"),)
    for rid, owner in (("a1", a), ("a2", a), ("b1", b)):
        stub.Verify(target_pb2.VerifyRequest(prefill=[chunk(rid, 0, PROMPT, True)]), metadata=owner)
    reply = stub.Release(common_pb2.ReleaseRequest(all_of_caller=True), metadata=a)
    assert reply.num_released == 2
    assert not server.runner.has("a1") and not server.runner.has("a2")
    assert server.runner.has("b1")
    stub.Release(common_pb2.ReleaseRequest(request_ids=["b1"]), metadata=b)


def test_verify_stream_answers_as_verify_and_keeps_the_callers_identity(target, make_runner):
    server, stub = target
    a, b = (("x-specdec-coordinator", "a"),), (("x-specdec-coordinator", "b"),)
    expected = greedy_decode(make_runner(), PROMPT, 3)
    opening = target_pb2.VerifyRequest(prefill=[chunk("r1", 0, PROMPT, True)])
    twice = target_pb2.VerifyRequest(decode=[entry("r1", 0, 1, []), entry("r1", 0, 1, [])])
    step = target_pb2.VerifyRequest(decode=[entry("r1", len(PROMPT), expected[0], expected[1:3])])
    replies = list(stub.VerifyStream(iter([opening, twice, step]), metadata=a, timeout=30))
    assert [r.WhichOneof("result") for r in replies] == ["response", "error", "response"]
    assert list(replies[0].response.results[0].token_ids) == expected[:1]
    # A malformed step is refused in its reply, with Verify's status; the stream goes on.
    assert replies[1].error.code == "INVALID_ARGUMENT"
    assert "appears twice" in replies[1].error.message
    (result,) = replies[2].response.results
    assert result.num_accepted == 2 and result.num_cached_tokens == len(PROMPT) + 3
    # The stream's metadata names its coordinator: another one cannot touch r1.
    (foreign,) = [r.response for r in stub.VerifyStream(iter([step]), metadata=b, timeout=30)]
    assert foreign.results[0].error_code == "NOT_FOUND"
    assert server.runner.seq_len("r1") == len(PROMPT) + 3


def test_a_verify_asking_for_fewer_threads_runs_on_them_and_gives_them_back(target, monkeypatch):
    """A coordinator whose draft computes beside the target asks it for fewer threads
    (VerifyRequest.num_threads): the forwards run on that many, the C kernels' and
    torch's, and the service's own count is back for the next call."""
    _, stub = target
    during: list[tuple[int, int]] = []
    verify_on_the_model_thread = Verifier.verify

    def spy(self, *args, **kwargs):
        during.append((dense_ops.num_threads(), torch.get_num_threads()))
        return verify_on_the_model_thread(self, *args, **kwargs)

    monkeypatch.setattr(Verifier, "verify", spy)
    own = (dense_ops.num_threads(), torch.get_num_threads())
    dense_ops.set_num_threads(2)
    torch.set_num_threads(2)
    try:
        first = prefill(stub, "r1", PROMPT, chunk_size=len(PROMPT))
        step = entry("r1", len(PROMPT), first, [])
        for num_threads in (1, 0, 5):
            request = target_pb2.VerifyRequest(decode=[step], num_threads=num_threads)
            (result,) = stub.Verify(request).results
            step = entry("r1", step.start_position + 1, result.token_ids[-1], [])
        # All (the prefill), at most one, all (0), all (never more than the service has).
        assert during == [(2, 2), (1, 1), (2, 2), (2, 2)]
        assert (dense_ops.num_threads(), torch.get_num_threads()) == (2, 2)
    finally:
        dense_ops.set_num_threads(own[0])
        torch.set_num_threads(own[1])
