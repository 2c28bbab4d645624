"""End-to-end fixtures: the bundled tokenizer and held-out prompts."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from specdec.config import MODELS_DIR


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODELS_DIR / "target" / "tokenizer.json"))


@pytest.fixture(scope="session")
def heldout() -> dict:
    return json.loads((MODELS_DIR / "heldout.json").read_text())


@pytest.fixture(scope="session")
def prompt_ids(tokenizer, heldout) -> list[list[int]]:
    """Held-out prompts as token ids."""
    return [tokenizer.encode(p).ids for p in heldout["prompts"]]
