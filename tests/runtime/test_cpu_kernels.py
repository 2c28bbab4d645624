"""The runtime's C-kernel path: when it is on, and how a linear holds its weight."""

from __future__ import annotations

import torch

from specdec.runtime import ModelRunner
from specdec.runtime.model import Linear


def test_cpu_kernels_follow_the_attention_backend_and_the_dtype(qwen3_path):
    def runner(**overrides):
        return ModelRunner.from_pretrained(qwen3_path, num_pages=8, **overrides)

    assert runner(attention_backend="cpu").cpu_kernels
    assert not runner(attention_backend="reference").cpu_kernels
    # 16-bit weights on the kernels: stored in 16 bits, computed in float32.
    half = runner(attention_backend="cpu", dtype="bfloat16")
    assert half.cpu_kernels and half.config.compute_dtype == torch.float32
    # Off the kernels, the dtype is the compute dtype too, KV cache included.
    plain = runner(attention_backend="reference", dtype="bfloat16")
    assert not plain.cpu_kernels and plain.kv_torch_dtype == torch.bfloat16


def test_linear_holds_its_weight_packed_or_plain_never_both():
    layer = Linear(16, {"a": 32, "b": 32}, bias=True)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    x, plain = torch.randn(3, 16), layer.weight.detach().clone()
    want = layer(x)
    layer.use_cpu_kernels(True)
    assert layer.weight is None and layer.packed_weight.shape == (2, 16, 32)
    torch.testing.assert_close(layer(x), want)
    assert torch.equal(layer.weight_in_out(), plain)
    layer.use_cpu_kernels(False)
    assert layer.packed_weight is None and torch.equal(layer.weight, plain)
    odd = Linear(16, 40, bias=False)  # 40 columns do not pack: stays plain
    odd.use_cpu_kernels(True)
    assert odd.packed_weight is None and odd.weight is not None
