"""The bundled checkpoints load offline through the runtime and through transformers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.config import MODELS_DIR
from specdec.runtime import ModelRunner, SequenceChunk

SNIPPET = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"


def test_bundled_models_fit_the_size_budget():
    # The real target (and a crashed run's .partial) is fetched, git-ignored, not bundled;
    # the real draft has its own budget (tests/runtime/test_smollm2_draft.py).
    real_pair = ("smollm2-135m-instruct", "smollm2-draft")
    files = [
        p
        for p in MODELS_DIR.rglob("*")
        if p.is_file() and not p.relative_to(MODELS_DIR).parts[0].startswith(real_pair)
    ]
    size = sum(p.stat().st_size for p in files)
    assert size <= 100 * 1024 * 1024


@pytest.mark.parametrize("name", ["target", "draft"])
def test_bundled_model_loads_offline_and_its_stored_kv_scales_are_read(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = MODELS_DIR / name
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    weights = load_file(folder / "model.safetensors")
    layers = hf.config.num_hidden_layers
    stored = [
        (
            weights[f"model.layers.{i}.self_attn.k_scale"].item(),
            weights[f"model.layers.{i}.self_attn.v_scale"].item(),
        )
        for i in range(layers)
    ]
    assert all(k > 0 and v > 0 for k, v in stored)
    assert all(k != 1.0 and v != 1.0 for k, v in stored)  # calibrated, not the default

    fp8 = ModelRunner.from_pretrained(folder, kv_cache_dtype="fp8", num_pages=64)
    assert fp8.kv_scales.k_scale == pytest.approx([k for k, _ in stored])
    assert fp8.kv_scales.v_scale == pytest.approx([v for _, v in stored])

    ids = tokenizer(SNIPPET)["input_ids"]
    assert tokenizer.eos_token_id in fp8.eos_token_ids
    auto = ModelRunner.from_pretrained(folder, num_pages=64)
    for runner in (auto, fp8):
        runner.open("s")
    ours = auto.extend([SequenceChunk("s", ids, num_logits=len(ids))])[0]
    ours_fp8 = fp8.extend([SequenceChunk("s", ids, num_logits=len(ids))])[0]
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-4
    # FP8 KV with the stored scales keeps the model's choices on real text.
    agree = (ours_fp8.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    assert agree >= 0.9
