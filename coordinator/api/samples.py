"""n > 1: several samples of one prompt, each its own request in the engine, streamed as
one call's choices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from specdec.coordinator.api.admission import MAX_SEED
from specdec.coordinator.api.output_stream import run_request
from specdec.coordinator.engine.core import Engine
from specdec.coordinator.engine.errors import InvalidRequest
from specdec.coordinator.engine.request import Request, RequestOutput

MAX_SAMPLES = 32  # n per call


def sample_requests(first: Request, n: int) -> list[Request]:
    """``first`` and its ``n - 1`` siblings: the same prompt and parameters, ids
    ``<id>#<i>``; a seeded request's sample i is seeded ``seed + i`` (mod 2^64), so each
    draws its own stream and the call reproduces."""
    n = n or 1
    if not 1 <= n <= MAX_SAMPLES:
        raise InvalidRequest(f"n must be in [1, {MAX_SAMPLES}], got {n}")
    samples = [first]
    for i in range(1, n):
        seed = first.sampling.seed
        sibling = Request(
            f"{first.request_id}#{i}",
            first.prompt_ids,
            replace(first.sampling, seed=None if seed is None else (seed + i) % (MAX_SEED + 1)),
            first.max_tokens,
            first.stop_token_ids,
            first.ignore_eos,
            first.k_cap,
            first.client_request_id,
        )
        sibling.sample_of = first.request_id
        samples.append(sibling)
    return samples


async def run_samples(
    engine: Engine,
    samples: list[Request],
    context: grpc.aio.ServicerContext,
    ended: set[int] | None = None,
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Each sample's outputs as ``run_request`` yields them, with its index, in the order
    they come. The first sample runs alone until its prefill has emitted a token, so the
    others find the prompt's KV in the prefix cache instead of computing it again. An
    error in one ends the call (its status is the RPC's); leaving ends every sample. The
    caller ends one sample early (a stop string) by adding its index to ``ended``."""
    ended = set() if ended is None else ended
    streams = [run_request(engine, r, context) for r in samples]
    pending = {asyncio.ensure_future(anext(streams[0])): 0}
    waiting = list(range(1, len(samples)))
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                out = task.result()
                yield i, out
                for j in waiting:
                    pending[asyncio.ensure_future(anext(streams[j]))] = j
                waiting = []
                if i in ended:
                    await streams[i].aclose()  # aborts the request, which frees its KV
                elif not out.finished:
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
