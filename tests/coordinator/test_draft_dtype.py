"""`specdec up --draft-dtype`: which dtype the draft service is started with."""

from __future__ import annotations

import json

import pytest

from coordinator.launcher import REAL_DRAFT, TINY_DRAFT, draft_dtype


def checkpoint(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_auto_keeps_a_16_bit_checkpoint_in_its_dtype(tmp_path, stored):
    assert draft_dtype(checkpoint(tmp_path, torch_dtype=stored), "auto", "float32") == stored


def test_auto_reads_the_newer_dtype_key_too(tmp_path):
    assert draft_dtype(checkpoint(tmp_path, dtype="bfloat16"), "auto", "float32") == "bfloat16"


@pytest.mark.parametrize("config", [{"torch_dtype": "float32"}, {}])
def test_auto_runs_other_checkpoints_in_the_stack_dtype(tmp_path, config):
    assert draft_dtype(checkpoint(tmp_path, **config), "auto", "float16") == "float16"


def test_an_explicit_draft_dtype_wins(tmp_path):
    path = checkpoint(tmp_path, torch_dtype="bfloat16")
    assert draft_dtype(path, "float32", "float32") == "float32"


def test_the_shipped_drafts():
    assert draft_dtype(str(REAL_DRAFT), "auto", "float32") == "bfloat16"
    assert draft_dtype(str(TINY_DRAFT), "auto", "float32") == "float32"
