"""One Llama-family decoder (Llama, and Qwen3 = Llama + per-head q/k RMSNorm).

Module names follow the Hugging Face model (``model.layers.{i}.self_attn...``) except
that q/k/v and gate/up are packed into ``qkv_proj`` / ``gate_up_proj``; the mapping
lives in ``runtime.loader``. The forward takes flat tokens ``[T]`` of a ragged batch and
a ``ForwardContext``; paging is the context's business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.context import ForwardContext
from runtime.model_config import ModelConfig
from runtime.rotary import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class PackedLinear(nn.Linear):
    """A linear whose output rows are several checkpoint matrices stacked.

    ``shards`` maps a shard id to ``(row_offset, num_rows)``; ``load_shard`` copies one
    checkpoint tensor (weight or bias) into its rows.
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shards: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard_id, size in shard_sizes.items():
            self.shards[shard_id] = (offset, size)
            offset += size

    def load_shard(self, param: nn.Parameter, tensor: torch.Tensor, shard_id: str) -> None:
        offset, size = self.shards[shard_id]
        target = param.data.narrow(0, offset, size)
        if target.shape != tensor.shape:
            raise ValueError(
                f"shard {shard_id}: expected {tuple(target.shape)}, got {tuple(tensor.shape)}"
            )
        target.copy_(tensor)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d = config.head_dim
        kv_size = config.num_kv_heads * d
        self.qkv_proj = PackedLinear(
            config.hidden_size,
            {"q": config.num_heads * d, "k": kv_size, "v": kv_size},
            bias=config.attention_bias,
        )
        self.o_proj = nn.Linear(
            config.num_heads * d, config.hidden_size, bias=config.attention_bias
        )
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
            self.register_buffer("qk_norm_weight", torch.empty(0), persistent=False)

    def finalize(self) -> None:
        """After loading: fuse q_norm / k_norm weights so q and k are normed in one op."""
        if self.qk_norm:
            self.qk_norm_weight = torch.cat(
                (
                    self.q_norm.weight.detach().expand(self.num_heads, -1),
                    self.k_norm.weight.detach().expand(self.num_kv_heads, -1),
                )
            )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(num_tokens, -1, self.head_dim)
        qk, v = qkv.split((self.num_heads + self.num_kv_heads, self.num_kv_heads), dim=1)
        if self.qk_norm:
            qk = F.rms_norm(qk, (self.head_dim,), None, self.q_norm.eps) * self.qk_norm_weight
        qk = apply_rotary(qk, cos, sin)
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        out = ctx.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = PackedLinear(
            config.hidden_size, {"gate": size, "up": size}, bias=config.mlp_bias
        )
        self.down_proj = nn.Linear(size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim, max_positions)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb.lookup(ctx.positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, ctx)
        return self.norm(x)


class CausalLM(nn.Module):
    """``forward`` -> final hidden states ``[T, hidden]``; ``compute_logits`` -> float32."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_positions)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def finalize(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.finalize()
