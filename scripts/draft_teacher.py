"""The target's answers to chat prompts, with its next-token distribution at every position.

A batched Llama forward in plain PyTorch over the target's weights held in bfloat16, so
its matrix products run on the CPU's bfloat16 units (AMX / AVX-512 BF16 through oneDNN,
several times the float32 rate where the CPU has them; correct but slower elsewhere):
right-padded ragged batches over a preallocated KV cache, greedy or sampled answers,
then one causal pass over every finished sequence that keeps the top-k log-probabilities
over the full vocabulary (float16) at each position, which is what the draft is distilled
towards. bfloat16 moves the target's argmax away from its float32 one only at near-ties
(``agreement_with_runtime`` measures how often).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.runtime import ModelRunner, SequenceChunk
from specdec.runtime.loader import iterate_checkpoint
from specdec.runtime.model_config import ModelConfig


@dataclass
class TeacherSequence:
    """Prompt + answer tokens; ``top_ids`` / ``top_logprobs`` ``[len - 1, k]``: the target's
    top-k next-token log-probs after each token but the last."""

    token_ids: list[int]
    prompt_len: int
    sampled: bool
    top_ids: torch.Tensor  # int32
    top_logprobs: torch.Tensor  # float16

    @property
    def num_answer_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


class Teacher:
    """The target (an HF Llama folder) as a batched bfloat16 forward with a KV cache."""

    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.bfloat16):
        config = ModelConfig.from_pretrained(model_dir)
        if config.qk_norm or config.rope.rope_type != "default" or config.head_token_ids:
            raise ValueError(f"{model_dir}: the teacher runs plain Llama checkpoints only")
        self.num_layers = config.num_layers
        self.num_heads, self.num_kv = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.eos = config.eos_token_ids[0]
        self.w = {
            name: tensor.to(dtype)
            for name, tensor in iterate_checkpoint(model_dir)
            if not name.endswith("_scale")
        }
        self.head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        half = self.head_dim // 2
        self.inv_freq = 1.0 / config.rope.theta ** (torch.arange(half).float() / half)
        self.dtype = dtype

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * weight.float()).to(self.dtype)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x ``[B, H, T, D]``, positions ``[B, T]`` (HF Llama's rotate-half convention);
        float32 out."""
        angles = positions[:, None, :, None].float() * self.inv_freq
        cos, sin = angles.cos(), angles.sin()
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, ids, positions, cache, mask) -> torch.Tensor:
        """Hidden states ``[B, T, hidden]`` (final norm applied) for tokens ``ids [B, T]`` at
        ``positions``; their K/V are written into ``cache`` at those positions; ``mask``
        ``[B, 1, T, S]`` says which of the first S cached positions each query sees."""
        b, t = ids.shape
        x = F.embedding(ids, self.w["model.embed_tokens.weight"])
        rows = torch.arange(b)[:, None, None]
        heads = torch.arange(self.num_kv)[None, :, None]
        slots = positions[:, None, :]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = F.linear(h, self.w[p + "self_attn.q_proj.weight"])
            k = F.linear(h, self.w[p + "self_attn.k_proj.weight"])
            v = F.linear(h, self.w[p + "self_attn.v_proj.weight"])
            q = self.rope(q.view(b, t, self.num_heads, -1).transpose(1, 2), positions)
            k = self.rope(k.view(b, t, self.num_kv, -1).transpose(1, 2), positions)
            keys, values = cache[i]
            keys[rows, heads, slots] = k.to(self.dtype)
            values[rows, heads, slots] = v.view(b, t, self.num_kv, -1).transpose(1, 2)
            span = mask.shape[-1]  # the cached positions any query sees
            out = attention(q.to(self.dtype), keys[:, :, :span], values[:, :, :span], mask)
            x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1),
                             self.w[p + "self_attn.o_proj.weight"])  # fmt: skip
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = F.linear(h, self.w[p + "mlp.gate_proj.weight"])
            up = F.linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        return self.norm(x, self.w["model.norm.weight"])

    def new_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.num_kv, length, self.head_dim)
        return [
            (torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
            for _ in range(self.num_layers)
        ]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head).float()


