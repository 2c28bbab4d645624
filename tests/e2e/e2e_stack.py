"""Helpers for end-to-end tests: the three services as processes on the bundled models."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from coordinator.launcher import MODELS_DIR, Stack, StackConfig
from protos.specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

TARGET = str(MODELS_DIR / "target")
DRAFT = str(MODELS_DIR / "draft")


@contextmanager
def running_stack(**overrides) -> Iterator[Stack]:
    config = StackConfig(port=0, target_model=TARGET, draft_model=DRAFT, **overrides)
    with Stack(config, timeout=240) as stack:
        yield stack


def service_info(address: str, draft: bool) -> common_pb2.ModelInfo:
    stub_cls = draft_pb2_grpc.DraftServiceStub if draft else target_pb2_grpc.TargetServiceStub
    with grpc.insecure_channel(address) as channel:
        return stub_cls(channel).GetInfo(common_pb2.InfoRequest(), timeout=10)
