"""Bad input at each API, through the running stack: a clear status naming the field, and
nothing lost: after every case a normal request gets the right output and no KV page
leaks on either model service.

The model services are called as a coordinator would (with the stack's internal token),
so these are the service's own checks, not the coordinator's. At the target, a malformed
step (no request id, one named twice) fails as a whole; any other bad entry fails alone,
with its status in its result. The draft does the same (and refuses a step whole when its
KV-scale table is unknown or inconsistent).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest
from e2e_stack import running_stack, service_info

from specdec.client import CoordinatorClient, GenerateParams
from specdec.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    draft_pb2,
    draft_pb2_grpc,
    target_pb2,
    target_pb2_grpc,
)

VOCAB = 4096
MAX_LEN = 2048
INVALID, PRECONDITION, NOT_FOUND = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
)
OK_PARAMS = GenerateParams(max_tokens=6, ignore_eos=True)


def sampling(**kw) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**kw)


def gen(**kw) -> coordinator_pb2.GenerateRequest:
    kw.setdefault("token_ids", coordinator_pb2.TokenIds(ids=[5, 6, 7]))
    return coordinator_pb2.GenerateRequest(**kw)


# ---- the public API: (request, status, words the message must hold) ------------------------
GENERATE_CASES = {
    "no prompt": (coordinator_pb2.GenerateRequest(), INVALID, "no prompt"),
    "empty token_ids": (gen(token_ids=coordinator_pb2.TokenIds()), INVALID, "empty prompt"),
    "empty text": (coordinator_pb2.GenerateRequest(text=""), INVALID, "empty prompt"),
    "token id = vocab": (
        gen(token_ids=coordinator_pb2.TokenIds(ids=[1, VOCAB])), INVALID, "out of range"
    ),
    "token id huge": (gen(token_ids=coordinator_pb2.TokenIds(ids=[2**31])), INVALID, "token id"),
    "temperature < 0": (gen(sampling=sampling(temperature=-1)), INVALID, "temperature"),
    "temperature inf": (gen(sampling=sampling(temperature=float("inf"))), INVALID, "temperature"),
    "temperature nan": (gen(sampling=sampling(temperature=float("nan"))), INVALID, "temperature"),
    "top_p > 1": (gen(sampling=sampling(top_p=1.5)), INVALID, "top_p"),
    "stop token id = vocab": (gen(stop_token_ids=[VOCAB]), INVALID, "stop_token_ids"),
    "request_id too long": (gen(request_id="r" * 300), INVALID, "request_id has 300"),
    "top_p < 0": (gen(sampling=sampling(top_p=-0.1)), INVALID, "top_p"),
    "top_p nan": (gen(sampling=sampling(top_p=float("nan"))), INVALID, "top_p"),
    "max_tokens past max_model_len": (gen(max_tokens=MAX_LEN), INVALID, "max_model_len"),
    "prompt past max_model_len": (
        gen(token_ids=coordinator_pb2.TokenIds(ids=[5] * MAX_LEN)), INVALID, "max_model_len"
    ),
    "messages without a chat template": (
        coordinator_pb2.GenerateRequest(
            messages=coordinator_pb2.ChatMessages(
                messages=[coordinator_pb2.ChatMessage(role="user", content="hi")]
            )
        ),
        INVALID,
        "chat template",
    ),
}  # fmt: skip


def chunk(rid, start, ids, is_last=False, **kw) -> target_pb2.PrefillChunk:
    return target_pb2.PrefillChunk(
        request_id=rid,
        start_position=start,
        token_ids=ids,
        is_last=is_last,
        sampling=sampling(**kw),
    )


def entry(rid, start, last, proposals=(), probs=(), **kw) -> target_pb2.VerifyEntry:
    return target_pb2.VerifyEntry(
        request_id=rid, start_position=start, last_token_id=last, proposal_ids=proposals,
        draft_probs=probs, sampling=sampling(**kw),
    )  # fmt: skip


def probs(change: Callable[[np.ndarray], object] = lambda q: None, rows: int = 2) -> list:
    """``rows`` uniform draft distributions over the vocabulary, changed."""
    q = np.full((rows, VOCAB), 1.0 / VOCAB, dtype="<f4")
    change(q)
    return [common_pb2.SparseProbs(token_ids=range(VOCAB), probs=row.tolist()) for row in q]


def setitem(index, value):
    return lambda q: q.__setitem__(index, value)


PROMPT = [5, 6, 7, 8]
OPEN = "open"  # prefilled by the fixture before each target case; holds len(PROMPT) tokens
PARTIAL = "partial"  # a prefill that has not had its last chunk
L = len(PROMPT)


def verify(prefill=(), decode=()) -> target_pb2.VerifyRequest:
    return target_pb2.VerifyRequest(prefill=prefill, decode=decode)


TARGET_CASES = {
    "empty request_id": (verify([chunk("", 0, [1], True)]), INVALID, "request_id"),
    "a request twice in a step": (
        verify([chunk("x", 0, [1]), chunk("x", 1, [2], True)]), INVALID, "twice"
    ),
    "prefill start past what is held": (
        verify([chunk("y", 3, [1], True)]), PRECONDITION, "holds 0"
    ),
    "prefill token out of range": (verify([chunk("y", 0, [VOCAB], True)]), INVALID, "out of range"),
    "empty last chunk": (verify([chunk("y", 0, [], True)]), INVALID, "empty"),
    "prefill past max_model_len": (
        verify([chunk("y", 0, [1] * (MAX_LEN + 1), True)]), INVALID, "max_model_len"
    ),
    "prefill temperature inf": (
        verify([chunk("y", 0, [1], True, temperature=float("inf"))]), INVALID, "temperature"
    ),
    "prefill top_p > 1": (verify([chunk("y", 0, [1], True, top_p=2.0)]), INVALID, "top_p"),
    "a chunk after the last one": (
        verify([chunk(OPEN, L, [1], True)]), PRECONDITION, "already prefilled"
    ),
    "verify an unknown request": (verify([], [entry("ghost", 0, 1)]), NOT_FOUND, "ghost"),
    "verify before the prefill finished": (
        verify([], [entry(PARTIAL, L, 1)]), PRECONDITION, "prefill finished"
    ),
    "verify start mismatch": (verify([], [entry(OPEN, L + 3, 1)]), PRECONDITION, "holds"),
    "proposal out of range": (verify([], [entry(OPEN, L, 1, [VOCAB])]), INVALID, "out of range"),
    "last token out of range": (verify([], [entry(OPEN, L, VOCAB)]), INVALID, "out of range"),
    "K past max_model_len": (
        verify([], [entry(OPEN, L, 1, [1] * MAX_LEN)]), INVALID, "max_model_len"
    ),
    "sampled verify without draft_probs": (
        verify([], [entry(OPEN, L, 1, [1, 2], temperature=1.0)]), INVALID, "draft_probs"
    ),
    "draft_probs of the wrong size": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(rows=1), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "draft_probs naming a token outside the vocabulary": (
        verify([], [entry(OPEN, L, 1, [1, 2], [common_pb2.SparseProbs(
            token_ids=[1, 2, VOCAB], probs=[0.5, 0.25, 0.25])] * 2, temperature=1.0)]),
        INVALID, "outside",
    ),
    "negative draft_probs": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(setitem((0, 9), -0.5)), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "infinite draft_probs": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(setitem((0, 9), np.inf)), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "NaN draft_probs": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(setitem((1, 9), np.nan)), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "zero draft_probs": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(setitem(0, 0.0)), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "draft_probs rows summing to 2": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(setitem(1, 2.0 / VOCAB)), temperature=1.0)]),
        INVALID, "draft_probs",
    ),
    "a proposal of draft probability 0": (
        verify([], [entry(OPEN, L, 1, [1, 2], probs(lambda q: (
            q.__setitem__((1, 2), 0.0), q.__setitem__((1, 3), 2.0 / VOCAB)
        )), temperature=1.0)]),
        INVALID, "probability 0",
    ),
    "verify temperature < 0": (
        verify([], [entry(OPEN, L, 1, temperature=-2.0)]), INVALID, "temperature"
    ),
}  # fmt: skip


def step(ingest=(), propose=(), version=0, table=None) -> draft_pb2.DraftStepRequest:
    return draft_pb2.DraftStepRequest(
        kv_scales_version=version, kv_scales=table, ingest=ingest, propose=propose
    )


def plan(rid, start, ids) -> draft_pb2.IngestPlan:
    return draft_pb2.IngestPlan(request_id=rid, start_position=start, token_ids=ids)


def propose(rid, k, **kw) -> draft_pb2.ProposeEntry:
    return draft_pb2.ProposeEntry(request_id=rid, num_tokens=k, sampling=sampling(**kw))


DRAFT_CASES = {
    "ingest empty request_id": (step([plan("", 0, [1])]), INVALID, "request_id"),
    "ingest a request twice": (step([plan("d", 0, [1]), plan("d", 1, [2])]), INVALID, "twice"),
    "ingest start past what is held": (step([plan("d", 5, [1])]), PRECONDITION, "holds 0"),
    "ingest token out of range": (step([plan("d", 0, [VOCAB])]), INVALID, "out of range"),
    "ingest past max_model_len": (
        step([plan("d", 0, [1] * (MAX_LEN + 1))]), INVALID, "max_model_len"
    ),
    "propose 0 tokens": (step([plan("d", 0, [1])], [propose("d", 0)]), INVALID, "num_tokens"),
    "propose for an unknown request": (step([], [propose("ghost", 2)]), NOT_FOUND, "ghost"),
    "propose twice in a step": (
        step([plan("d", 0, [1])], [propose("d", 1), propose("d", 1)]), INVALID, "twice"
    ),
    "propose past max_model_len": (
        step([plan("d", 0, [1])], [propose("d", MAX_LEN)]), INVALID, "max_model_len"
    ),
    "propose temperature < 0": (
        step([plan("d", 0, [1])], [propose("d", 2, temperature=-1.0)]), INVALID, "temperature"
    ),
    "unknown KV-scale version without its table": (
        step([plan("d", 0, [1])], version=99), PRECONDITION, "version 99"
    ),
    "table version differs from the step's": (
        step([plan("d", 0, [1])], version=98, table=common_pb2.KVScaleTable(version=97)),
        INVALID, "version",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def stack():
    with running_stack(speculative_config='{"num_speculative_tokens": 3}') as s:
        yield s


@pytest.fixture(scope="module")
def healthy(stack):
    """A normal request's output, and each service's free pages while nothing runs."""
    pages = free_pages(stack)
    with CoordinatorClient(stack.address) as client:
        tokens = client.generate(PROMPT, OK_PARAMS).token_ids
    return tokens, pages


def free_pages(stack) -> tuple[int, int]:
    return (
        service_info(stack, draft=False).num_free_pages,
        service_info(stack, draft=True).num_free_pages,
    )


def expect(call: Callable[[], object], code: grpc.StatusCode, needle: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    assert needle in err.value.details()


def refusal(call: Callable[[], list[tuple[str, str]]]) -> tuple[grpc.StatusCode, str]:
    """(code, message) of a refused call: the RPC's status when the step fails whole, else
    its one failed entry's (``call`` returns the (code name, message) of each)."""
    try:
        ((code, message),) = call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode[code], message


