"""The RPCs both model services share: claim, release, reclaim, step streams."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import grpc

from specdec.auth import INTERNAL_TOKEN_ENV, OWNER_KEY, proven_name
from specdec.model_service.executor import ModelExecutor
from specdec.model_service.status import refusal
from specdec.runtime.errors import UnknownRequestError
from specdec.runtime.model_runner import ModelRunner
from specdec.v1 import common_pb2

log = logging.getLogger(__name__)


class ServedModel(Protocol):
    """What a service serves: the drafter or the verifier, over one runner."""

    runner: ModelRunner

    def release(self, request_ids: list[str]) -> int: ...


class ModelServicer(ABC):
    """Release and GetInfo, model work on the executor. List it before the generated
    servicer base class, whose UNIMPLEMENTED methods it overrides; subclasses give
    ``_info``, the ModelInfo with their counters."""

    def __init__(self, model: ServedModel, executor: ModelExecutor) -> None:
        self.model = model
        self.executor = executor
        self._last_touched: dict[str, float] = {}  # request id -> monotonic time
        self._owners: dict[str, str] = {}  # request id -> the coordinator that opened it
        self._secret = os.environ.get(INTERNAL_TOKEN_ENV, "")

    def caller(self, context: grpc.aio.ServicerContext) -> str:
        """The calling coordinator's identity: the name its credential proves, else the
        name it claims ("" when it sends none)."""
        metadata = context.invocation_metadata() or ()
        proven = proven_name(metadata, self._secret)
        return proven if proven is not None else dict(metadata).get(OWNER_KEY, "")

    def claim(
        self, request_ids: Iterable[str], owner: str, failed: dict[str, Exception]
    ) -> list[str]:
        """Marks sequences as in use by ``owner`` (on the executor thread, from each RPC) and
        returns them; a sequence another coordinator holds goes to ``failed`` instead."""
        now, mine = time.monotonic(), []
        for rid in request_ids:
            holder = self._owners.get(rid)
            if holder not in (None, owner) and self.model.runner.has(rid):
                failed[rid] = UnknownRequestError(
                    f"request {rid}: this service holds it for another coordinator"
                )
                continue
            self._owners[rid] = owner
            self._last_touched[rid] = now
            mine.append(rid)
        return mine

    def start_reclaiming(self, idle_timeout: float) -> None:
        """Releases, every ``idle_timeout / 4`` seconds, the sequences nobody has touched
        for ``idle_timeout``: a caller that vanished cannot pin the KV pool. Runs as long
        as the event loop that serves."""
        loop = asyncio.get_running_loop()
        self._reclaiming = loop.create_task(self._reclaim_idle(idle_timeout))

    async def _reclaim_idle(self, idle_timeout: float) -> None:
        while True:
            await asyncio.sleep(idle_timeout / 4)
            released = await self.executor.run(self._release_idle, idle_timeout)
            if released:
                log.warning("released %d sequences idle for over %gs", released, idle_timeout)

    def _release_idle(self, idle_timeout: float) -> int:
        cutoff = time.monotonic() - idle_timeout
        idle = [rid for rid, t in self._last_touched.items() if t < cutoff]
        for rid in idle:
            del self._last_touched[rid]
            self._owners.pop(rid, None)
        return self.model.release(idle)

    async def Release(
        self, request: common_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ReleaseResponse:
        return await self.executor.call(context, self._release, request, self.caller(context))

    async def GetInfo(
        self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ModelInfo:
        return await self.executor.call(context, self._info)

    # Run on the executor thread: the model and its runner have one caller at a time.

    def _release(
        self, request: common_pb2.ReleaseRequest, owner: str
    ) -> common_pb2.ReleaseResponse:
        """Releases the caller's sequences; ids another coordinator holds are ignored."""
        mine = [rid for rid in request.request_ids if self._owners.get(rid, owner) == owner]
        if request.all_of_caller:
            mine = list(dict.fromkeys(mine + [r for r, o in self._owners.items() if o == owner]))
        for rid in mine:
            self._last_touched.pop(rid, None)
            self._owners.pop(rid, None)
        num_released = self.model.release(mine)
        return common_pb2.ReleaseResponse(
            num_released=num_released, num_free_pages=self.model.runner.num_free_pages
        )

    async def stream_replies(
        self,
        requests: AsyncIterator[Any],
        context: grpc.aio.ServicerContext,
        answer: Callable[[Any, str], Awaitable[Any]],
        reply_type: type,
    ) -> AsyncIterator[Any]:
        """The replies of a per-step stream (``StepStream``, ``VerifyStream``): for each
        request in order, ``reply_type(response=await answer(request, caller))``, or
        ``reply_type(error=...)`` with the status a unary call would have ended with; one
        refused step leaves the stream open for the next."""
        owner = self.caller(context)
        async for request in requests:
            try:
                response = await answer(request, owner)
            except Exception as exc:
                code, message = refusal(exc, type(request).__name__)
                yield reply_type(error=common_pb2.StepError(code=code.name, message=message))
            else:
                yield reply_type(response=response)

    @abstractmethod
    def _info(self) -> common_pb2.ModelInfo:
        """ModelInfo with the model's counters."""
