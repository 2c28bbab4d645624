"""End-to-end fixtures: the bundled tokenizer and held-out prompts, a feature-reading draft."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from specdec.config import MODELS_DIR, TINY_TARGET


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


@pytest.fixture(scope="session")
def bundled_feature_draft(tmp_path_factory) -> str:
    """The bundled target's last layer as a one-layer draft that reads its features
    (untrained: it proposes what the target rarely accepts greedily)."""
    from feature_draft import initial_weights, save_folder

    out = tmp_path_factory.mktemp("feature_draft")
    return str(save_folder(out, TINY_TARGET, initial_weights(TINY_TARGET)))
