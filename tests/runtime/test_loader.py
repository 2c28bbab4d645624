"""Checkpoint loading: transposed linear weights, and clear errors for a broken checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.runtime import ModelRunner


def edited_copy(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint ``src`` whose tensors went through ``edit(dict)``."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return dst


def test_packed_linear_holds_each_checkpoint_matrix_transposed(qwen3_path):
    tensors = load_file(qwen3_path / "model.safetensors")
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=4)
    attn = runner.model.model.layers[1].self_attn
    q, k, v = (tensors[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(attn.qkv_proj.weight_in_out(), torch.cat([q, k, v]).t())
    down = tensors["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(runner.model.model.layers[1].mlp.down_proj.weight_in_out(), down.t())


def test_wrong_shape_names_the_tensor_and_both_shapes(qwen3_path, tmp_path):
    def shrink(tensors):
        name = "model.layers.0.self_attn.k_proj.weight"
        tensors[name] = tensors[name][:-1].clone()

    path = edited_copy(qwen3_path, tmp_path / "ckpt", shrink)
    expected = r"k_proj\.weight: weight shard 'k': expected \(32, 64\), got \(31, 64\)"
    with pytest.raises(ValueError, match=expected):
        ModelRunner.from_pretrained(path, num_pages=4)


def test_unknown_and_missing_tensors_are_named(qwen3_path, tmp_path):
    def add(tensors):
        tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)

    path = edited_copy(qwen3_path, tmp_path / "extra", add)
    with pytest.raises(ValueError, match="'model.layers.0.mlp.extra_proj.weight'"):
        ModelRunner.from_pretrained(path, num_pages=4)

    def drop(tensors):
        del tensors["model.layers.1.mlp.up_proj.weight"]

    path = edited_copy(qwen3_path, tmp_path / "missing", drop)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight:up"):
        ModelRunner.from_pretrained(path, num_pages=4)
