"""Gathers calls that arrive while the model is busy, to run them as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """``submit`` returns ``run``'s answer for the item. While a ``run`` is in progress,
    new items wait; when it ends, everything waiting goes to the next ``run`` together.
    ``run`` answers one result per item, in order; an Exception there is raised to that
    item's caller alone."""

    def __init__(self, run: Callable[[list[Item]], Awaitable[list[Result | Exception]]]):
        self._run = run
        self._waiting: list[tuple[Item, asyncio.Future]] = []
        self._busy = False

    async def submit(self, item: Item) -> Result:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await self._run([item for item, _ in batch])
                except Exception as exc:  # the run itself failed: every caller hears it
                    results = [exc] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():  # its caller went away
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._busy = False
