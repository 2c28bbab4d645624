"""Helpers for service tests: a server on its own event-loop thread, reference decoding."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import grpc
import pytest

from specdec.model_service.config import ServiceConfig, message_limits
from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sequence import SequenceChunk
from specdec.v1 import common_pb2, target_pb2

NUM_PAGES = 64
PAGE_SIZE = 4  # small pages, so sequences cross page boundaries


class ServerThread:
    """An aio server built by ``create_server`` and served from a background event loop."""

    def __init__(self, create_server: Callable, config: ServiceConfig, runner: ModelRunner):
        self.runner = runner
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server, self.port = self._await(create_server(config, runner))
        self._await(self._server.start())
        options = message_limits(runner.vocab_size)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=options)

    def _await(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def close(self) -> None:
        self.channel.close()
        self._await(self._server.stop(None))
        self._await(_cancel_other_tasks())  # e.g. the idle-sequence reclaimer
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _cancel_other_tasks() -> None:
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def greedy_decode(runner: ModelRunner, prompt: list[int], num_tokens: int) -> list[int]:
    """Plain greedy decoding, one token per forward, in a sequence of its own."""
    seq = f"reference-{id(prompt)}-{len(prompt)}"
    runner.open(seq)
    try:
        out: list[int] = []
        feed = prompt
        for _ in range(num_tokens):
            logits = runner.extend([SequenceChunk(seq, feed)])[0]
            out.append(int(logits[-1].argmax()))
            feed = [out[-1]]
        return out
    finally:
        runner.release(seq)


def status_of(call: Callable[[], object]) -> grpc.RpcError:
    """The RpcError a call raises (fails the test if it succeeds)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# ---- TargetService messages ----------------------------------------------------------


def chunk(rid, start, tokens, is_last=False, **sampling) -> target_pb2.PrefillChunk:
    params = common_pb2.SamplingParams(**sampling)
    return target_pb2.PrefillChunk(
        request_id=rid, start_position=start, token_ids=tokens, is_last=is_last, sampling=params
    )


def entry(rid, start, last, proposals, draft_probs=(), **sampling) -> target_pb2.VerifyEntry:
    return target_pb2.VerifyEntry(
        request_id=rid,
        start_position=start,
        last_token_id=last,
        proposal_ids=proposals,
        draft_probs=draft_probs,
        sampling=common_pb2.SamplingParams(**sampling),
    )


def verify(stub, prefill=(), decode=()) -> list[target_pb2.VerifyResult]:
    return list(stub.Verify(target_pb2.VerifyRequest(prefill=prefill, decode=decode)).results)
