"""A circuit breaker for the draft service: a draft that is slow or gone costs one deadline.

Closed, the engine calls the draft every step. A failed call opens it: steps run K = 0
without calling the draft, and a background probe (the draft's cheap ``GetInfo``, under the
same deadline) tries again after ``initial_backoff`` seconds, doubling the wait after each
failed probe up to ``max_backoff``. The first probe that answers closes the breaker; the
engine then re-syncs every sequence from its log, as after any draft failure. So a hung
draft delays the one step that met it, never the steps after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


class DraftBreaker:
    def __init__(
        self,
        probe: Callable[[], Awaitable[object]],
        initial_backoff: float,
        max_backoff: float,
    ) -> None:
        self._probe = probe
        self.initial_backoff = initial_backoff
        self.max_backoff = max(max_backoff, initial_backoff)
        self._task: asyncio.Task | None = None
        self.num_trips = 0
        self.num_failed_probes = 0
        self.waits: list[float] = []  # the waits before each probe, in order

    @property
    def closed(self) -> bool:
        """Whether the draft may be called."""
        return self._task is None

    def trip(self) -> None:
        """A draft call failed: stop calling it until a probe answers (idempotent)."""
        if self._task is not None:
            return
        self.num_trips += 1
        self._task = asyncio.get_running_loop().create_task(self._probe_until_answered())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _probe_until_answered(self) -> None:
        backoff = self.initial_backoff
        while True:
            self.waits.append(backoff)
            await asyncio.sleep(backoff)
            try:
                await self._probe()
            except Exception as e:  # any failure: the draft is still not usable
                self.num_failed_probes += 1
                backoff = min(max(2 * backoff, 0.05), self.max_backoff)
                logger.warning("draft still unavailable (%r); next probe in %.2fs", e, backoff)
                continue
            logger.info("draft answers again; re-syncing it from the log")
            self._task = None
            return