def attention(q, keys, values, mask) -> torch.Tensor:
    """Grouped-query attention; one query row per sequence as a batched matmul (the fused
    CPU kernel is slow for it), longer ones through SDPA."""
    b, h, t, d = q.shape
    if t > 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    kv = keys.shape[1]
    scores = q.view(b, kv, h // kv, d) @ keys.transpose(-1, -2) * d**-0.5
    scores = scores.float().masked_fill(~mask.view(b, 1, 1, -1), float("-inf"))
    return (scores.softmax(-1).to(q.dtype) @ values).view(b, h, 1, d)


def causal_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, 1, length, length]``: causal, and no query sees a padded key."""
    pos = torch.arange(length)
    causal = pos[None, :] <= pos[:, None]
    real = pos[None, :] < lengths[:, None]
    return (causal[None] & real[:, None, :])[:, None]


@torch.inference_mode()
def generate(
    teacher: Teacher,
    prompts: list[list[int]],
    sampled: list[bool],
    max_new_tokens: int,
    temperature: float,
    k: int,
    generator: torch.Generator,
) -> list[TeacherSequence]:
    """Answer every prompt (greedy, or sampled at ``temperature`` where ``sampled``) until
    an EOS token (kept) or ``max_new_tokens``."""
    b = len(prompts)
    rows = torch.arange(b)
    lengths = torch.tensor([len(p) for p in prompts])
    width = int(lengths.max())
    total = width + max_new_tokens
    ids = torch.full((b, total), teacher.eos, dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    cache = teacher.new_cache(b, total)
    hidden = teacher.forward(ids[:, :width], torch.arange(width).expand(b, width), cache,
                             causal_mask(lengths, width))  # fmt: skip
    tops = [[top_k(teacher.logits(hidden[i, : len(p)]), k)] for i, p in enumerate(prompts)]
    last = teacher.logits(hidden[rows, lengths - 1])
    sampled_rows = torch.tensor(sampled).nonzero()[:, 0]
    done = torch.zeros(b, dtype=torch.bool)
    cur = lengths.clone()  # where each sequence's next token goes
    for step in range(max_new_tokens):
        token = last.argmax(-1)
        if sampled_rows.numel():
            # The Gumbel-max trick: argmax(logits / T + G), G ~ Gumbel(0, 1), draws from
            # softmax(logits / T).
            u = torch.rand(len(sampled_rows), last.shape[1], generator=generator)
            gumbel = -(-u.clamp(min=1e-20).log()).log()
            token[sampled_rows] = (last[sampled_rows] / temperature + gumbel).argmax(-1)
        ids[rows, cur] = torch.where(done, ids[rows, cur], token)
        done |= token == teacher.eos
        cur = torch.where(done, cur, cur + 1)
        if bool(done.all()) or step + 1 == max_new_tokens:
            break
        span = int(cur.max())
        step_mask = (torch.arange(span)[None, :] < cur[:, None])[:, None, None, :]
        hidden = teacher.forward(ids[rows, cur - 1][:, None], (cur - 1)[:, None], cache,
                                 step_mask)  # fmt: skip
        last = teacher.logits(hidden[:, 0])
        top_ids, top_lp = top_k(last, k)
        for i in (~done).nonzero()[:, 0].tolist():
            tops[i].append((top_ids[i : i + 1], top_lp[i : i + 1]))
    # An answer ends after its EOS (kept) or at max_new_tokens; the log-probs cover every
    # position but the last.
    out = []
    for i, p in enumerate(prompts):
        end = int(cur[i]) + int(done[i])
        top_ids = torch.cat([t[0] for t in tops[i]])[: end - 1]
        top_lp = torch.cat([t[1] for t in tops[i]])[: end - 1]
        out.append(TeacherSequence(ids[i, :end].tolist(), len(p), sampled[i], top_ids, top_lp))
    return out


@torch.inference_mode()
def cached_answers(path: Path) -> dict[tuple[int, ...], TeacherSequence]:
    """The answers cached in ``path`` (none if it does not exist), keyed by their prompt, so
    a later run reuses every answer whose prompt it still asks, whatever the order."""
    if not path.is_file():
        return {}
    data: list[TeacherSequence] = torch.load(path, weights_only=False)
    return {tuple(seq.token_ids[: seq.prompt_len]): seq for seq in data}


def agreement_with_runtime(teacher: Teacher, runner: ModelRunner, data) -> float:
    """Share of positions where the bfloat16 teacher's argmax equals the project's float32
    runtime's (what greedy verification compares with)."""
    agree = count = 0
    for n, seq in enumerate(data):
        runner.open(f"check-{n}")
        try:
            chunk = SequenceChunk(f"check-{n}", seq.token_ids[:-1], len(seq.token_ids) - 1)
            logits = runner.extend([chunk])[0]
        finally:
            runner.release(f"check-{n}")
        agree += int((logits.argmax(-1) == seq.top_ids[:, 0]).sum())
        count += len(seq.token_ids) - 1
    return agree / count
