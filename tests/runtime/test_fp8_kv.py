"""FP8 KV cache: close to the 16/32-bit cache, scales from checkpoint / calibration / outside."""

from __future__ import annotations

import shutil

import pytest
import torch
from runtime_helpers import add_kv_scales, cached_kv, prefill
from transformers import AutoModelForCausalLM

from specdec.kernels.fp8 import fp8_max
from specdec.runtime import (
    KVScalesMismatchError,
    KVScaleTable,
    ModelRunner,
    SequenceChunk,
    calibrate,
)

TOKENS = [(11 * i + 5) % 256 for i in range(40)]


@pytest.fixture(scope="module")
def auto_logits(qwen3_path):
    return prefill(ModelRunner.from_pretrained(qwen3_path, num_pages=16), "s", TOKENS)


@pytest.mark.parametrize(
    ("kv_cache_dtype", "torch_dtype"),
    [("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)],
)
def test_fp8_logits_stay_close_to_auto(qwen3_path, auto_logits, kv_cache_dtype, torch_dtype):
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=16, kv_cache_dtype=kv_cache_dtype)
    assert runner.cache.dtype == torch_dtype
    assert runner.kv_scales == KVScaleTable.ones(2, kv_cache_dtype)
    logits = prefill(runner, "s", TOKENS)
    # Cosine over all positions' logits; single rows of this random model dip lower with
    # e5m2's 2 mantissa bits (to ~0.96).
    cos = torch.nn.functional.cosine_similarity(logits.flatten(), auto_logits.flatten(), dim=0)
    assert cos.item() >= 0.99
    assert not torch.equal(logits, auto_logits)  # it really is quantised


def test_checkpoint_kv_scales_are_read_and_used(qwen3_path, tmp_path):
    path = tmp_path / "with_scales"
    shutil.copytree(qwen3_path, path)
    k, v = [0.01, 0.02], [0.02, 0.03]
    add_kv_scales(path, k, v)

    runner = ModelRunner.from_pretrained(path, num_pages=16, kv_cache_dtype="fp8")
    table = runner.kv_scales
    assert (table.version, table.dtype) == (1, "fp8")
    assert table.k_scale == pytest.approx(k) and table.v_scale == pytest.approx(v)

    # Stored values are fp8(x / scale): rescaled, they give the unquantised KV back.
    reference = ModelRunner.from_pretrained(path, num_pages=16)
    assert reference.kv_scales.k_scale == pytest.approx(k)  # reported, unused without fp8
    prefill(runner, "s", TOKENS[:10])
    prefill(reference, "s", TOKENS[:10])
    stored = cached_kv(runner, "s")[0]  # layer 0 sees identical inputs in both runners
    exact = cached_kv(reference, "s")[0]
    rescaled = torch.stack([stored[0] * k[0], stored[1] * v[0]])
    torch.testing.assert_close(rescaled, exact, rtol=0.07, atol=0.02 * 2**-6)
    assert stored[0].abs().max() > 10 * exact[0].abs().max()

    # transformers still loads the checkpoint (the scales are extra tensors) unchanged.
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        hf_logits = hf(torch.tensor([TOKENS[:10]])).logits[0]
    ours = prefill(reference, "t", TOKENS[:10])
    assert (hf_logits - ours).abs().max().item() < 1e-4


def test_calibration_gives_amax_over_fp8_max(qwen3_path):
    batches = [TOKENS[:25], TOKENS[7:40]]
    reference = ModelRunner.from_pretrained(qwen3_path, num_pages=16)
    amax = torch.zeros(2, 2)  # [layer, k/v]
    for i, tokens in enumerate(batches):
        prefill(reference, str(i), tokens)
        kv = cached_kv(reference, str(i))  # K is stored after RoPE and k_norm
        amax = torch.maximum(amax, kv.abs().amax(dim=(2, 3, 4)))

    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=16, kv_cache_dtype="fp8")
    table = calibrate(runner, batches)
    limit = fp8_max(torch.float8_e4m3fn)
    assert limit == 448.0
    assert table.version == 2 and table.dtype == "fp8"
    torch.testing.assert_close(torch.tensor(table.k_scale), amax[:, 0] / limit, rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(table.v_scale), amax[:, 1] / limit, rtol=1e-5, atol=0)
    assert runner.kv_scales.version == 1  # calibration does not apply itself

    runner.set_kv_scales(table)
    assert runner.kv_scales is table
    logits = prefill(runner, "s", TOKENS[:25])
    auto = prefill(reference, "s", TOKENS[:25])
    cos = torch.nn.functional.cosine_similarity(logits.flatten(), auto.flatten(), dim=0)
    assert cos.item() >= 0.99


def test_set_kv_scales_validates_and_refuses_stale_sequences(qwen3_path):
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=16, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="3 layers"):
        runner.set_kv_scales(KVScaleTable(2, "fp8", (1.0,) * 3, (1.0,) * 3))
    with pytest.raises(ValueError, match="positive"):
        KVScaleTable(2, "fp8", (1.0, 0.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="fp8_e5m2"):
        runner.set_kv_scales(KVScaleTable.ones(2, "fp8_e5m2", version=2))
    assert runner.kv_scales.version == 1

    prefill(runner, "old", TOKENS[:5])
    runner.open("empty")
    runner.set_kv_scales(KVScaleTable(2, "fp8_e4m3", (0.5, 0.5), (0.5, 0.5)))
    with pytest.raises(KVScalesMismatchError, match="version 1"):
        runner.extend([SequenceChunk("old", [1])])
    assert runner.seq_len("old") == 5
    runner.extend([SequenceChunk("empty", [1, 2])])  # nothing cached yet: fine
    runner.release("old")
    prefill(runner, "old", TOKENS[:5])


def test_kv_scale_table_round_trips_through_json(tmp_path):
    table = KVScaleTable(3, "fp8_e5m2", (0.5, 0.25), (1.5, 2.0))
    assert KVScaleTable.from_json(table.to_json()) == table
    assert KVScaleTable.from_dict(table.to_dict()) == table
    assert table.to_dict() == {
        "version": 3,
        "dtype": "fp8_e5m2",
        "k_scale": [0.5, 0.25],
        "v_scale": [1.5, 2.0],
    }
    table.save(tmp_path / "scales.json")
    assert KVScaleTable.load(tmp_path / "scales.json") == table


def test_kv_scales_path_overrides_checkpoint(qwen3_path, tmp_path):
    table = KVScaleTable(7, "fp8", (0.5, 0.25), (1.5, 2.0))
    table.save(tmp_path / "scales.json")
    runner = ModelRunner.from_pretrained(
        qwen3_path, num_pages=4, kv_cache_dtype="fp8", kv_scales_path=str(tmp_path / "scales.json")
    )
    assert runner.kv_scales == table
