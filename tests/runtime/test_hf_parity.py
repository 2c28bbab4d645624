"""The runtime computes what ``transformers`` computes on the same checkpoint."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import greedy, prefill
from transformers import AutoModelForCausalLM

from specdec.runtime import ModelRunner, SequenceChunk

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200]


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=torch.float32
    ).eval()


@pytest.fixture(params=["qwen3", "llama"])
def checkpoint(request, qwen3_path, llama_path):
    return qwen3_path if request.param == "qwen3" else llama_path


@pytest.mark.parametrize("attention_backend", ["cpu", "reference"])
def test_prefill_and_decode_logits_match_transformers(checkpoint, attention_backend):
    runner = ModelRunner.from_pretrained(
        checkpoint, num_pages=32, attention_backend=attention_backend
    )
    decode_tokens = [9, 33, 180, 2, 77, 150]
    ours = [prefill(runner, "s", PROMPT)]
    for token in decode_tokens:
        ours.append(runner.extend([SequenceChunk("s", [token])])[0])
    ours = torch.cat(ours)

    with torch.no_grad():
        ref = hf_model(checkpoint)(torch.tensor([PROMPT + decode_tokens])).logits[0]
    assert ours.shape == ref.shape == (len(PROMPT) + len(decode_tokens), 256)
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("attention_backend", ["cpu", "reference"])
def test_greedy_64_tokens_equal_transformers_generate(checkpoint, attention_backend):
    runner = ModelRunner.from_pretrained(
        checkpoint, num_pages=32, attention_backend=attention_backend
    )
    ours = greedy(runner, "s", PROMPT, 64)
    with torch.no_grad():
        out = hf_model(checkpoint).generate(
            torch.tensor([PROMPT]), do_sample=False, max_new_tokens=64
        )
    theirs = out[0, len(PROMPT) :].tolist()
    assert len(ours) > 8  # the comparison means something
    assert ours == theirs


def test_llama3_rope_scaling_matches_transformers(tmp_path, tiny_checkpoint):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    path = tiny_checkpoint(tmp_path, "llama", rope_parameters=rope)
    runner = ModelRunner.from_pretrained(path, num_pages=32)
    tokens = list(range(3, 99))
    ours = prefill(runner, "s", tokens)
    with torch.no_grad():
        ref = hf_model(path)(torch.tensor([tokens])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("tied", [False, True])
def test_biases_and_tied_head_match_transformers(tmp_path, tiny_checkpoint, tied):
    path = tiny_checkpoint(
        tmp_path, "llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=tied
    )
    runner = ModelRunner.from_pretrained(path, num_pages=32)
    assert runner.model.model.layers[0].mlp.down_proj.bias is not None
    ours = [prefill(runner, "s", PROMPT)]
    ours.append(runner.extend([SequenceChunk("s", [9])])[0])
    with torch.no_grad():
        ref = hf_model(path)(torch.tensor([PROMPT + [9]])).logits[0]
    assert (torch.cat(ours) - ref).abs().max().item() < 1e-4


def test_runner_reports_checkpoint_facts(qwen3_path):
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=8, max_model_len=128)
    assert runner.vocab_size == 256
    assert runner.num_layers == 2
    assert runner.max_model_len == 128
    assert runner.eos_token_ids == (2,)
    assert runner.kv_cache_dtype == "auto"
    assert runner.num_free_pages == 8
    assert runner.model_name == qwen3_path.name
    assert runner.cache.dtype == torch.float32


def test_bfloat16_runs_close_to_float32(qwen3_path):
    """bfloat16 throughout (the PyTorch path: how a GPU runs it); the C kernels' 16-bit
    weights are tested in test_decoder_layers."""
    ref = prefill(ModelRunner.from_pretrained(qwen3_path, num_pages=8), "s", PROMPT)
    runner = ModelRunner.from_pretrained(
        qwen3_path, num_pages=8, dtype="bfloat16", attention_backend="reference"
    )
    assert runner.cache.dtype == torch.bfloat16
    out = prefill(runner, "s", PROMPT)
    assert out.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(out, ref, dim=-1)
    assert cos.min().item() > 0.99
