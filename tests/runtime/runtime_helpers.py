"""Helpers shared by the runtime tests: tiny random checkpoints, prefill, greedy, KV reads."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from runtime import ModelRunner, SequenceChunk

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


def build_checkpoint(folder: Path, arch: str, **overrides) -> Path:
    """Save a random ``arch`` ("qwen3" | "llama") model with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    kwargs = {**TINY, **overrides}
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    else:
        raise ValueError(arch)
    # Larger-than-init weights make attention and norms non-trivial.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


def add_kv_scales(folder: Path, k: list[float], v: list[float]) -> None:
    """Add vLLM-named ``model.layers.{i}.self_attn.{k,v}_scale`` scalars to the checkpoint."""
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    for i, (ks, vs) in enumerate(zip(k, v, strict=True)):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(ks)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(vs)
    save_file(tensors, str(file), metadata={"format": "pt"})


def prefill(runner: ModelRunner, seq_id: str, token_ids: list[int]) -> torch.Tensor:
    """Open ``seq_id``, extend it by ``token_ids``; logits at every position."""
    runner.open(seq_id)
    return runner.extend([SequenceChunk(seq_id, token_ids, num_logits=len(token_ids))])[0]


def greedy(runner: ModelRunner, seq_id: str, prompt: list[int], num_new: int) -> list[int]:
    """Greedy continuation of ``prompt``, stopping early at an EOS token."""
    runner.open(seq_id)
    logits = runner.extend([SequenceChunk(seq_id, prompt)])[0]
    out: list[int] = []
    for _ in range(num_new):
        token = int(logits[-1].argmax())
        out.append(token)
        if token in runner.eos_token_ids:
            break
        logits = runner.extend([SequenceChunk(seq_id, [token])])[0]
    return out


def cached_kv(runner: ModelRunner, seq_id: str) -> torch.Tensor:
    """The sequence's cached KV as float32 ``[num_layers, 2, seq_len, Hkv, D]``."""
    cache = runner.cache
    n = runner.seq_len(seq_id)
    pages = torch.tensor(cache.page_table(seq_id), dtype=torch.int64)
    t = torch.arange(n)
    page, offset = pages[t // cache.page_size], t % cache.page_size
    return torch.stack(
        [layer[page, :, offset].transpose(0, 1).float() for layer in cache.kv_layers]
    )
