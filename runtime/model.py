"""One Llama-family decoder (Llama, and Qwen3 = Llama + per-head q/k RMSNorm).

Module names follow the Hugging Face model (``model.layers.{i}.self_attn...``) except
that q/k/v and gate/up are packed into ``qkv_proj`` / ``gate_up_proj`` and linear weights
are stored transposed (``Linear``); the mapping lives in ``runtime.loader``. The forward
takes flat tokens ``[T]`` of a ragged batch and a ``ForwardContext``; paging is the
context's business. ``CausalLM.use_cpu_kernels`` swaps the dense ops of a float32 CPU
model for ``kernels.dense_ops``' C calls, and runs every layer of a decode or verify step
in one C call (``kernels.decoder_layers``) where the context allows; the PyTorch forms
stay the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels import dense_ops, gguf_ops
from specdec.kernels.decoder_layers import DecoderLayers, GreedyHead, Shape
from specdec.kernels.huge_pages import into_huge_pages
from specdec.runtime.context import ForwardContext
from specdec.runtime.model_config import ModelConfig
from specdec.runtime.rotary import RotaryEmbedding, RotaryStep, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.cpu_kernels = False  # CausalLM.use_cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_kernels:
            return dense_ops.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Linear(nn.Module):
    """``y = x @ weight + bias`` with ``weight`` stored input-major, ``[in, out]``.

    Checkpoints store ``[out, in]``; ``load`` transposes once. On CPU a small-batch
    matmul against an input-major weight streams it row by row and is about a quarter
    faster at batch 8 than ``F.linear``'s transposed read; CUDA is indifferent.

    A packed linear stacks several checkpoint matrices along the output dimension:
    ``shards`` maps a shard id to ``(offset, size)`` and ``load`` takes the shard id.
    With the CPU kernels on, the weight is held in ``dense_ops``' column-block layout
    (``packed_weight``) instead, or, loaded from a GGUF file, in its block formats
    (``gguf_weight``, ``kernels.gguf_ops``); ``weight_in_out`` gives ``[in, out]`` either way.
    """

    def __init__(self, in_features: int, out_features: int | dict[str, int], bias: bool) -> None:
        super().__init__()
        sizes = out_features if isinstance(out_features, dict) else {"": out_features}
        self.shards: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard_id, size in sizes.items():
            self.shards[shard_id] = (offset, size)
            offset += size
        self.in_features, self.out_features = in_features, offset
        self.weight = nn.Parameter(torch.empty(in_features, offset))
        self.bias = nn.Parameter(torch.empty(offset)) if bias else None
        # The weight in kernels.dense_ops' packed layout instead (use_cpu_kernels).
        self.register_buffer("packed_weight", None, persistent=False)
        self.gguf_weight: gguf_ops.GGUFWeight | None = None

    def hold_gguf(self, weight: gguf_ops.GGUFWeight) -> None:
        """Hold the weight as GGUF blocks (``[out, in]`` with every shard stacked)."""
        if (weight.in_features, weight.out_features) != (self.in_features, self.out_features):
            raise ValueError(
                f"expected [{self.out_features}, {self.in_features}], got "
                f"[{weight.out_features}, {weight.in_features}]"
            )
        self.gguf_weight = weight
        self.weight = None

    @property
    def kernel_weight(self) -> torch.Tensor | gguf_ops.GGUFWeight | None:
        """What the C kernels multiply by: the packed or the GGUF weight (None: neither)."""
        return self.packed_weight if self.gguf_weight is None else self.gguf_weight

    def load(self, param_name: str, tensor: torch.Tensor, shard_id: str = "") -> None:
        """Copy a checkpoint ``weight [size, in]`` or ``bias [size]`` into its shard."""
        offset, size = self.shards[shard_id]
        if param_name == "weight":
            target, tensor = self.weight.data.narrow(1, offset, size), tensor.t()
        elif param_name == "bias" and self.bias is not None:
            target = self.bias.data.narrow(0, offset, size)
        else:
            raise ValueError(f"no parameter {param_name!r} to load")
        if target.shape != tensor.shape:
            raise ValueError(
                f"{param_name} shard {shard_id!r}: expected {tuple(target.shape[::-1])}, "
                f"got {tuple(tensor.shape[::-1])}"
            )
        target.copy_(tensor)

    def use_cpu_kernels(self, enabled: bool, weight_dtype: torch.dtype = torch.float32) -> None:
        """Hold the weight packed for ``kernels.dense_ops.linear`` (enabled, when the
        output width packs; stored as ``weight_dtype``) or as the float32 ``[in, out]``
        parameter; never both at once. A GGUF weight stays as it is with the kernels on and
        becomes its dequantised float32 values without them."""
        if self.gguf_weight is not None:
            if not enabled:
                self.weight = nn.Parameter(dequantize_gguf(self.gguf_weight).t().contiguous())
                self.gguf_weight = None
            return
        if enabled and self.packed_weight is None:
            if self.weight.shape[1] % dense_ops.LINEAR_COLS == 0:
                weight = self.weight.detach()
                self.packed_weight = dense_ops.pack_linear_weight(weight, weight_dtype)
                self.weight = None
        elif not enabled and self.packed_weight is not None:
            self.weight = nn.Parameter(dense_ops.unpack_linear_weight(self.packed_weight))
            self.packed_weight = None

    def dequantize_int8_(self) -> None:
        """Replaces the (unpacked) weight by its int8 quantization, dequantized."""
        with torch.no_grad():
            q, scale = dense_ops.quantize_int8(self.weight.float())
            self.weight.copy_(q.float() * scale)

    def weight_in_out(self) -> torch.Tensor:
        """The weight as ``[in, out]``, however it is held."""
        if self.gguf_weight is not None:
            return dequantize_gguf(self.gguf_weight).t()
        if self.packed_weight is None:
            return self.weight
        return dense_ops.unpack_linear_weight(self.packed_weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight (+ bias) (+ residual)``; the residual add rides in the matmul."""
        if self.gguf_weight is not None:
            return gguf_ops.linear(x, self.gguf_weight, self.bias, residual)
        if self.packed_weight is not None:
            return dense_ops.linear(x, self.packed_weight, self.bias, residual)
        if residual is None:
            if self.bias is None:
                return torch.mm(x, self.weight)
            return torch.addmm(self.bias, x, self.weight)
        out = torch.addmm(residual, x, self.weight)
        return out if self.bias is None else out.add_(self.bias)


