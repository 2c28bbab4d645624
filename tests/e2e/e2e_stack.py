"""Helpers for end-to-end tests: the three services as processes on the bundled models."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from specdec.auth import INTERNAL_TOKEN_ENV
from specdec.client import CoordinatorClient, GenerateParams, generate_concurrently
from specdec.config import TINY_DRAFT, TINY_TARGET, StackConfig
from specdec.launcher import ServiceProcess, Stack
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

TARGET, DRAFT = str(TINY_TARGET), str(TINY_DRAFT)


@contextmanager
def running_stack(**overrides) -> Iterator[Stack]:
    # The tests assume their K every step (the gate follows timings); its own tests pass it.
    overrides.setdefault("speculative_gate", "off")
    config = StackConfig(**{"port": 0, "target_model": TARGET, "draft_model": DRAFT, **overrides})
    with Stack(config, timeout=240) as stack:
        yield stack


def service_info(stack: Stack, draft: bool) -> common_pb2.ModelInfo:
    """The draft's or the target's ModelInfo, called with the stack's internal token."""
    if draft:
        stub_cls, address = draft_pb2_grpc.DraftServiceStub, stack.draft_address
    else:
        stub_cls, address = target_pb2_grpc.TargetServiceStub, stack.target_address
    with grpc.insecure_channel(address) as channel:
        request = common_pb2.InfoRequest()
        return stub_cls(channel).GetInfo(request, timeout=10, metadata=stack.internal_metadata)


def stream_while_the_draft_dies(stack: Stack, prompt: list[int], params) -> list:
    """The streamed outputs of one request whose draft service is killed after its first
    output."""
    draft = next(p for p in stack.processes if p.name == "draft")
    with CoordinatorClient(stack.address) as client:
        stream = client.stream(prompt, params, timeout=120)
        outputs = [next(stream)]
        draft.proc.kill()
        draft.proc.wait()
        return outputs + list(stream)


def restart_draft(stack: Stack, model: str) -> None:
    """A new draft service for ``model`` on the stack's draft port (the old one is gone),
    ready when this returns."""
    port = stack.draft_address.rsplit(":", 1)[1]
    argv = [sys.executable, "-m", "specdec.draft_service", "--model", model, "--port", port]
    env = {INTERNAL_TOKEN_ENV: stack.internal_token}
    restarted = ServiceProcess("draft", argv, echo=False, env=env)
    stack.processes.append(restarted)
    restarted.wait_ready(120)


def greedy_by_k(stack: Stack, prompts: list, new_tokens: int, ks: tuple[int, ...]) -> dict:
    """K -> the stack's greedy completions of ``prompts`` with speculation capped at K."""
    by_k = {}
    for k in ks:
        params = GenerateParams(max_tokens=new_tokens, ignore_eos=True, num_speculative_tokens=k)
        _, by_k[k] = generate_concurrently(stack.address, prompts, params)
    return by_k


def wait_until(predicate, timeout: float = 30.0) -> bool:
    """Polls ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False
