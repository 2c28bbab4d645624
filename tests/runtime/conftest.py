"""Tiny random Qwen3 / Llama checkpoints, built once per session with a fixed seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import build_checkpoint


@pytest.fixture(scope="session")
def qwen3_path(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="session")
def llama_path(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
