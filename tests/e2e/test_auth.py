"""Authentication, ownership and reclaim: the public API's key, the internal token of the
model services, sequences owned by their coordinator, idle sequences released."""

from __future__ import annotations

import sys
import threading
import time

import grpc
import pytest
from e2e_stack import TARGET, running_stack, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from specdec.auth import bearer, coordinator_credential
from specdec.client import CoordinatorClient, GenerateParams, generate_request
from specdec.launcher import ServiceProcess
from specdec.v1 import (
    common_pb2,
    coordinator_pb2_grpc,
    draft_pb2,
    draft_pb2_grpc,
    target_pb2,
    target_pb2_grpc,
)

KEY = "test-key-0123"
OTHER_KEY = "test-key-4567"
PARAMS = GenerateParams(max_tokens=8, ignore_eos=True)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def stack():
    with running_stack(api_key=f"{KEY},{OTHER_KEY}") as s:
        yield s


def resident_mib(stack, name: str) -> float:
    (process,) = [p for p in stack.processes if p.name == name]
    with open(f"/proc/{process.proc.pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("service", ["target", "draft"])
def test_unauthenticated_messages_are_refused_before_they_are_read(stack, service):
    address, method, message = {
        "target": (
            stack.target_address,
            "/specdec.v1.TargetService/Verify",
            target_pb2.VerifyRequest(
                prefill=[target_pb2.PrefillChunk(request_id="big", token_ids=[2**21] * 6_000_000)]
            ),
        ),
        "draft": (
            stack.draft_address,
            "/specdec.v1.DraftService/Step",
            draft_pb2.DraftStepRequest(
                ingest=[draft_pb2.IngestPlan(request_id="big", token_ids=[2**21] * 6_000_000)]
            ),
        ),
    }[service]
    payload = message.SerializeToString()
    assert 24_000_000 <= len(payload) < 24 * MIB  # 24 MB: under the tiny pair's limit
    before = resident_mib(stack, service)
    options = [("grpc.max_send_message_length", 64 * MIB)]
    with grpc.insecure_channel(address, options=options) as channel:
        call = channel.unary_unary(method)
        futures = [call.future(payload, timeout=60) for _ in range(16)]
        codes = [f.exception().code() if f.exception() else None for f in futures]
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 16
    assert resident_mib(stack, service) - before < 100


@pytest.mark.parametrize("key", ["", "wrong-key", KEY + "x"])
def test_the_public_api_refuses_a_missing_or_wrong_key(stack, prompt_ids, key):
    with CoordinatorClient(stack.address, api_key=key) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.generate(prompt_ids[0], PARAMS)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "API key" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            client.totals()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_key_opens_the_public_api_and_health_stays_open(stack, prompt_ids):
    with CoordinatorClient(stack.address, api_key=KEY) as client:
        assert len(client.generate(prompt_ids[0], PARAMS).token_ids) == 8
        assert client.totals().num_steps > 0
    with grpc.insecure_channel(stack.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("service", ["target", "draft"])
@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer guess"),)])
def test_the_model_services_refuse_callers_without_the_internal_token(stack, service, metadata):
    address, stub_cls = {
        "target": (stack.target_address, target_pb2_grpc.TargetServiceStub),
        "draft": (stack.draft_address, draft_pb2_grpc.DraftServiceStub),
    }[service]
    with grpc.insecure_channel(address) as channel:
        stub = stub_cls(channel)
        calls = [
            lambda: stub.GetInfo(common_pb2.InfoRequest(), timeout=10, metadata=metadata),
            lambda: stub.Release(
                common_pb2.ReleaseRequest(request_ids=["anyone"]), timeout=10, metadata=metadata
            ),
        ]
        if service == "target":
            calls.append(
                lambda: stub.Verify(target_pb2.VerifyRequest(), timeout=10, metadata=metadata)
            )
            stream = stub.VerifyStream
            first = target_pb2.VerifyRequest()
        else:
            stream = stub.StepStream
            first = draft_pb2.DraftStepRequest()
        # The per-step streams the coordinator uses are checked when they open.
        calls.append(lambda: list(stream(iter([first]), timeout=10, metadata=metadata)))
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "only the coordinator" in err.value.details()
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _verify(stub, request, owner: str, stack):
    metadata = (*stack.internal_metadata, ("x-specdec-coordinator", owner))
    return stub.Verify(request, timeout=30, metadata=metadata).results


def test_a_sequence_at_the_target_process_belongs_to_the_coordinator_that_opened_it(stack):
    prompt = [5, 6, 7, 8]
    with grpc.insecure_channel(stack.target_address) as channel:
        stub = target_pb2_grpc.TargetServiceStub(channel)
        opening = target_pb2.VerifyRequest(
            prefill=[target_pb2.PrefillChunk(request_id="mine", token_ids=prompt, is_last=True)]
        )
        (first,) = _verify(stub, opening, "coordinator-a", stack)
        step = target_pb2.VerifyRequest(
            decode=[
                target_pb2.VerifyEntry(
                    request_id="mine", start_position=len(prompt), last_token_id=first.token_ids[0]
                )
            ]
        )
        (foreign,) = _verify(stub, step, "coordinator-b", stack)
        assert foreign.error_code == "NOT_FOUND" and "another coordinator" in foreign.error_message
        release = common_pb2.ReleaseRequest(request_ids=["mine"])
        metadata_b = (*stack.internal_metadata, ("x-specdec-coordinator", "coordinator-b"))
        assert stub.Release(release, timeout=10, metadata=metadata_b).num_released == 0
        (own,) = _verify(stub, step, "coordinator-a", stack)
        assert not own.error_code and own.num_cached_tokens == len(prompt) + 1
        metadata_a = (*stack.internal_metadata, ("x-specdec-coordinator", "coordinator-a"))
        assert stub.Release(release, timeout=10, metadata=metadata_a).num_released == 1


def test_a_coordinator_credential_proves_its_name_and_cannot_claim_another(stack):
    def as_coordinator(name: str, claims: str) -> tuple[tuple[str, str], ...]:
        credential = coordinator_credential(stack.internal_token, name)
        return (bearer(credential), ("x-specdec-coordinator", claims))

    prompt = [5, 6, 7, 8]
    with grpc.insecure_channel(stack.target_address) as channel:
        stub = target_pb2_grpc.TargetServiceStub(channel)
        opening = target_pb2.VerifyRequest(
            prefill=[target_pb2.PrefillChunk(request_id="owned", token_ids=prompt, is_last=True)]
        )
        stub.Verify(opening, timeout=30, metadata=as_coordinator("coordinator-b", "b"))
        release = common_pb2.ReleaseRequest(request_ids=["owned"])
        # A holder of coordinator-a's credential claiming coordinator-b's name: still a.
        impostor = as_coordinator("coordinator-a", "coordinator-b")
        assert stub.Release(release, timeout=10, metadata=impostor).num_released == 0
        forged = (bearer("coordinator-b." + "0" * 64),)
        with pytest.raises(grpc.RpcError) as err:
            stub.Release(release, timeout=10, metadata=forged)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        owner = as_coordinator("coordinator-b", "anything")
        assert stub.Release(release, timeout=10, metadata=owner).num_released == 1


def test_a_target_process_releases_sequences_nobody_touches():
    argv = [
        sys.executable, "-m", "specdec.target_service", "--model", TARGET, "--port", "0",
        "--sequence-idle-timeout", "1",
    ]  # fmt: skip
    process = ServiceProcess("target", argv, echo=False)
    try:
        address = process.wait_ready(120)
        with grpc.insecure_channel(address) as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            chunk = target_pb2.PrefillChunk(request_id="pinned", token_ids=[5, 6, 7], is_last=True)
            stub.Verify(target_pb2.VerifyRequest(prefill=[chunk]), timeout=30)

            def held() -> int:
                return stub.GetInfo(common_pb2.InfoRequest(), timeout=10).num_sequences

            assert held() == 1
            assert wait_until(lambda: held() == 0, timeout=30)
    finally:
        process.stop()
    assert any("released 1 sequences idle" in line for line in process.lines)


def _stream(stack, api: str, key: str, prompt: list[int], max_tokens: int, outcome: dict):
    """Streams a greedy request named "shared" through ``api`` ("vllm" or "coordinator")
    with ``key``, counting tokens into ``outcome`` and how it ended."""
    with grpc.insecure_channel(stack.address) as channel:
        if api == "vllm":
            request = vllm_engine_pb2.GenerateRequest(
                request_id="shared",
                tokenized=vllm_engine_pb2.TokenizedInput(input_ids=prompt),
                sampling_params=vllm_engine_pb2.SamplingParams(
                    temperature=0, max_tokens=max_tokens, ignore_eos=True
                ),
                stream=True,
            )
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        else:
            params = GenerateParams(max_tokens=max_tokens, ignore_eos=True)
            request = generate_request(prompt, params, request_id="shared")
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        outcome["tokens"] = 0
        try:
            for reply in stub.Generate(request, timeout=120, metadata=(bearer(key),)):
                chunk = reply.chunk if api == "vllm" else reply
                outcome["tokens"] += len(chunk.token_ids)
            outcome["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            outcome["code"], outcome["details"] = e.code(), e.details()
        outcome["ended"] = time.monotonic()


def test_an_abort_ends_its_stream_and_reaches_no_other_api_or_key(stack, prompt_ids):
    prompt = prompt_ids[0]
    runs = {
        ("vllm", KEY, 1500): {},  # the one aborted
        ("vllm", OTHER_KEY, 400): {},  # the same id under another key
        ("coordinator", KEY, 400): {},  # the same id through the other API
    }
    threads = [
        threading.Thread(target=_stream, args=(stack, api, key, prompt, n, outcome))
        for (api, key, n), outcome in runs.items()
    ]
    for t in threads:
        t.start()
    assert wait_until(lambda: all(o.get("tokens", 0) > 0 for o in runs.values()), timeout=60)
    with grpc.insecure_channel(stack.address) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        aborted = time.monotonic()
        stub.Abort(vllm_engine_pb2.AbortRequest(request_ids=["shared"]), metadata=(bearer(KEY),))
    for t in threads:
        t.join(120)
    mine, other_key, other_api = runs.values()
    assert mine["code"] == grpc.StatusCode.CANCELLED, mine
    assert "'shared' was aborted: VllmEngine.Abort" in mine["details"]
    assert mine["ended"] - aborted < 1.0 and mine["tokens"] < 1500
    assert other_key["code"] == grpc.StatusCode.OK and other_key["tokens"] == 400
    assert other_api["code"] == grpc.StatusCode.OK and other_api["tokens"] == 400
