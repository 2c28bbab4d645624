"""The engine's releases and KV pages: what departed and preempted requests held on both
services, released in batches, and the free pages each service reports.

``Releases`` is a part of ``Engine`` (its base class), kept in its own file; it reads the
engine's stubs, scheduler, breaker, metrics and the ids waiting for release."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import grpc

from specdec.coordinator.engine.drafting import status_of
from specdec.coordinator.engine.request import Request
from specdec.telemetry.tracing import grpc_metadata
from specdec.v1 import common_pb2

logger = logging.getLogger(__name__)

RELEASE_TIMEOUT = 5.0
_POOL_REFRESH_S = 0.05  # while requests wait for KV pages: how often to ask for free pages


class Releases:
    async def _flush_releases(self) -> None:
        if not self._pending_release:
            return
        ids, self._pending_release = self._pending_release, []
        calls = [self._release(self.target, ids, RELEASE_TIMEOUT)]
        if self.draft is not None and self.draft_breaker.closed:
            calls.append(self._release(self.draft, ids, self.config.draft_timeout))
        elif self.draft is not None:
            self._draft_orphans.extend(ids)
        try:
            await asyncio.gather(*calls)
        except asyncio.CancelledError:
            # Stopped mid-release: `stop` sends them again (releasing twice is harmless).
            self._pending_release[:0] = ids
            raise

    async def _release(self, stub: Any, ids: list[str], timeout: float) -> bool:
        """Releases ``ids`` on the service; False when that failed (on the draft, they are
        released again once it answers)."""
        try:
            reply = await self._call(
                stub.Release, common_pb2.ReleaseRequest(request_ids=ids), timeout, grpc_metadata()
            )
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            code, details = status_of(e)
            logger.warning("release of %d requests failed (%s: %s)", len(ids), code, details)
            if stub is self.draft:
                self._draft_orphans.extend(ids)
                self._mark_draft_down()
            return False
        self._free_pages_reported(stub, reply.num_free_pages)
        return True

    # ---- KV pages ----------------------------------------------------------------------

    def _free_pages_reported(self, stub: Any, num_free: int | None) -> None:
        """A service's reply told its free pages: the scheduler plans within them."""
        pool = self.scheduler.target_pool if stub is self.target else self.scheduler.draft_pool
        if pool is not None and num_free is not None:
            pool.num_free = num_free

    async def _release_preempted(self, requests: list[Request]) -> None:
        """Releases what the preempted requests held on both services (they wait, and
        resume from their logs), before the step is planned again."""
        ids = [r.request_id for r in requests]
        self.totals.num_preemptions += len(ids)
        if self.metrics is not None:
            self.metrics.num_preemptions.inc(len(ids))
        logger.info("preempted %d requests to free KV pages: %s", len(ids), ", ".join(ids))
        calls = [self._release(self.target, ids, RELEASE_TIMEOUT)]
        if self.draft is not None and self.draft_breaker.closed:
            calls.append(self._release(self.draft, ids, self.config.draft_timeout))
        released = await asyncio.gather(*calls)
        if len(released) == 2 and released[1]:
            for request in requests:
                request.num_draft_cached = 0

    async def _refresh_pools(self) -> None:
        """Asks both services for their free pages (at most every _POOL_REFRESH_S): requests
        wait for pages, and other coordinators sharing a service may have freed some."""
        now = time.monotonic()
        if now - self._pools_checked < _POOL_REFRESH_S:
            await asyncio.sleep(_POOL_REFRESH_S)
            return
        self._pools_checked = now
        stubs = [self.target] + ([self.draft] if self.draft is not None else [])
        for stub in stubs:
            with contextlib.suppress(grpc.RpcError, asyncio.TimeoutError):
                info = await self._call(stub.GetInfo, common_pb2.InfoRequest(), 1.0, ())
                self._free_pages_reported(stub, info.num_free_pages)
