"""Authentication, ownership and reclaim: the public API's key, the internal token of the
model services, sequences owned by their coordinator, idle sequences released."""

from __future__ import annotations

import sys

import grpc
import pytest
from e2e_stack import TARGET, running_stack, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.client import CoordinatorClient, GenerateParams
from coordinator.launcher import ServiceProcess
from protos.specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

KEY = "test-key-0123"
PARAMS = GenerateParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def stack():
    with running_stack(api_key=KEY) as s:
        yield s


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


def test_a_target_process_releases_sequences_nobody_touches():
    argv = [
        sys.executable, "-m", "target_service", "--model", TARGET, "--port", "0",
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
