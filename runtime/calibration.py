"""KV-scale calibration: ``scale = amax / fp8_max`` of K (post-RoPE) and V per layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specdec.kernels.fp8 import fp8_max, is_fp8
from specdec.runtime.context import ForwardContext
from specdec.runtime.kv_scales import KVScaleTable

if TYPE_CHECKING:
    from specdec.runtime.model_runner import ModelRunner


class CalibrationContext(ForwardContext):
    """Dense causal attention over one sequence, unquantised, recording |K| and |V| maxima.

    Independent of the paged cache and of the current scales, so the amax of layer ``l``
    is not disturbed by quantisation in layers ``< l``.
    """

    def __init__(self, num_tokens: int, num_layers: int, device: torch.device | str) -> None:
        self.positions = torch.arange(num_tokens, dtype=torch.int64, device=device)
        self.k_amax = torch.zeros(num_layers, dtype=torch.float32, device=device)
        self.v_amax = torch.zeros(num_layers, dtype=torch.float32, device=device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k_amax[layer] = torch.maximum(self.k_amax[layer], k.abs().amax().float())
        self.v_amax[layer] = torch.maximum(self.v_amax[layer], v.abs().amax().float())
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        return out.transpose(0, 1)


def calibrate(runner: ModelRunner, token_id_batches: Iterable[list[int]]) -> KVScaleTable:
    """A new table (version = current + 1) from running each token list as one sequence.

    Leaves the runner's cache and current table untouched; apply the result with
    ``runner.set_kv_scales``. A layer whose amax is 0 keeps scale 1.0. ValueError unless
    the runner's KV cache is FP8 (the scales mean nothing otherwise) or no tokens given.
    """
    kv_dtype = runner.kv_torch_dtype
    if not is_fp8(kv_dtype):
        raise ValueError(
            f"calibration needs an fp8 kv_cache_dtype, the runner uses {runner.kv_cache_dtype!r}"
        )
    num_layers = runner.num_layers
    k_amax = torch.zeros(num_layers)
    v_amax = torch.zeros(num_layers)
    num_batches = 0
    with torch.inference_mode():
        for token_ids in token_id_batches:
            if not token_ids:
                continue
            if len(token_ids) > runner.max_model_len:
                raise ValueError(f"calibration sequence longer than {runner.max_model_len}")
            ctx = CalibrationContext(len(token_ids), num_layers, runner.device)
            input_ids = torch.tensor(token_ids, dtype=torch.int64, device=runner.device)
            runner.model(input_ids, ctx)
            k_amax = torch.maximum(k_amax, ctx.k_amax.cpu())
            v_amax = torch.maximum(v_amax, ctx.v_amax.cpu())
            num_batches += 1
    if num_batches == 0:
        raise ValueError("calibration needs at least one non-empty token list")
    limit = fp8_max(kv_dtype)

    def to_scales(amax: torch.Tensor) -> tuple[float, ...]:
        return tuple(a / limit if a > 0 else 1.0 for a in amax.tolist())

    return KVScaleTable(
        version=runner.kv_scales.version + 1,
        dtype=runner.kv_cache_dtype,
        k_scale=to_scales(k_amax),
        v_scale=to_scales(v_amax),
    )
