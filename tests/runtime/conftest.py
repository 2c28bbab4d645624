"""Tiny random Qwen3 / Llama checkpoints, built once per session with a fixed seed."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def qwen3_path(tiny_model_path) -> Path:
    return tiny_model_path


@pytest.fixture(scope="session")
def llama_path(tmp_path_factory, tiny_checkpoint) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
