"""The public API over real gRPC on loopback, with fake draft/target servers in-process."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from coordinator_fakes import (
    FIXED_K4,
    DraftServicer,
    FakeDraft,
    FakeTarget,
    TargetServicer,
    model_info,
    next_token,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specdec.coordinator.api.server import create_server
from specdec.coordinator.engine.config import CoordinatorConfig
from specdec.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    draft_pb2_grpc,
    target_pb2_grpc,
)


@contextlib.asynccontextmanager
async def stack(
    draft: FakeDraft, target: FakeTarget, services_health: HealthServicer | None = None, **config
):
    """A coordinator over the fakes, both served by one server whose gRPC health is
    ``services_health`` (SERVING unless the test sets it)."""
    services = grpc.aio.server()
    draft_pb2_grpc.add_DraftServiceServicer_to_server(DraftServicer(draft), services)
    target_pb2_grpc.add_TargetServiceServicer_to_server(TargetServicer(target), services)
    health_pb2_grpc.add_HealthServicer_to_server(services_health or HealthServicer(), services)
    draft_port = services.add_insecure_port("127.0.0.1:0")
    # One server can serve both services; give the target its own port anyway.
    target_port = services.add_insecure_port("127.0.0.1:0")
    await services.start()
    config = CoordinatorConfig(
        port=0,
        draft=f"127.0.0.1:{draft_port}",
        target=f"127.0.0.1:{target_port}",
        connect_timeout=5.0,
        **{"speculative_config": FIXED_K4, **config},  # what the fakes' scenarios assume
    )
    try:
        server, port = await create_server(config)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield coordinator_pb2_grpc.CoordinatorStub(channel), channel
        finally:
            await channel.close()
            await server.stop(0)
    finally:
        await services.stop(0)


HealthServicer = aio.HealthServicer
SERVING, NOT_SERVING = (
    health_pb2.HealthCheckResponse.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING,
)


def byte_tokenizer_file(tmp_path) -> str:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path)


def test_generate_streams_deltas_text_and_final_stats(tmp_path):
    draft, target = FakeDraft(wrong_positions=frozenset({10})), FakeTarget()

    async def scenario():
        async with stack(draft, target, tokenizer=byte_tokenizer_file(tmp_path)) as (stub, ch):
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            request = coordinator_pb2.GenerateRequest(request_id="r1", text="abc", max_tokens=10)
            messages = [m async for m in stub.Generate(request)]
            totals = await stub.GetStats(coordinator_pb2.StatsRequest())
            return health, messages, totals

    health, messages, totals = asyncio.run(scenario())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    tokens = [t for m in messages for t in m.token_ids]
    assert tokens == [next_token(n) for n in range(3, 13)]
    assert all(m.request_id == "r1" and m.num_prompt_tokens == 3 for m in messages)
    last = messages[-1]
    assert last.finish_reason == "length" and all(not m.finish_reason for m in messages[:-1])
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert "".join(m.text for m in messages) == tok.decode(tokens)
    assert last.stats.num_drafts > 0 and last.stats.num_ingest_plans > 0
    assert last.stats.num_accepted_tokens < last.stats.num_draft_tokens
    assert totals.num_draft_tokens == last.stats.num_draft_tokens
    assert totals.num_accepted_tokens == last.stats.num_accepted_tokens


@pytest.mark.parametrize(
    ("request_kwargs", "detail"),
    [
        ({"token_ids": coordinator_pb2.TokenIds(ids=[1, 500])}, "out of range"),
        ({"text": "hello"}, "tokenizer"),
        (
            {
                "token_ids": coordinator_pb2.TokenIds(ids=[1]),
                "sampling": common_pb2.SamplingParams(temperature=-1),
            },
            "temperature",
        ),
    ],
)
def test_bad_input_is_invalid_argument(request_kwargs, detail):
    async def scenario():
        async with stack(FakeDraft(), FakeTarget()) as (stub, _):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Generate(coordinator_pb2.GenerateRequest(**request_kwargs)):
                    pass
            return info.value

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in error.details()


def test_client_cancel_releases_kv_on_both_services():
    draft, target = FakeDraft(), FakeTarget(delay=0.02)

    async def scenario():
        async with stack(draft, target) as (stub, _):
            call = stub.Generate(
                coordinator_pb2.GenerateRequest(
                    request_id="c1",
                    token_ids=coordinator_pb2.TokenIds(ids=[1, 2, 3]),
                    ignore_eos=True,
                )
            )
            await call.read()
            call.cancel()
            for _ in range(200):
                if held in target.released and any(held in ids for ids in draft.releases):
                    break
                await asyncio.sleep(0.01)

    held = "coordinator/c1"  # the services see the id in the API's scope
    asyncio.run(scenario())
    assert held in target.released and any(held in ids for ids in draft.releases)
    assert held not in target.held and held not in draft.logs


def test_vocab_mismatch_between_draft_and_target_is_a_startup_error():
    draft = FakeDraft()

    async def other_vocab(request, timeout=None, metadata=None, wait_for_ready=None):
        info = model_info()
        info.vocab_size = 101
        return info

    draft.GetInfo = other_vocab

    async def scenario():
        async with stack(draft, FakeTarget()):
            pass

    with pytest.raises(RuntimeError, match="vocab size"):
        asyncio.run(scenario())


async def collect(call) -> list:
    return [m async for m in call]


class CountingHealth(HealthServicer):
    """A health servicer that counts the checks it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.num_checks = 0

    async def Check(self, request, context):
        self.num_checks += 1
        return await super().Check(request, context)


def test_a_long_target_step_is_no_outage_but_a_target_not_serving_is():
    # One step takes 2 s; GetInfo waits behind it, so only the target's gRPC health can
    # tell the coordinator, within its probe deadline, that the target is there.
    target_health = CountingHealth()
    prompt = coordinator_pb2.TokenIds(ids=[1, 2, 3])
    probes = {"target_probe_interval": 0.05}

    async def scenario():
        async with stack(FakeDraft(), FakeTarget(delay=2.0), target_health, **probes) as (
            stub,
            ch,
        ):
            own_health = health_pb2_grpc.HealthStub(ch)

            async def health() -> int:
                return (await own_health.Check(health_pb2.HealthCheckRequest())).status

            async def becomes(status: int) -> bool:
                for _ in range(50):
                    if await health() == status:
                        return True
                    await asyncio.sleep(0.1)
                return False

            call = stub.Generate(coordinator_pb2.GenerateRequest(token_ids=prompt, max_tokens=1))
            replies = asyncio.ensure_future(collect(call))  # the step is under way
            checks = target_health.num_checks

            async def probed_during_the_step() -> None:
                while target_health.num_checks < checks + 3:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(probed_during_the_step(), timeout=1.5)  # the step takes 2 s
            assert not replies.done()
            assert await health() == SERVING
            assert (await replies)[-1].finish_reason == "length"
            await target_health.set("", NOT_SERVING)
            went_down = await becomes(NOT_SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in stub.Generate(coordinator_pb2.GenerateRequest(token_ids=prompt)):
                    pass
            await target_health.set("", SERVING)
            return went_down, refused.value, await becomes(SERVING)

    went_down, refused, came_back = asyncio.run(scenario())
    assert went_down and came_back
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "not answering" in refused.details()
