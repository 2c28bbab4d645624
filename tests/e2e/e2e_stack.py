"""Helpers for end-to-end tests: the three services as processes on the bundled models."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from specdec.config import TINY_DRAFT, TINY_TARGET, StackConfig
from specdec.launcher import Stack
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

TARGET, DRAFT = str(TINY_TARGET), str(TINY_DRAFT)


@contextmanager
def running_stack(**overrides) -> Iterator[Stack]:
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


def wait_until(predicate, timeout: float = 30.0) -> bool:
    """Polls ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False
