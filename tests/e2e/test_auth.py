"""Authentication: the public API's key and the internal token of the model services."""

from __future__ import annotations

import grpc
import pytest
from e2e_stack import running_stack
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.client import CoordinatorClient, GenerateParams
from protos.specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

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
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "only the coordinator" in err.value.details()
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
