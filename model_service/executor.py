"""The thread that does a service's model work, and loading the model onto it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import torch

from specdec.kernels import dense_ops
from specdec.model_service.config import ServiceConfig
from specdec.model_service.status import refusal
from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sequence import SequenceChunk

log = logging.getLogger(__name__)
T = TypeVar("T")


class ModelExecutor:
    """One worker thread that owns the runner: model work never runs on the event loop,
    and the (not thread-safe) runner sees one caller at a time."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def call(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the worker; a domain error aborts the RPC with its status code."""
        try:
            return await self.run(fn, *args)
        except Exception as exc:
            await context.abort(*refusal(exc, getattr(fn, "__name__", fn)))
            raise  # unreachable: abort raises

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def at_most_threads(limit: int) -> Iterator[None]:
    """The model work inside uses at most ``limit`` threads, the C kernels' and torch's
    (0: all the service has), restored after; on the executor's thread. Torch's count
    matters too: its OpenMP workers spin a while after each parallel region, on the cores
    a draft beside the service computes on."""
    current = dense_ops.num_threads()
    if not 0 < limit < current:
        yield
        return
    dense_ops.set_num_threads(limit)
    torch.set_num_threads(limit)
    try:
        yield
    finally:
        dense_ops.set_num_threads(current)
        torch.set_num_threads(current)


def load_runner(config: ServiceConfig) -> ModelRunner:
    """Load the weights and run one prefill and one decode step (FP8 paths included).

    Runs on the executor thread, the one that does all model work, so the thread count set
    here is the one the forwards use.
    """
    threads = config.num_threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    dense_ops.set_num_threads(threads)
    runner = ModelRunner(config.runtime_config())
    log.info("%s", kv_capacity(runner))
    seq = "\x00warmup"
    runner.open(seq)
    try:
        runner.extend([SequenceChunk(seq, [0, 1, 2, 3])])
        runner.extend([SequenceChunk(seq, [4])])
    finally:
        runner.release(seq)
    return runner


def kv_capacity(runner: ModelRunner) -> str:
    """The KV pool in vLLM's terms: pages, tokens, bytes, and how many requests of
    ``max_model_len`` tokens fit at once."""
    config, num_pages = runner.config, runner.cache.num_pages
    tokens = num_pages * config.page_size
    mib = num_pages * config.page_bytes / (1 << 20)
    dtype = str(runner.kv_torch_dtype).removeprefix("torch.")
    caching = "on" if config.enable_prefix_caching else "off"
    return (
        f"KV cache: {num_pages} pages of {config.page_size} tokens = {tokens} tokens "
        f"({mib:.1f} MiB, {dtype}); maximum concurrency for {runner.max_model_len} tokens "
        f"per request: {tokens / runner.max_model_len:.2f}x; prefix caching {caching}"
    )


# Every step a service's gRPC loop thread and its model thread (and, in the coordinator,
# which sets the same, its loop and its clients' streams) hand the GIL to each other; at Python's
# default 5 ms switch interval a thread asking for it can wait that long behind one
# running bytecode. 0.5 ms took batch-1 target-only generation through the stack from
# 140-151 to 163-177 tokens/s on the tiny pair here.
GIL_SWITCH_INTERVAL_S = 0.0005


def hand_over_the_gil_quickly() -> None:
    """Set this process's GIL switch interval to GIL_SWITCH_INTERVAL_S (a service's main)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
