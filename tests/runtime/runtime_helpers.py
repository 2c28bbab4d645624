"""Helpers shared by the runtime tests: checkpoint KV scales, prefill, greedy, KV reads."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.runtime import KVScaleTable, ModelRunner, SequenceChunk
from specdec.runtime.loader import kv_scale_tensors


def add_kv_scales(folder: Path, k: list[float], v: list[float]) -> None:
    """Add vLLM-named ``model.layers.{i}.self_attn.{k,v}_scale`` scalars to the checkpoint."""
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    tensors.update(kv_scale_tensors(KVScaleTable(1, "fp8", k, v)))
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