def dequantize_gguf(weight: gguf_ops.GGUFWeight) -> torch.Tensor:
    """float32 ``[out, in]``: by the C kernels where they build, else ``gguf.quants``."""
    if dense_ops.library_loads():
        return weight.dequantize()
    from specdec.runtime.gguf_file import reference_dequantize

    return reference_dequantize(weight)


class GGUFEmbedding(nn.Module):
    """An embedding table kept in GGUF blocks: a lookup dequantises only the rows it reads."""

    def __init__(self, weight: gguf_ops.GGUFWeight) -> None:
        super().__init__()
        self.gguf_weight = weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gguf_weight.rows(input_ids)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d = config.head_dim
        kv_size = config.num_kv_heads * d
        self.qkv_proj = Linear(
            config.hidden_size,
            {"q": config.num_heads * d, "k": kv_size, "v": kv_size},
            config.attention_bias,
        )
        self.o_proj = Linear(config.num_heads * d, config.hidden_size, config.attention_bias)
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
        self, x: torch.Tensor, rope: RotaryStep, ctx: ForwardContext, residual: torch.Tensor
    ) -> torch.Tensor:
        """``residual + attention(x)``."""
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(num_tokens, -1, self.head_dim)
        num_qk = self.num_heads + self.num_kv_heads
        if rope.positions is not None:  # q/k norm and RoPE in one C call, in place
            norm_weight = self.qk_norm_weight if self.qk_norm else None
            eps = self.q_norm.eps if self.qk_norm else 0.0
            dense_ops.qk_norm_rope_(
                qkv, num_qk, norm_weight, eps, rope.cos, rope.sin_signed, rope.positions
            )
            q, k, v = qkv.split((self.num_heads, self.num_kv_heads, self.num_kv_heads), dim=1)
        else:
            qk, v = qkv.split((num_qk, self.num_kv_heads), dim=1)
            if self.qk_norm:
                qk = F.rms_norm(qk, (self.head_dim,), None, self.q_norm.eps) * self.qk_norm_weight
            qk = apply_rotary(qk, rope.cos, rope.sin_signed)
            q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        out = ctx.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(num_tokens, -1), residual)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, {"gate": size, "up": size}, config.mlp_bias)
        self.down_proj = Linear(size, config.hidden_size, config.mlp_bias)
        self.cpu_kernels = False  # CausalLM.use_cpu_kernels

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + mlp(x)``."""
        gate_up = self.gate_up_proj(x)
        if self.cpu_kernels:
            return self.down_proj(dense_ops.silu_and_mul(gate_up), residual)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up, residual)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: RotaryStep, ctx: ForwardContext) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), rope, ctx, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.reads_target_features:
            size, eps = config.hidden_size, config.rms_norm_eps
            self.embed_norm = RMSNorm(size, eps)
            self.feature_norm = RMSNorm(size, eps)
            self.fc = Linear(2 * size, size, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim, max_positions)
        self.cpu_kernels = False  # CausalLM.use_cpu_kernels
        # Every layer in one C call where the step allows (CausalLM.use_cpu_kernels).
        self.native_layers: DecoderLayers | None = None
        self.config = config

    def forward(
        self, input_ids: torch.Tensor, ctx: ForwardContext, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``features`` ``[T, hidden]``: the target's, for a model that reads them."""
        x = self.embed_tokens(input_ids)
        if self.config.reads_target_features:
            if features is None:
                features = torch.zeros_like(x)
            joined = torch.cat([self.embed_norm(x), self.feature_norm(features.to(x.dtype))], -1)
            x = self.fc(joined)
        rope = self.rotary_emb.for_step(ctx.positions, x.dtype, in_kernel=self.cpu_kernels)
        step = ctx.native_step() if self.native_layers is not None else None
        if step is not None:
            x = self.native_layers(x, rope.positions, rope.cos, rope.sin_signed, step)
        else:
            for layer in self.layers:
                x = layer(x, rope, ctx)
        return self.norm(x)

    def build_native_layers(self, config: ModelConfig) -> DecoderLayers | None:
        """The C loop over this model's layers, or None unless every linear is packed."""
        linears = [m for m in self.layers.modules() if isinstance(m, Linear)]
        if not self.cpu_kernels or any(m.kernel_weight is None for m in linears):
            return None
        shape = Shape(
            hidden=config.hidden_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            intermediate=config.intermediate_size,
            eps=config.rms_norm_eps,
            qk_eps=config.rms_norm_eps,
        )
        layers = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(
                {
                    "input_norm": layer.input_layernorm.weight.detach(),
                    "qkv": attn.qkv_proj.kernel_weight,
                    "qkv_bias": _detached(attn.qkv_proj.bias),
                    "qk_norm": attn.qk_norm_weight if attn.qk_norm else None,
                    "o_proj": attn.o_proj.kernel_weight,
                    "o_bias": _detached(attn.o_proj.bias),
                    "post_norm": layer.post_attention_layernorm.weight.detach(),
                    "gate_up": mlp.gate_up_proj.kernel_weight,
                    "gate_up_bias": _detached(mlp.gate_up_proj.bias),
                    "down": mlp.down_proj.kernel_weight,
                    "down_bias": _detached(mlp.down_proj.bias),
                }
            )
        return DecoderLayers(shape, layers)


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()


