"""Messages both model services build the same way."""

from __future__ import annotations

import torch

from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.model_runner import ModelRunner
from specdec.v1 import common_pb2


def kv_table_to_proto(table: KVScaleTable) -> common_pb2.KVScaleTable:
    return common_pb2.KVScaleTable(
        version=table.version, dtype=table.dtype, k_scale=table.k_scale, v_scale=table.v_scale
    )


def kv_table_from_proto(msg: common_pb2.KVScaleTable) -> KVScaleTable:
    try:
        return KVScaleTable(msg.version, msg.dtype, tuple(msg.k_scale), tuple(msg.v_scale))
    except ValueError as e:
        raise InvalidRequestError(f"bad kv_scales table: {e}") from None


def model_info(runner: ModelRunner, **counters: float) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model=runner.model_name,
        vocab_size=runner.vocab_size,
        max_model_len=runner.max_model_len,
        kv_cache_dtype=runner.kv_cache_dtype,
        num_free_pages=runner.num_free_pages,
        num_total_pages=runner.cache.num_pages,
        page_size=runner.config.page_size,
        eos_token_ids=runner.eos_token_ids,
        kv_scales=kv_table_to_proto(runner.kv_scales),
        num_layers=runner.num_layers,
        forward_seconds=runner.forward_seconds,
        prefix_cache_queries=runner.prefix_cache_queries,
        prefix_cache_hits=runner.prefix_cache_hits,
        num_computed_tokens=runner.num_computed_tokens,
        prefix_caching=runner.config.enable_prefix_caching,
        hidden_size=runner.model_config.hidden_size,
        reads_target_features=runner.model_config.reads_target_features,
        **counters,
    )


def features_to_bytes(features: torch.Tensor | None) -> bytes:
    """Hidden states ``[rows, hidden]`` as the wire carries them: bfloat16, little-endian,
    row-major."""
    if features is None:
        return b""
    return features.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def features_from_bytes(data: bytes, rows: int, hidden_size: int) -> torch.Tensor | None:
    """``features_to_bytes``' inverse as float32 ``[rows, hidden_size]``; None for no bytes."""
    if not data:
        return None
    if len(data) != rows * hidden_size * 2:
        raise InvalidRequestError(
            f"features hold {len(data)} bytes; {rows} rows of {hidden_size} bfloat16 values "
            f"take {rows * hidden_size * 2}"
        )
    return torch.frombuffer(bytearray(data), dtype=torch.bfloat16).view(rows, hidden_size).float()
