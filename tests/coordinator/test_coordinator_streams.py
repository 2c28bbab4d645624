"""The per-step calls over one long-lived stream (coordinator.streams), against a real
in-process gRPC server whose StepStream records what it was sent."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from specdec.coordinator.engine.core import Engine, status_of
from specdec.coordinator.engine.step_streams import StepRefused, StreamedStub
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

IDENTITY = (("x-specdec-coordinator", "c1"), ("authorization", "Bearer t"))
REFUSED_STEP = 13


class RecordingDraft(draft_pb2_grpc.DraftServiceServicer):
    """Answers each step with a proposal named after its step id; refuses REFUSED_STEP;
    sleeps before the steps in ``delays``."""

    def __init__(self) -> None:
        self.streams: list[dict[str, str]] = []  # each opened stream's metadata
        self.steps: list[tuple[int, dict[str, str]]] = []  # (step id, trace context)
        self.delays: dict[int, float] = {}

    async def StepStream(self, requests, context):
        self.streams.append(dict(context.invocation_metadata()))
        async for request in requests:
            self.steps.append((request.step_id, dict(request.trace_context)))
            await asyncio.sleep(self.delays.get(request.step_id, 0.0))
            if request.step_id == REFUSED_STEP:
                error = common_pb2.StepError(code="INVALID_ARGUMENT", message="bad step")
                yield draft_pb2.DraftStepReply(error=error)
                continue
            proposal = draft_pb2.Proposal(request_id=str(request.step_id))
            response = draft_pb2.DraftStepResponse(proposals=[proposal])
            yield draft_pb2.DraftStepReply(response=response)

    async def GetInfo(self, request, context):
        return common_pb2.ModelInfo(model="recording")


async def serve(fake: RecordingDraft, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    draft_pb2_grpc.add_DraftServiceServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def step(step_id: int) -> draft_pb2.DraftStepRequest:
    return draft_pb2.DraftStepRequest(step_id=step_id)


def answered(response: draft_pb2.DraftStepResponse) -> int:
    return int(response.proposals[0].request_id)


def run(scenario):
    async def main():
        fake = RecordingDraft()
        server, port = await serve(fake)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = StreamedStub(
            draft_pb2_grpc.DraftServiceStub(channel), "Step", "StepStream", IDENTITY
        )
        try:
            return await scenario(fake, stub, server, port)
        finally:
            await channel.close()
            await server.stop(0)

    return asyncio.run(main())


def test_steps_are_answered_in_order_and_the_other_rpcs_stay_unary():
    async def scenario(fake, stub, server, port):
        out = []
        for i in range(1, 6):
            trace = (("traceparent", f"00-{i:032x}-{i:016x}-01"),)
            out.append(answered(await stub.Step(step(i), timeout=5, metadata=trace)))
        info = await stub.GetInfo(common_pb2.InfoRequest())  # the other RPCs stay unary
        return out, info

    out, info = run(scenario)
    assert out == [1, 2, 3, 4, 5]
    assert info.model == "recording"


def test_one_stream_carries_identity_and_each_message_its_own_trace_context():
    async def scenario(fake, stub, server, port):
        for i in (1, 2):
            await stub.Step(step(i), timeout=5, metadata=(("traceparent", f"t{i}"),))
        return fake

    fake = run(scenario)
    assert len(fake.streams) == 1
    assert {k: fake.streams[0][k] for k, _ in IDENTITY} == dict(IDENTITY)
    assert fake.steps == [(1, {"traceparent": "t1"}), (2, {"traceparent": "t2"})]


def test_a_refused_step_raises_its_status_and_the_stream_goes_on():
    async def scenario(fake, stub, server, port):
        with pytest.raises(StepRefused) as refused:
            await stub.Step(step(REFUSED_STEP), timeout=5)
        after = answered(await stub.Step(step(14), timeout=5))
        return refused.value, after, len(fake.streams)

    error, after, num_streams = run(scenario)
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details() == "bad step"
    assert status_of(error) == ("INVALID_ARGUMENT", "bad step")  # as the engine reads it
    assert after == 14 and num_streams == 1


def test_a_timed_out_step_closes_the_stream_and_its_late_reply_is_never_read():
    async def scenario(fake, stub, server, port):
        fake.delays[2] = 1.0  # past the 0.01 s + 0.5 s the engine allows
        assert answered(await stub.Step(step(1), timeout=5)) == 1
        with pytest.raises(asyncio.TimeoutError):  # the engine's bound on every call
            await Engine._call(stub.Step, step(2), 0.01, ())
        third = answered(await stub.Step(step(3), timeout=5))
        return third, len(fake.streams)

    third, num_streams = run(scenario)
    assert third == 3  # not step 2's reply, which came late on the closed stream
    assert num_streams == 2


def test_a_restarted_service_is_reached_on_a_new_stream():
    async def scenario(fake, stub, server, port):
        assert answered(await stub.Step(step(1), timeout=5)) == 1
        await server.stop(0)
        with pytest.raises(grpc.RpcError) as down:
            await stub.Step(step(2), timeout=5)
        again = RecordingDraft()
        restarted, _ = await serve(again, port)
        try:
            for _ in range(50):  # the channel reconnects with backoff
                try:
                    return down.value.code(), answered(await stub.Step(step(3), timeout=5))
                except grpc.RpcError:
                    await asyncio.sleep(0.1)
            raise AssertionError("the restarted service was never reached")
        finally:
            await restarted.stop(0)

    code, third = run(scenario)
    # The stream breaks with the transport's status (a stopped server's GOAWAY: INTERNAL;
    # a killed process: UNAVAILABLE, tests/e2e/test_supervision.py); the engine then
    # treats the service as it would after a failed unary call.
    assert code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
    assert third == 3


def test_a_stream_that_ended_between_steps_fails_the_next_step_as_unavailable():
    """The service went away while no step was in flight: the next step finds its stream
    already finished. It must fail as an RpcError the engine handles (UNAVAILABLE: draft
    down, K = 0; target unavailable), not with the stream's InvalidStateError, which the
    engine would take for a bug and fail every running request with."""

    async def scenario(fake, stub, server, port):
        assert answered(await stub.Step(step(1), timeout=5)) == 1
        await server.stop(0)
        for _ in range(100):  # until the client has seen its stream end
            if stub.Step._stream.done():
                break
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.RpcError) as down:
            await stub.Step(step(2), timeout=5)
        return down.value

    error = run(scenario)
    assert status_of(error) == ("UNAVAILABLE", "the stream to the service ended between steps")