class CausalLM(nn.Module):
    """``forward`` -> final hidden states ``[T, hidden]``; ``compute_logits`` -> float32
    ``[T, vocab]``, -inf at the ids a frequency-ranked head (``head_token_ids``) leaves out."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_positions)
        self.lm_head = Linear(config.hidden_size, config.head_size, bias=False)
        # Set by finalize: built on the meta device, a buffer would hold garbage until then.
        self.register_buffer("head_token_ids", None, persistent=False)

    def forward(
        self, input_ids: torch.Tensor, ctx: ForwardContext, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.model(input_ids, ctx, features)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.head_token_ids is None:
            return logits
        full = logits.new_full((logits.shape[0], self.config.vocab_size), float("-inf"))
        return full.index_copy_(1, self.head_token_ids, logits)

    def greedy_head(self) -> GreedyHead | None:
        """What the C greedy loop (``DecoderLayers.greedy``) needs past the layers; None
        unless the layers run in C and the head is packed."""
        if self.model.native_layers is None or self.lm_head.kernel_weight is None:
            return None
        norm = self.model.norm
        embed = self.model.embed_tokens
        return GreedyHead(
            embed=embed.gguf_weight if isinstance(embed, GGUFEmbedding) else embed.weight.detach(),
            norm=norm.weight.detach(),
            eps=norm.eps,
            head=self.lm_head.kernel_weight,
            token_ids=self.head_token_ids,
        )

    def use_cpu_kernels(
        self,
        enabled: bool,
        weight_dtype: torch.dtype = torch.float32,
        quantization: str = "none",
    ) -> bool:
        """Run the linears, RMSNorm, q/k norm + RoPE and SiLU-and-mul as C kernels
        (``kernels.dense_ops``) when ``enabled`` and the model is float32 on the CPU with
        the kernels built; else PyTorch. Call after loading. Returns whether they are on.

        A 16-bit ``weight_dtype`` stores the packed linears in it (half the bytes a step
        reads) and rounds every other weight to it too, so the model is the checkpoint in
        that dtype, computed in float32. ``quantization`` "int8" then stores the linears
        as int8 with a scale per output column (``dense_ops.quantize_int8``, a quarter of
        float32's bytes); without the C kernels their weights become those dequantized
        values, so both paths run the same quantized model."""
        on = enabled and dense_ops.available(self.model.norm.weight)
        if self.holds_gguf:  # its linears keep the file's blocks: no second quantization
            quantization = "none"
            if not on:
                self._dequantize_gguf_embedding()
        if on and weight_dtype != torch.float32:
            with torch.no_grad():
                for param in self.parameters():
                    param.copy_(param.to(weight_dtype))
            self.finalize()  # the fused q/k norm weights, from the rounded ones
        packed_dtype = torch.int8 if quantization == "int8" else weight_dtype
        for module in self.modules():
            if isinstance(module, Linear):
                module.use_cpu_kernels(on, packed_dtype)
                if not on and quantization == "int8":
                    module.dequantize_int8_()
            elif hasattr(module, "cpu_kernels"):
                module.cpu_kernels = on
        # Every step streams the packed weights: on huge pages (see kernels.huge_pages).
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        packed = [m for m in linears if m.packed_weight is not None]
        copies = into_huge_pages([m.packed_weight for m in packed])
        for module, weight in zip(packed, copies, strict=True):
            module.packed_weight = weight
        self._gguf_into_huge_pages()
        self.model.native_layers = self.model.build_native_layers(self.config)
        return on

    @property
    def holds_gguf(self) -> bool:
        """Whether the embedding (and with it every linear) is held in GGUF blocks."""
        return isinstance(self.model.embed_tokens, GGUFEmbedding)

    def _dequantize_gguf_embedding(self) -> None:
        embed = self.model.embed_tokens.gguf_weight
        table = nn.Embedding(embed.out_features, embed.in_features)
        table.weight.data = dequantize_gguf(embed)
        self.model.embed_tokens = table

    def _gguf_into_huge_pages(self) -> None:
        """The GGUF weights' bytes on huge pages, a weight shared by the embedding and a
        tied head copied once."""
        holders = [m for m in self.modules() if getattr(m, "gguf_weight", None) is not None]
        weights = list({id(m.gguf_weight): m.gguf_weight for m in holders}.values())
        copies = into_huge_pages([p.data for w in weights for p in w.parts])
        moved = {}
        for weight in weights:
            moved[id(weight)] = weight.with_data(copies[: len(weight.parts)])
            copies = copies[len(weight.parts) :]
        for module in holders:
            module.gguf_weight = moved[id(module.gguf_weight)]

    def finalize(self) -> None:
        """After loading: tie ``lm_head`` to the embeddings (a transposed copy; only the
        head's rows when it covers part of the vocabulary) if asked."""
        if self.holds_gguf:  # the loader set the head; only the q/k norms are fused here
            for layer in self.model.layers:
                layer.self_attn.finalize()
            return
        embedding = self.model.embed_tokens.weight.data
        if self.config.head_token_ids:
            self.head_token_ids = torch.tensor(
                self.config.head_token_ids, dtype=torch.int64, device=embedding.device
            )
        if self.config.tie_word_embeddings:
            rows = embedding if self.head_token_ids is None else embedding[self.head_token_ids]
            self.lm_head.load("weight", rows)
        for layer in self.model.layers:
            layer.self_attn.finalize()
