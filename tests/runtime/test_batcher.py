"""Batcher: calls that arrive during a run go to the next run together, errors to their
own caller."""

from __future__ import annotations

import asyncio

import pytest

from specdec.model_service.batcher import Batcher


def test_calls_arriving_during_a_run_share_the_next_run():
    runs: list[list[int]] = []

    async def run(items: list[int]) -> list[int | Exception]:
        runs.append(items)
        await asyncio.sleep(0.05)
        return [ValueError(f"bad {i}") if i < 0 else 10 * i for i in items]

    async def main():
        batcher = Batcher(run)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.01)  # the first run is under way
        later = [asyncio.ensure_future(batcher.submit(i)) for i in (2, -3, 4)]
        results = await asyncio.gather(first, *later, return_exceptions=True)
        return results, await batcher.submit(5)

    results, last = asyncio.run(main())
    assert runs == [[1], [2, -3, 4], [5]]
    assert results[:2] == [10, 20] and results[3] == 40 and last == 50
    assert isinstance(results[2], ValueError) and str(results[2]) == "bad -3"


def test_a_failed_run_fails_each_of_its_callers_and_the_batcher_goes_on():
    async def run(items: list[int]) -> list[int]:
        if 0 in items:
            raise RuntimeError("run failed")
        return items

    async def main():
        batcher = Batcher(run)
        with pytest.raises(RuntimeError, match="run failed"):
            await batcher.submit(0)
        return await batcher.submit(7)

    assert asyncio.run(main()) == 7