def still_serving(stack, healthy) -> None:
    tokens, pages = healthy
    with CoordinatorClient(stack.address) as client:
        assert client.generate(PROMPT, OK_PARAMS).token_ids == tokens
    # The coordinator releases a finished request before its next step, just after the
    # stream ends: give it a moment, then every page must be back.
    deadline = time.monotonic() + 10
    while free_pages(stack) != pages and time.monotonic() < deadline:
        time.sleep(0.05)
    assert free_pages(stack) == pages


@pytest.mark.parametrize("case", list(GENERATE_CASES))
def test_generate_refuses_bad_input(stack, healthy, case):
    request, code, needle = GENERATE_CASES[case]
    with grpc.insecure_channel(stack.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        expect(lambda: list(stub.Generate(request, timeout=30)), code, needle)
    still_serving(stack, healthy)


@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_verify_refuses_bad_input(stack, healthy, case):
    request, code, needle = TARGET_CASES[case]
    meta = stack.internal_metadata
    with grpc.insecure_channel(stack.target_address) as channel:
        stub = target_pb2_grpc.TargetServiceStub(channel)
        stub.Verify(
            verify([chunk(OPEN, 0, PROMPT, True), chunk(PARTIAL, 0, PROMPT)]), metadata=meta
        )
        try:
            got = refusal(
                lambda: [
                    (r.error_code, r.error_message)
                    for r in stub.Verify(request, timeout=30, metadata=meta).results
                    if r.error_code
                ]
            )
            assert got[0] == code and needle in got[1], got
            # A refused step changed nothing: both sequences hold what they held.
            info = service_info(stack, draft=False)
            assert info.num_sequences == 2
        finally:
            release = common_pb2.ReleaseRequest(request_ids=[OPEN, PARTIAL])
            stub.Release(release, timeout=10, metadata=meta)
    still_serving(stack, healthy)


@pytest.mark.parametrize("case", list(DRAFT_CASES))
def test_draft_step_refuses_bad_input(stack, healthy, case):
    request, code, needle = DRAFT_CASES[case]
    meta = stack.internal_metadata
    with grpc.insecure_channel(stack.draft_address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        try:
            got = refusal(
                lambda: [
                    (f.code, f.message)
                    for f in stub.Step(request, timeout=30, metadata=meta).failed
                ]
            )
            assert got[0] == code and needle in got[1], got
            assert service_info(stack, draft=True).num_sequences == 0
        finally:
            stub.Release(common_pb2.ReleaseRequest(request_ids=["d"]), timeout=10, metadata=meta)
    still_serving(stack, healthy)


def test_the_table_has_at_least_forty_cases():
    assert len(GENERATE_CASES) + len(TARGET_CASES) + len(DRAFT_CASES) + 1 >= 40


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"\x12\x02\xff\xfe", "must be valid UTF-8"),  # GenerateRequest.text = bytes ff fe
        (b"\x12\x10abc", "not a whole protobuf message (truncated"),  # 16 bytes said, 3 sent
    ],
)
def test_generate_says_why_a_request_does_not_parse(stack, healthy, raw, words):
    with grpc.insecure_channel(stack.address) as channel:
        generate = channel.unary_stream(
            "/specdec.v1.Coordinator/Generate",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        expect(lambda: list(generate(raw, timeout=30)), INVALID, words)
    still_serving(stack, healthy)


def test_a_64_mib_request_is_resource_exhausted(stack, healthy):
    huge = coordinator_pb2.GenerateRequest(text="x" * (64 * 1024 * 1024))
    with grpc.insecure_channel(stack.address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        expect(
            lambda: list(stub.Generate(huge, timeout=60)), grpc.StatusCode.RESOURCE_EXHAUSTED, ""
        )
    still_serving(stack, healthy)
