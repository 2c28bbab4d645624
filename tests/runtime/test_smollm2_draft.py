"""The real draft, ``models/smollm2-draft`` (``scripts/train_draft.py``).

What is committed fits 50 MB; ``scripts/fetch_models.py`` completes it with the target's
embedding and tokenizer, after which the runtime loads it and scores only its head's ids.
How well it predicts the target is a figure of the model card, not a test. The
completion tests skip until the target is fetched.
"""

from __future__ import annotations

import json

import pytest
import torch
from fetch_models import DRAFT_DIR, DRAFT_EMBEDDING_FILE, DRAFT_SHARED_FILES, MODEL_DIR
from runtime_helpers import prefill

from specdec.runtime import ModelRunner

COMPLETION = {DRAFT_EMBEDDING_FILE, "model.safetensors.index.json", *DRAFT_SHARED_FILES}
QUESTION = "Explain what a Python dictionary is and give a short example."

pytestmark = pytest.mark.skipif(
    not (DRAFT_DIR / "config.json").is_file(), reason=f"{DRAFT_DIR} is absent"
)
needs_completion = pytest.mark.skipif(
    not (DRAFT_DIR / DRAFT_EMBEDDING_FILE).is_file(),
    reason="the draft is not completed: run `python scripts/fetch_models.py`",
)


def test_committed_part_fits_50_mb():
    committed = [p for p in DRAFT_DIR.iterdir() if p.is_file() and p.name not in COMPLETION]
    assert sum(p.stat().st_size for p in committed) <= 50_000_000


@pytest.fixture(scope="module")
def runners() -> tuple[ModelRunner, ModelRunner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield (
        ModelRunner.from_pretrained(MODEL_DIR, num_pages=32),
        ModelRunner.from_pretrained(DRAFT_DIR, num_pages=32),
    )
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    from specdec.runtime.loader import load_tokenizer

    tokenizer = load_tokenizer(DRAFT_DIR)
    chat = [{"role": "user", "content": QUESTION}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)


@needs_completion
def test_completed_draft_scores_only_its_head_ids(runners, prompt):
    _, draft = runners
    ids = json.loads((DRAFT_DIR / "config.json").read_text())["head_token_ids"]
    assert draft.vocab_size == 49152 and len(ids) == len(set(ids)) < draft.vocab_size
    logits = prefill(draft, "scores", prompt)
    draft.release("scores")
    uncovered = torch.ones(draft.vocab_size, dtype=torch.bool)
    uncovered[ids] = False
    assert torch.all(logits[:, uncovered] == float("-inf"))
    assert torch.isfinite(logits[:, ids]).all()
