"""The target's answers to chat prompts, with its next-token distribution at every position.

The target (the project's ``ModelRunner``: ragged batches, so a finished answer stops
costing anything) prefills a batch of prompts with logits at every prompt position, then
decodes greedily or by sampling. Each position keeps the target's top-k log-probabilities
over the full vocabulary (float16), which is what the draft is distilled towards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import ModelRunner, SequenceChunk


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
    values, ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    return ids.to(torch.int32), values.to(torch.float16)


@torch.inference_mode()
def generate(
    runner: ModelRunner,
    prompts: list[list[int]],
    sampled: list[bool],
    max_new_tokens: int,
    temperature: float,
    k: int,
    generator: torch.Generator,
    prefill_group: int = 16,
) -> list[TeacherSequence]:
    """Answer every prompt (greedy, or sampled at ``temperature`` where ``sampled``) until
    an EOS token (kept) or ``max_new_tokens``."""
    ids = [f"teacher-{i}" for i in range(len(prompts))]
    tokens = [list(p) for p in prompts]
    tops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in prompts]
    last: list[torch.Tensor] = [None] * len(prompts)  # logits after each sequence's last token
    for i in ids:
        runner.open(i)
    try:
        for start in range(0, len(prompts), prefill_group):
            group = range(start, min(start + prefill_group, len(prompts)))
            chunks = [SequenceChunk(ids[i], prompts[i], len(prompts[i])) for i in group]
            for i, logits in zip(group, runner.extend(chunks), strict=True):
                tops[i].append(top_k(logits[:-1], k))
                last[i] = logits[-1]
        active = list(range(len(prompts)))
        for step in range(max_new_tokens):
            still = []
            for i in active:
                tops[i].append(top_k(last[i][None], k))
                if sampled[i]:
                    probs = torch.softmax(last[i] / temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                else:
                    token = int(last[i].argmax())
                tokens[i].append(token)
                if token not in runner.eos_token_ids and step + 1 < max_new_tokens:
                    still.append(i)
            active = still
            if not active:
                break
            chunks = [SequenceChunk(ids[i], [tokens[i][-1]]) for i in active]
            for i, logits in zip(active, runner.extend(chunks), strict=True):
                last[i] = logits[-1]
    finally:
        for i in ids:
            runner.release(i)
    return [
        TeacherSequence(
            token_ids=tokens[i],
            prompt_len=len(prompts[i]),
            sampled=sampled[i],
            top_ids=torch.cat([t[0] for t in tops[i]]),
            top_logprobs=torch.cat([t[1] for t in tops[i]]),
        )
        for i in range(len(prompts))
    ]
