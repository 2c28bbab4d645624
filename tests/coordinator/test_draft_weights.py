"""`specdec up --draft-dtype` / `--draft-quantization`: how the draft service holds its
weights (the target keeps --dtype, never quantized)."""

from __future__ import annotations

import json

import pytest

from specdec.config import REAL_DRAFT, REAL_TARGET, TINY_DRAFT, StackConfig, draft_dtype
from specdec.launcher import Stack
from specdec.model_service.config import ServiceConfig


def checkpoint(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_auto_keeps_a_16_bit_checkpoint_in_its_dtype(tmp_path, stored):
    assert draft_dtype(checkpoint(tmp_path, torch_dtype=stored), "auto", "float32") == stored


def test_auto_reads_the_newer_dtype_key_too(tmp_path):
    assert draft_dtype(checkpoint(tmp_path, dtype="bfloat16"), "auto", "float32") == "bfloat16"


@pytest.mark.parametrize("config", [{"torch_dtype": "float32"}, {}])
def test_auto_runs_other_checkpoints_in_the_stack_dtype(tmp_path, config):
    assert draft_dtype(checkpoint(tmp_path, **config), "auto", "float16") == "float16"


def test_an_explicit_draft_dtype_wins(tmp_path):
    path = checkpoint(tmp_path, torch_dtype="bfloat16")
    assert draft_dtype(path, "float32", "float32") == "float32"


def test_the_shipped_drafts():
    assert draft_dtype(str(REAL_DRAFT), "auto", "float32") == "bfloat16"
    assert draft_dtype(str(TINY_DRAFT), "auto", "float32") == "float32"


def service_config(config: StackConfig, service: str, model: str) -> ServiceConfig:
    """The model service's config as its command line gives it (built; nothing starts)."""
    argv = Stack(config).model_argv(service, model, 0)
    assert argv[1:3] == ["-m", f"specdec.{service}_service"]
    return ServiceConfig.from_args(service, argv[3:])


@pytest.mark.parametrize("quantization", ["int8", "none"])
def test_only_the_draft_service_is_quantized(quantization):
    config = StackConfig(draft_quantization=quantization)
    draft = service_config(config, "draft", str(REAL_DRAFT))
    assert (draft.quantization, draft.dtype) == (quantization, "bfloat16")
    target = service_config(config, "target", str(REAL_TARGET))
    assert (target.quantization, target.dtype) == ("none", "float32")


def test_the_default_draft_is_int8():
    assert StackConfig().draft_quantization == "int8"


def test_the_kv_pools_hold_max_num_seqs_sequences_the_draft_every_replicas_or_the_bytes_given():
    config = StackConfig(max_num_seqs=32, replicas=2, enable_prefix_caching=False)
    target = service_config(config, "target", str(REAL_TARGET))
    draft = service_config(config, "draft", str(REAL_DRAFT))
    assert target.num_gpu_blocks_override == 32 * 2048 // 16
    assert draft.num_gpu_blocks_override == 2 * 32 * 2048 // 16
    assert not target.enable_prefix_caching and not draft.enable_prefix_caching
    few = service_config(StackConfig(max_num_seqs=2), "target", str(REAL_TARGET))
    assert few.num_gpu_blocks_override == 16 * 2048 // 16  # one long request
    sized = StackConfig(kv_cache_memory="2GiB", draft_kv_cache_memory="256MiB")
    assert service_config(sized, "target", str(REAL_TARGET)).kv_cache_memory_bytes == 2 << 30
    assert service_config(sized, "draft", str(REAL_DRAFT)).kv_cache_memory_bytes == 256 << 20
