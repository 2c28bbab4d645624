"""In-process fake draft and target services for coordinator tests (no torch).

The fake target is a deterministic "model": after a log of n tokens its greedy token is
`next_token(n)`. The fake draft proposes `next_token` too, except at positions listed in
`wrong_positions`, so acceptance is predictable. Both keep per-request state, check
start positions like the real services and record every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from specdec.coordinator.api.prompts import PromptEncoder
from specdec.coordinator.api.server import build_request
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

VOCAB = 100
MAX_MODEL_LEN = 64
EOS = 99
# The speculative config the engine and server tests are written for: a fixed K = 4.
FIXED_K4 = '{"num_speculative_tokens": 4}'


def next_token(n: int) -> int:
    """The target's greedy token after n committed tokens (never EOS)."""
    return (n * 7 + 3) % 97


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def model_info(num_layers: int = 2) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model="fake",
        vocab_size=VOCAB,
        max_model_len=MAX_MODEL_LEN,
        eos_token_ids=[EOS],
        num_layers=num_layers,
        kv_scales=common_pb2.KVScaleTable(
            version=7, dtype="fp8", k_scale=[1.0] * num_layers, v_scale=[1.0] * num_layers
        ),
    )


class FakePool:
    """A service's KV pages: a sequence of n tokens holds ceil(n / page_size) pages, and a
    step that would need more pages than there are is refused whole (RESOURCE_EXHAUSTED)
    before anything changes, as the services refuse it."""

    def __init__(self, num_pages: int, page_size: int = 4) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.peak_used = 0  # the most pages the sequences ever held at once
        self.num_refused = 0

    def used(self, lens: dict[str, int]) -> int:
        return sum(-(-n // self.page_size) for n in lens.values())

    def check(self, lens: dict[str, int], peaks: dict[str, int]) -> None:
        """Refuses a step whose sequences would reach ``peaks`` lengths."""
        used = self.used({**lens, **peaks})
        if used > self.num_pages:
            self.num_refused += 1
            raise rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"KV cache is full ({used})")
        self.peak_used = max(self.peak_used, used)

    def info(self, lens: dict[str, int]) -> common_pb2.ModelInfo:
        info = model_info()
        info.num_total_pages, info.page_size = self.num_pages, self.page_size
        info.num_free_pages = self.num_pages - self.used(lens)
        return info


class FakeTarget:
    def __init__(
        self,
        delay: float | Callable[[target_pb2.VerifyRequest], float] = 0.0,
        pool: FakePool | None = None,
    ) -> None:
        self.pool = pool
        self.held: dict[str, int] = {}
        self.requests: list[target_pb2.VerifyRequest] = []
        self.released: list[str] = []
        self.errors: list[grpc.aio.AioRpcError] = []  # raised by the next Verify calls
        self.override: dict[int, int] = {}  # position -> token, to plant an EOS
        self.entry_errors: dict[str, tuple[str, str]] = {}  # request -> (code, message)
        self.metadata: list[dict[str, str]] = []  # gRPC metadata of each Verify
        self.delay = delay
        self.release_delay = 0.0  # seconds a Release takes before it takes effect
        self.ended_bursts: list[int] = []  # EndBurst's step ids
        # Model work, GetInfo's included, runs one call at a time, as on the real service.
        self.model_thread = asyncio.Lock()

    def token_at(self, n: int) -> int:
        return self.override.get(n, next_token(n))

    async def Verify(self, request, timeout=None, metadata=None):
        self.requests.append(request)
        self.metadata.append(dict(metadata or ()))
        delay = self.delay(request) if callable(self.delay) else self.delay
        if delay:
            async with self.model_thread:
                await asyncio.sleep(delay)
        if self.errors:
            raise self.errors.pop(0)
        if self.pool is not None:
            peaks = {c.request_id: c.start_position + len(c.token_ids) for c in request.prefill}
            peaks.update(
                {e.request_id: e.start_position + 1 + len(e.proposal_ids) for e in request.decode}
            )
            self.pool.check(self.held, peaks)
        results = []
        for chunk in request.prefill:
            held = self.held.get(chunk.request_id, 0)
            if chunk.start_position != held:
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "bad prefill start")
            held += len(chunk.token_ids)
            self.held[chunk.request_id] = held
            tokens = [self.token_at(held)] if chunk.is_last else []
            results.append(
                target_pb2.VerifyResult(
                    request_id=chunk.request_id, token_ids=tokens, num_cached_tokens=held
                )
            )
        for entry in request.decode:
            if entry.request_id in self.entry_errors:  # fails alone, as the real target does
                code, message = self.entry_errors[entry.request_id]
                results.append(
                    target_pb2.VerifyResult(
                        request_id=entry.request_id, error_code=code, error_message=message
                    )
                )
                continue
            held = self.held.get(entry.request_id)
            if held != entry.start_position:
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "bad decode start")
            committed = held + 1
            accepted = 0
            for i, proposal in enumerate(entry.proposal_ids):
                if proposal != self.token_at(committed + i):
                    break
                accepted += 1
            tokens = list(entry.proposal_ids[:accepted]) + [self.token_at(committed + accepted)]
            self.held[entry.request_id] = committed + accepted
            results.append(
                target_pb2.VerifyResult(
                    request_id=entry.request_id,
                    token_ids=tokens,
                    num_accepted=accepted,
                    num_cached_tokens=committed + accepted,
                )
            )
        response = target_pb2.VerifyResponse(results=results)
        if self.pool is not None:
            response.num_free_pages = self.pool.num_pages - self.pool.used(self.held)
        return response

    async def Release(self, request, timeout=None, metadata=None):
        await asyncio.sleep(self.release_delay)
        self.released.extend(request.request_ids)
        for rid in request.request_ids:
            self.held.pop(rid, None)
        reply = common_pb2.ReleaseResponse(num_released=len(request.request_ids))
        if self.pool is not None:
            reply.num_free_pages = self.pool.num_pages - self.pool.used(self.held)
        return reply

    async def GetInfo(self, request, timeout=None, metadata=None, wait_for_ready=None):
        async with self.model_thread:
            return self.pool.info(self.held) if self.pool else model_info()

    async def EndBurst(self, request, timeout=None, metadata=None):
        self.ended_bursts.append(request.step_id)
        return target_pb2.EndBurstResponse(ended=True)


