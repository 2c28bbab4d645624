"""Fixtures shared by every test folder: a tiny random Qwen3 checkpoint, built once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY_QWEN3 = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def build_tiny_qwen3(folder: Path, **overrides) -> Path:
    """Save a random Qwen3 with ``save_pretrained``; seeded, so every build is identical."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{**TINY_QWEN3, **overrides}))
    # Weights larger than the init scale, so greedy picks differ from token to token.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"))
