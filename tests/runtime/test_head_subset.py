"""A frequency-ranked output head (FR-Spec): ``head_token_ids`` in ``config.json``.

The head scores only the listed ids; the runtime returns full-vocabulary logits with the
head's scores at those ids and -inf elsewhere, so greedy and sampled drafts never propose
an uncovered token and give it probability exactly 0 (what exact verification needs).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from runtime_helpers import greedy, prefill
from safetensors.torch import load_file, save_file

from specdec.kernels.sampling import logits_to_probs, sample_token
from specdec.runtime import ModelRunner
from specdec.runtime.loader import load_hf_model
from specdec.runtime.model_config import ModelConfig

VOCAB = 256
PROMPT = [5, 17, 99, 3, 250, 42, 7, 128]


@pytest.fixture(scope="module")
def head_ids() -> list[int]:
    return sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:64].tolist())


@pytest.fixture(scope="module")
def full_path(tmp_path_factory, tiny_checkpoint) -> Path:
    folder = tmp_path_factory.mktemp("full_head")
    return tiny_checkpoint(folder, "llama", tie_word_embeddings=False)


def with_subset_head(src: Path, dst: Path, ids: list[int], tied: bool) -> Path:
    """A copy of ``src`` whose head keeps only the rows of ``ids`` (none when ``tied``)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    if not tied:
        tensors["lm_head.weight"] = tensors["lm_head.weight"][ids].clone()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config.update(head_token_ids=ids, tie_word_embeddings=tied)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def subset_path(tmp_path_factory, full_path, head_ids) -> Path:
    return with_subset_head(full_path, tmp_path_factory.mktemp("s") / "ckpt", head_ids, False)


def test_logits_are_the_heads_at_covered_ids_and_minus_inf_elsewhere(
    full_path, subset_path, head_ids
):
    full = prefill(ModelRunner.from_pretrained(full_path, num_pages=8), "a", PROMPT)
    subset = prefill(ModelRunner.from_pretrained(subset_path, num_pages=8), "a", PROMPT)
    assert subset.shape == (len(PROMPT), VOCAB)
    torch.testing.assert_close(subset[:, head_ids], full[:, head_ids], rtol=1e-5, atol=1e-5)
    uncovered = torch.ones(VOCAB, dtype=torch.bool)
    uncovered[head_ids] = False
    assert torch.all(subset[:, uncovered] == float("-inf"))


def test_tied_subset_head_uses_the_embedding_rows_of_its_ids(tmp_path, head_ids, tiny_checkpoint):
    tied_full = tiny_checkpoint(tmp_path / "full", "llama", tie_word_embeddings=True)
    tied = with_subset_head(tied_full, tmp_path / "tied", head_ids, tied=True)
    full = prefill(ModelRunner.from_pretrained(tied_full, num_pages=8), "a", PROMPT)
    subset = prefill(ModelRunner.from_pretrained(tied, num_pages=8), "a", PROMPT)
    torch.testing.assert_close(subset[:, head_ids], full[:, head_ids], rtol=1e-5, atol=1e-5)


def test_greedy_is_the_argmax_over_covered_ids_and_never_leaves_them(
    full_path, subset_path, head_ids
):
    runner = ModelRunner.from_pretrained(subset_path, num_pages=8)
    tokens = greedy(runner, "g", PROMPT, 24)
    assert tokens and set(tokens) <= set(head_ids)
    full = ModelRunner.from_pretrained(full_path, num_pages=8)
    logits = prefill(full, "f", PROMPT + tokens[:-1])[len(PROMPT) - 1 :]
    ids = torch.tensor(head_ids)
    assert ids[logits[:, ids].argmax(-1)].tolist() == tokens


def test_sampling_gives_uncovered_ids_probability_zero_and_never_draws_them(subset_path, head_ids):
    logits = prefill(ModelRunner.from_pretrained(subset_path, num_pages=8), "a", PROMPT)
    uncovered = torch.ones(VOCAB, dtype=torch.bool)
    uncovered[head_ids] = False
    for top_k, top_p in ((0, 1.0), (10, 1.0), (0, 0.9)):
        probs = logits_to_probs(logits, 1.3, top_k, top_p)
        assert torch.all(probs[:, uncovered] == 0.0)
        torch.testing.assert_close(probs.sum(-1), torch.ones(len(PROMPT)))
    draws = torch.rand(500, generator=torch.Generator().manual_seed(0)).clamp(1e-6, 1 - 1e-6)
    probs = logits_to_probs(logits[-1:], 2.0)[0]
    assert {sample_token(probs, float(u)) for u in draws} <= set(head_ids)


def test_head_token_ids_must_be_distinct_and_inside_the_vocabulary(subset_path):
    raw = json.loads((subset_path / "config.json").read_text())
    for bad in ([1, 1, 2], [0, VOCAB]):
        with pytest.raises(ValueError, match="head_token_ids"):
            ModelConfig.from_dict({**raw, "head_token_ids": bad})
    assert ModelConfig.from_dict(raw).head_size == 64


def test_transformers_runs_a_subset_head_draft_as_an_assistant(full_path, subset_path, head_ids):
    """``load_hf_model``: transformers' logits at the covered ids are the runtime's, the rest
    are the dtype's lowest value; assisted generation with it as the assistant keeps the
    target's greedy output."""
    draft = load_hf_model(subset_path)
    with torch.no_grad():
        hf = draft(torch.tensor([PROMPT])).logits[0]
    ours = prefill(ModelRunner.from_pretrained(subset_path, num_pages=8), "a", PROMPT)
    covered = torch.tensor(head_ids)
    torch.testing.assert_close(hf[:, covered], ours[:, covered], rtol=0, atol=1e-4)
    outside = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, covered, False)
    assert bool((hf[:, outside] == torch.finfo(hf.dtype).min).all())
    target = load_hf_model(full_path)
    x = torch.tensor([PROMPT])
    kwargs = dict(attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)
    with torch.no_grad():
        plain = target.generate(x, **kwargs)
        assisted = target.generate(x, assistant_model=draft, **kwargs)
    assert torch.equal(plain, assisted)