class FakeDraft:
    def __init__(
        self,
        wrong_positions: frozenset[int] = frozenset(),
        max_proposals: int | None = None,
        pool: FakePool | None = None,
    ) -> None:
        self.pool = pool  # its sequences hold their logs, and propose past them
        self.max_proposals = max_proposals  # a draft that stops early (--draft-p-min)
        self.logs: dict[str, list[int]] = {}
        self.released_logs: dict[str, list[int]] = {}  # what it held when released
        self.requests: list[draft_pb2.DraftStepRequest] = []
        self.releases: list[list[str]] = []
        self.errors: list[BaseException] = []  # raised by the next Step calls
        self.wrong_positions = wrong_positions
        self.kv_version: int | None = None
        self.failed_request: draft_pb2.DraftStepRequest | None = None
        self.refuse_once: set[str] = set()  # requests the next step refuses alone
        self.fail_after_ingest = False  # raise the next error only after ingesting the plans

    def guess(self, n: int) -> int:
        """The draft's token after n tokens: the target's, except at wrong_positions."""
        return (next_token(n) + 1) % 97 if n in self.wrong_positions else next_token(n)

    async def Step(self, request, timeout=None, metadata=None):
        self.requests.append(request)
        if self.errors and not self.fail_after_ingest:
            self.failed_request = request
            raise self.errors.pop(0)
        if request.HasField("kv_scales"):
            self.kv_version = request.kv_scales.version
        if request.kv_scales_version != self.kv_version:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "kv scales version mismatch")
        refused = self.refuse_once & (
            {p.request_id for p in request.ingest} | {p.request_id for p in request.propose}
        )
        self.refuse_once -= refused
        failed = [
            draft_pb2.RequestError(request_id=rid, code="INVALID_ARGUMENT", message="planted")
            for rid in sorted(refused)
        ]
        if self.pool is not None:
            peaks = self.lens()
            for plan in request.ingest:
                peaks[plan.request_id] = plan.start_position + len(plan.token_ids)
            for entry in request.propose:
                peaks[entry.request_id] += len(entry.ahead_of) + entry.num_tokens + 1
            self.pool.check({}, peaks)
        for plan in request.ingest:
            if plan.request_id in refused:
                continue
            log = self.logs.setdefault(plan.request_id, [])
            if plan.start_position != len(log):
                raise rpc_error(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{plan.request_id}: start {plan.start_position} != held {len(log)}",
                )
            log.extend(plan.token_ids)
        proposals = []
        for entry in request.propose:
            if entry.request_id in refused:
                continue
            # Ahead (pipelining): after the ahead_of tokens and a guess of the next one.
            n = len(self.logs[entry.request_id]) + len(entry.ahead_of)
            proposal = draft_pb2.Proposal(request_id=entry.request_id)
            if entry.ahead_of:
                proposal.guessed_token_id = self.guess(n)
                n += 1
            num = min(entry.num_tokens, self.max_proposals or entry.num_tokens)
            proposal.token_ids.extend(self.guess(n + i) for i in range(num))
            proposals.append(proposal)
            # Branches: ahead_of[a] rejected, the target's token guessed right.
            held = len(self.logs[entry.request_id])
            for a in range(min(entry.num_branches - 1, len(entry.ahead_of))):
                branch = draft_pb2.Proposal(
                    request_id=entry.request_id,
                    guessed_token_id=next_token(held + a),
                    ahead_accepted=a,
                )
                branch.token_ids.extend(self.guess(held + a + 1 + i) for i in range(num))
                proposals.append(branch)
        touched = {p.request_id for p in request.ingest} | {p.request_id for p in request.propose}
        touched -= refused
        cached = [
            common_pb2.CachedLength(request_id=rid, num_cached_tokens=len(self.logs[rid]))
            for rid in sorted(touched)
        ]
        if self.errors:  # fail_after_ingest: the plans above were kept
            self.failed_request = request
            raise self.errors.pop(0)
        response = draft_pb2.DraftStepResponse(proposals=proposals, cached=cached, failed=failed)
        if self.pool is not None:
            response.num_free_pages = self.pool.num_pages - self.pool.used(self.lens())
        return response

    def lens(self) -> dict[str, int]:
        return {rid: len(log) for rid, log in self.logs.items()}

    async def Release(self, request, timeout=None, metadata=None):
        self.releases.append(list(request.request_ids))
        for rid in request.request_ids:
            if rid in self.logs:
                self.released_logs[rid] = self.logs.pop(rid)
        reply = common_pb2.ReleaseResponse(num_released=len(request.request_ids))
        if self.pool is not None:
            reply.num_free_pages = self.pool.num_pages - self.pool.used(self.lens())
        return reply

    async def GetInfo(self, request, timeout=None, metadata=None, wait_for_ready=None):
        return self.pool.info(self.lens()) if self.pool else model_info()


