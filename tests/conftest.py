"""Fixtures shared by every test folder: tiny random checkpoints (Qwen3, built once)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every end-to-end test starts the services as processes: ``slow``."""
    for item in items:
        if "e2e" in item.path.parts:
            item.add_marker(pytest.mark.slow)


TINY = dict(
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


def build_tiny_checkpoint(folder: Path, arch: str = "qwen3", **overrides) -> Path:
    """Save a random ``arch`` ("qwen3" | "llama") model with ``save_pretrained``; seeded,
    so every build is identical."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    config_class, model_class = classes[arch]
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY, **overrides}))
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
def tiny_checkpoint() -> Callable[..., Path]:
    """``build_tiny_checkpoint``, for test folders (which cannot import this conftest)."""
    return build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session")
def tiny_feature_draft_path(tmp_path_factory, tiny_model_path) -> Path:
    """A one-layer draft that reads the tiny model's features (its last layer, untrained),
    in float32."""
    from feature_draft import initial_weights, save_folder

    out = tmp_path_factory.mktemp("tiny_feature_draft")
    return save_folder(out, tiny_model_path, initial_weights(tiny_model_path), dtype=torch.float32)
