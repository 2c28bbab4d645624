"""All layers in one C call (kernels.decoder_layers) equal the per-op path bit for bit."""

from __future__ import annotations

import pytest
import torch

from runtime import ModelRunner, SequenceChunk


def steps(runner: ModelRunner) -> torch.Tensor:
    """A ragged prefill, then a step mixing a verify chunk and a decode; all logits."""
    for seq_id in ("a", "b", "c"):
        runner.open(seq_id)
    try:
        first = runner.extend(
            [SequenceChunk("a", list(range(3, 40)), 2), SequenceChunk("b", [9, 4, 7], 3)]
        )
        second = runner.extend(
            [
                SequenceChunk("a", [5, 17, 11, 2], 4),
                SequenceChunk("b", [8], 1),
                SequenceChunk("c", [6, 6], 2),
            ]
        )
        return torch.cat(first + second)
    finally:
        for seq_id in ("a", "b", "c"):
            runner.release(seq_id)


@pytest.mark.parametrize(
    "arch, overrides",
    [("qwen3", {}), ("llama", {"attention_bias": True, "mlp_bias": True})],
    ids=["qwen3-qk-norm", "llama-biases"],
)
def test_native_layers_equal_the_per_op_path(tmp_path, tiny_checkpoint, arch, overrides):
    path = tiny_checkpoint(tmp_path / arch, arch, **overrides)
    runner = ModelRunner.from_pretrained(path, num_pages=32, attention_backend="cpu")
    native = runner.model.model.native_layers
    assert native is not None, "a float32 CPU model with packed linears runs the C loop"
    calls = []
    runner.model.model.native_layers = lambda *args: calls.append(1) or native(*args)
    with_native = steps(runner)
    assert calls, "decode and verify steps go through the C loop"
    runner.model.model.native_layers = None
    per_op = steps(runner)
    assert torch.equal(with_native, per_op)
    reference = ModelRunner.from_pretrained(path, num_pages=32, attention_backend="reference")
    torch.testing.assert_close(with_native, steps(reference), rtol=0, atol=1e-4)


def test_steps_the_c_loop_cannot_take_go_layer_by_layer(qwen3_path):
    fp8 = ModelRunner.from_pretrained(qwen3_path, num_pages=32, kv_cache_dtype="fp8")
    assert fp8.model.model.native_layers is not None  # the model could, the FP8 cache not
    fp8.model.model.native_layers = lambda *args: pytest.fail("FP8 steps run per op")
    assert torch.isfinite(steps(fp8)).any()
    reference = ModelRunner.from_pretrained(qwen3_path, num_pages=32, attention_backend="reference")
    assert reference.model.model.native_layers is None