async def _serve_call(context, call):
    try:
        return await call
    except grpc.aio.AioRpcError as e:
        await context.abort(e.code(), e.details())


async def _serve_stream(requests, answer, reply_type):
    """A per-step stream over a fake's unary method: a refused step is refused in its reply."""
    async for request in requests:
        try:
            yield reply_type(response=await answer(request))
        except grpc.aio.AioRpcError as e:
            yield reply_type(error=common_pb2.StepError(code=e.code().name, message=e.details()))


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    """Serves a FakeDraft over real gRPC."""

    def __init__(self, fake: FakeDraft) -> None:
        self.fake = fake

    async def Step(self, request, context):
        return await _serve_call(context, self.fake.Step(request))

    async def StepStream(self, requests, context):
        async for reply in _serve_stream(requests, self.fake.Step, draft_pb2.DraftStepReply):
            yield reply

    async def Release(self, request, context):
        return await _serve_call(context, self.fake.Release(request))

    async def GetInfo(self, request, context):
        return await self.fake.GetInfo(request)


class TargetServicer(target_pb2_grpc.TargetServiceServicer):
    def __init__(self, fake: FakeTarget) -> None:
        self.fake = fake

    async def Verify(self, request, context):
        return await _serve_call(context, self.fake.Verify(request))

    async def VerifyStream(self, requests, context):
        async for reply in _serve_stream(requests, self.fake.Verify, target_pb2.VerifyReply):
            yield reply

    async def Release(self, request, context):
        return await _serve_call(context, self.fake.Release(request))

    async def GetInfo(self, request, context):
        return await self.fake.GetInfo(request)


def build(limits, message, tokenizer=None, template=None, scope=""):
    """``server.build_request`` as the Coordinator servicer calls it."""
    encoder = PromptEncoder(tokenizer, template, limits.max_model_len) if tokenizer else None
    return asyncio.run(build_request(message, encoder, limits, scope))
