"""A request's logits processing before it samples or takes the argmax: min_tokens,
logit_bias, then the repetition, frequency and presence penalties (vLLM's order and
meanings), applied position by position along a speculative chain.

Row ``r`` of a step's logits is the position after the sequence's history and the chain's
first ``r`` tokens, so a penalty there counts exactly the tokens target-only decoding would
have produced before it. Both services run this on the same history (the target on what
it holds, the draft on its committed log), which keeps the draft's proposals under the
distribution the target verifies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class LogitsProcessing:
    """The request's parameters; their defaults change nothing (``active`` False)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    min_tokens_stop_ids: tuple[int, ...] = ()
    num_prompt_tokens: int = 0  # where the output begins in the sequence

    @property
    def active(self) -> bool:
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or (self.min_tokens and self.min_tokens_stop_ids)
        )

    def apply(
        self, logits: torch.Tensor, history: Sequence[int] | np.ndarray, chain: Sequence[int]
    ) -> torch.Tensor:
        """float32 ``[R, V]`` from ``logits`` ``[R, V]``: row ``r`` is the position after
        ``history`` (the sequence's tokens from position 0) and ``chain[:r]``."""
        out = logits.to(torch.float32, copy=True)
        if not self.active:
            return out
        rows, vocab = out.shape
        device = out.device
        start = len(history)
        if self.min_tokens and self.min_tokens_stop_ids:
            produced = start - self.num_prompt_tokens + np.arange(rows)  # outputs before each row
            early = torch.from_numpy(np.flatnonzero(produced < self.min_tokens)).to(device)
            stops = torch.tensor(self.min_tokens_stop_ids, dtype=torch.int64, device=device)
            blocked = out[early]
            blocked[:, stops] = float("-inf")
            # A row that allows nothing but stop tokens (a grammar that may only end there)
            # keeps them: min_tokens yields rather than leave no token at all.
            alive = torch.isfinite(blocked).any(dim=-1)
            out[early[alive]] = blocked[alive]
        if self.logit_bias:
            ids = torch.tensor([t for t, _ in self.logit_bias], dtype=torch.int64, device=device)
            bias = torch.tensor([b for _, b in self.logit_bias], dtype=torch.float32, device=device)
            out[:, ids] += bias
        if not (self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1):
            return out
        counts = self._output_counts(history, chain, rows, vocab).to(device)
        if self.repetition_penalty != 1.0:
            prompt = torch.as_tensor(np.asarray(history[: self.num_prompt_tokens], np.int64))
            seen = counts > 0
            seen[:, prompt.to(device)] = True
            penalised = torch.where(
                out > 0, out / self.repetition_penalty, out * self.repetition_penalty
            )
            out = torch.where(seen, penalised, out)
        out -= self.frequency_penalty * counts
        out -= self.presence_penalty * (counts > 0).to(torch.float32)
        return out

    def _output_counts(
        self, history: Sequence[int] | np.ndarray, chain: Sequence[int], rows: int, vocab: int
    ) -> torch.Tensor:
        """float32 ``[rows, vocab]``: how often each token occurs among the output tokens
        before each row."""
        output = np.asarray(history[self.num_prompt_tokens :], dtype=np.int64)
        base = torch.from_numpy(np.bincount(output, minlength=vocab)[:vocab].astype(np.float32))
        counts = base.repeat(rows, 1)
        for r in range(1, rows):
            counts[r:, chain[r - 1]] += 1.0
        return counts
