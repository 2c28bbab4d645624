"""Errors are raised early, say what to do, and leave every sequence as it was."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_helpers import cached_kv, prefill

from specdec.kernels.paged_kv_cache import OutOfPagesError
from specdec.runtime import ModelRunner, RuntimeConfig, SequenceChunk


@pytest.fixture
def runner(qwen3_path):
    return ModelRunner.from_pretrained(qwen3_path, num_pages=4, page_size=16, max_model_len=100)


def test_unknown_sequence_raises_key_error(runner):
    runner.open("a")
    with pytest.raises(KeyError, match="nope"):
        runner.extend([SequenceChunk("a", [1, 2]), SequenceChunk("nope", [1])])
    assert runner.seq_len("a") == 0
    for call in (runner.seq_len, runner.release):
        with pytest.raises(KeyError):
            call("nope")
    with pytest.raises(KeyError):
        runner.truncate("nope", 0)
    assert not runner.has("nope") and runner.has("a")


def test_out_of_pages_leaves_every_sequence_unchanged(runner):
    prefill(runner, "a", list(range(3, 43)))  # 40 tokens: 3 pages
    prefill(runner, "b", list(range(50, 60)))  # 10 tokens: 1 page
    assert runner.num_free_pages == 0
    kv_before = {s: cached_kv(runner, s) for s in "ab"}
    # b fits in its page, a needs a fourth page that does not exist.
    with pytest.raises(OutOfPagesError):
        runner.extend([SequenceChunk("b", [7]), SequenceChunk("a", list(range(9)))])
    assert (runner.seq_len("a"), runner.seq_len("b")) == (40, 10)
    assert runner.num_free_pages == 0
    for s in "ab":
        assert torch.equal(cached_kv(runner, s), kv_before[s])
    # The sequences still work and give what they would have given.
    got = runner.extend([SequenceChunk("b", [7])])[0]
    runner.release("a")
    prefill(runner, "c", list(range(50, 60)))
    want = runner.extend([SequenceChunk("c", [7])])[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_past_max_model_len_and_duplicates_raise_value_error(qwen3_path):
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=8, max_model_len=100)
    prefill(runner, "a", list(range(90)))
    with pytest.raises(ValueError, match="max_model_len=100"):
        runner.extend([SequenceChunk("a", list(range(11)))])
    runner.open("b")
    with pytest.raises(ValueError, match="twice"):
        runner.extend([SequenceChunk("b", [1]), SequenceChunk("b", [2])])
    assert (runner.seq_len("a"), runner.seq_len("b")) == (90, 0)
    with pytest.raises(ValueError, match="num_logits"):
        SequenceChunk("b", [1, 2], num_logits=3)
    with pytest.raises(ValueError, match="already open"):
        runner.open("a")


def test_bad_kv_cache_dtype_lists_valid_values(qwen3_path):
    with pytest.raises(ValueError, match="auto, fp8, fp8_e4m3, fp8_e5m2"):
        RuntimeConfig(model=str(qwen3_path), kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="float32"):
        RuntimeConfig(model=str(qwen3_path), dtype="float64")


def test_missing_folder_and_unsupported_architecture(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelRunner.from_pretrained(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        ModelRunner.from_pretrained(tmp_path)


def test_num_pages_derived_from_memory_budget(qwen3_path):
    config = RuntimeConfig(model=str(qwen3_path), kv_cache_memory_bytes=1 << 20)
    # 2 layers * K,V * 16 tokens * 2 kv heads * 16 dims * 4 bytes = 8 KiB per page
    assert config.page_bytes == 8192
    assert config.resolved_num_pages == 128
    fp8 = RuntimeConfig(model=str(qwen3_path), kv_cache_memory_bytes=1 << 20, kv_cache_dtype="fp8")
    assert fp8.resolved_num_pages == 512
