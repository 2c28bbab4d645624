"""All layers in one C call (kernels.decoder_layers) equal the per-op path bit for bit, with
float32 or 16-bit weights; 16-bit weights match transformers in that dtype."""

from __future__ import annotations

import pytest
import torch

from specdec.kernels import dense_ops
from specdec.runtime import ModelRunner, SequenceChunk


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
@pytest.mark.parametrize(
    "arch, overrides",
    [("qwen3", {}), ("llama", {"attention_bias": True, "mlp_bias": True})],
    ids=["qwen3-qk-norm", "llama-biases"],
)
def test_native_layers_equal_the_per_op_path(tmp_path, tiny_checkpoint, arch, overrides, dtype):
    # "int8": float32 with --quantization int8, the linears int8 with per-column scales.
    path = tiny_checkpoint(tmp_path / arch, arch, **overrides)
    weights = {"dtype": "float32", "quantization": "int8"} if dtype == "int8" else {"dtype": dtype}
    # Prefix caching off: each run computes every token (the second would otherwise take
    # the first's blocks from the cache).
    runner = ModelRunner.from_pretrained(
        path, num_pages=32, attention_backend="cpu", enable_prefix_caching=False, **weights
    )
    assert runner.kv_torch_dtype == torch.float32  # activations and an auto cache: float32
    packed = runner.model.model.layers[0].mlp.down_proj.packed_weight
    assert packed.dtype == getattr(torch, dtype), "the linears are stored in the dtype"
    assert runner.model.lm_head.packed_weight.dtype == packed.dtype
    native = runner.model.model.native_layers
    assert native is not None, "a float32 CPU model with packed linears runs the C loop"
    calls = []
    runner.model.model.native_layers = lambda *args: calls.append(1) or native(*args)
    with_native = steps(runner)
    assert calls, "decode and verify steps go through the C loop"
    runner.model.model.native_layers = None
    per_op = steps(runner)
    assert torch.equal(with_native, per_op)
    if dtype in ("float32", "int8"):  # PyTorch computes int8 with the dequantized weights
        reference = ModelRunner.from_pretrained(
            path, num_pages=32, attention_backend="reference", **weights
        )
        torch.testing.assert_close(with_native, steps(reference), rtol=0, atol=1e-4)
    if dtype == "int8":  # quantized for real: not the float32 model
        full = ModelRunner.from_pretrained(path, num_pages=32, attention_backend="cpu")
        assert (steps(full) - with_native).abs().max() > 1e-3


def hf_logits(path, dtype: torch.dtype, upcast: bool, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if upcast:
        model = model.float()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_weights_match_transformers_in_that_dtype(qwen3_path, dtype):
    ids = [(7 * i + 3) % 256 for i in range(24)]
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=32, dtype=str(dtype)[6:])
    runner.open("s")
    ours = torch.cat(
        [
            runner.extend([SequenceChunk("s", ids[:20], 20)])[0],
            runner.extend([SequenceChunk("s", ids[20:], 4)])[0],  # the C loop
        ]
    )
    # The checkpoint rounded to the dtype, computed in float32 as ours is: float32 noise.
    torch.testing.assert_close(ours, hf_logits(qwen3_path, dtype, True, ids), rtol=0, atol=1e-4)
    # transformers computing in the dtype itself: that dtype's rounding, a few ulps deep.
    theirs = hf_logits(qwen3_path, dtype, False, ids)
    atol = 8 * torch.finfo(dtype).eps * float(theirs.abs().max())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)
    # A float32 run of the same checkpoint differs by more than float32 noise: the
    # weights really are rounded.
    full = ModelRunner.from_pretrained(qwen3_path, num_pages=32)
    full.open("s")
    assert (full.extend([SequenceChunk("s", ids, 24)])[0] - ours).abs().max() > 1e-3


def test_steps_the_c_loop_cannot_take_go_layer_by_layer(qwen3_path):
    fp8 = ModelRunner.from_pretrained(qwen3_path, num_pages=32, kv_cache_dtype="fp8")
    assert fp8.model.model.native_layers is not None  # the model could, the FP8 cache not
    fp8.model.model.native_layers = lambda *args: pytest.fail("FP8 steps run per op")
    assert torch.isfinite(steps(fp8)).any()
    reference = ModelRunner.from_pretrained(qwen3_path, num_pages=32, attention_backend="reference")
    assert reference.model.model.native_layers is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_kernels_thread_pool_changes_no_bit(qwen3_path, dtype):
    runner = ModelRunner.from_pretrained(
        qwen3_path, num_pages=32, dtype=dtype, enable_prefix_caching=False
    )  # each run computes every token
    try:
        assert dense_ops.set_num_threads(2) == 2
        two = steps(runner)
        assert dense_ops.set_num_threads(3) == 3  # more threads than column blocks, too
        three = steps(runner)
    finally:
        dense_ops.set_num_threads(1)
    assert torch.equal(steps(runner), two) and torch.equal(two, three)
