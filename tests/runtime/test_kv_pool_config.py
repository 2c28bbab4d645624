"""Sizing the KV pool (--kv-cache-memory, the default in tokens), the prefix-caching flag,
and the capacity line a service logs at start."""

from __future__ import annotations

import argparse

import pytest
import torch

from specdec.kernels import dense_ops
from specdec.model_service.config import ServiceConfig, parse_size
from specdec.model_service.executor import kv_capacity, load_runner
from specdec.runtime import ModelRunner
from specdec.runtime.config import DEFAULT_KV_CACHE_TOKENS, RuntimeConfig


@pytest.mark.parametrize(
    "text, size",
    [
        ("1073741824", 1 << 30),
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("2gib", 2 << 30),
        ("1G", 10**9),
        ("1.5 GB", 1_500_000_000),
        ("64KiB", 64 << 10),
    ],
)
def test_sizes_are_bytes_or_numbers_with_a_unit(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "2 GiBs", "-1G", "1e9", "12 pages"])
def test_a_size_that_is_not_one_is_refused_with_examples(text):
    with pytest.raises(argparse.ArgumentTypeError, match="not a size.*512MiB"):
        parse_size(text)


def test_kv_cache_memory_takes_sizes_under_its_vllm_name_and_the_old_one():
    for flag in ("--kv-cache-memory", "--kv-cache-memory-bytes"):
        config = ServiceConfig.from_args("t", ["--model", "m", flag, "2GiB"])
        assert config.kv_cache_memory_bytes == 2 << 30
    assert ServiceConfig.from_args("t", ["--model", "m"]).kv_cache_memory_bytes is None
    with pytest.raises(SystemExit):
        ServiceConfig.from_args("t", ["--model", "m", "--kv-cache-memory", "lots"])


def test_prefix_caching_is_on_unless_turned_off():
    on = ServiceConfig.from_args("t", ["--model", "m"])
    off = ServiceConfig.from_args("t", ["--model", "m", "--no-enable-prefix-caching"])
    assert on.enable_prefix_caching and on.runtime_config().enable_prefix_caching
    assert not off.enable_prefix_caching and not off.runtime_config().enable_prefix_caching
    assert ServiceConfig.from_args("t", ["--model", "m", "--enable-prefix-caching"])


def test_the_default_pool_holds_the_default_tokens(qwen3_path):
    config = RuntimeConfig(model=str(qwen3_path), page_size=16)
    assert config.resolved_num_pages * 16 == DEFAULT_KV_CACHE_TOKENS == 32768
    sized = RuntimeConfig(model=str(qwen3_path), page_size=16, kv_cache_memory_bytes=1 << 20)
    assert sized.resolved_num_pages == (1 << 20) // sized.page_bytes


def test_the_capacity_line_states_pages_tokens_bytes_and_concurrency(qwen3_path):
    runner = ModelRunner.from_pretrained(qwen3_path, num_pages=64, page_size=16)
    mib = 64 * runner.config.page_bytes / (1 << 20)
    assert kv_capacity(runner) == (
        f"KV cache: 64 pages of 16 tokens = 1024 tokens ({mib:.1f} MiB, float32); maximum "
        f"concurrency for 512 tokens per request: 2.00x; prefix caching on"
    )
    off = ModelRunner.from_pretrained(
        qwen3_path, num_pages=8, kv_cache_dtype="fp8", enable_prefix_caching=False
    )
    assert "(float8_e4m3fn)" not in kv_capacity(off)
    assert "float8_e4m3fn); maximum concurrency" in kv_capacity(off)
    assert kv_capacity(off).endswith("prefix caching off")


def test_a_service_logs_its_capacity_when_it_loads(qwen3_path, caplog):
    config = ServiceConfig(model=str(qwen3_path), num_gpu_blocks_override=32, num_threads=1)
    threads = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="specdec.model_service.executor"):
            runner = load_runner(config)
    finally:
        torch.set_num_threads(threads)  # load_runner set both to num_threads
        dense_ops.set_num_threads(1)
    assert kv_capacity(runner) in caplog.messages
