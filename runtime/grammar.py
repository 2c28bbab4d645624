"""Structured output: a request's constraint as an llguidance grammar, and the tokens each
position of a sequence allows under it.

A ``GrammarState`` follows one sequence's output tokens. Asked for the masks of a step's
rows (the position after the output so far, then after each token of a chain), it first
brings its matcher to that output (rolling back what the sequence no longer holds,
consuming what it gained), so the same state serves the target's verification, with
rejected proposals rolled back, and the draft's picks, proposal after proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llguidance
import numpy as np
import torch

from specdec.runtime.structured_output import GrammarError


class GrammarTokenizer:
    """The model folder's ``tokenizer.json`` as llguidance reads it, loaded on first use."""

    def __init__(self, model: str, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        path = Path(model)
        self.path = (path.parent if path.is_file() else path) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None

    def state(self, grammar: str) -> GrammarState:
        """A fresh matcher for ``grammar``; GrammarError when it does not compile."""
        if self._tokenizer is None:
            if not self.path.is_file():
                raise GrammarError(f"structured output needs the model's {self.path}")
            self._tokenizer = llguidance.LLTokenizer(
                self.path.read_text(), eos_token=self.eos_token_ids or None
            )
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"structured output: {matcher.get_error()}")
        return GrammarState(grammar, matcher, self.vocab_size)


class Grammars:
    """The grammar states of a service's sequences."""

    def __init__(self, tokenizer: GrammarTokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, GrammarState] = {}

    def masks(
        self, seq_id: str, grammar: str, output: Sequence[int], chain: Sequence[int], rows: int
    ) -> torch.Tensor:
        """``GrammarState.masks`` of the sequence's state for ``grammar`` (made on first
        use, or again when the request's grammar changed)."""
        return self.state(seq_id, grammar).masks(output, chain, rows)

    def state(self, seq_id: str, grammar: str) -> GrammarState:
        """The sequence's state for ``grammar``; GrammarError when it does not compile."""
        state = self._states.get(seq_id)
        if state is None or state.grammar != grammar:
            state = self._states[seq_id] = self.tokenizer.state(grammar)
        return state

    def release(self, seq_id: str) -> None:
        self._states.pop(seq_id, None)


class GrammarState:
    """One sequence's matcher and the output tokens it has consumed."""

    def __init__(self, grammar: str, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.grammar = grammar
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.consumed: list[int] = []

    def masks(self, output: Sequence[int], chain: Sequence[int], rows: int) -> torch.Tensor:
        """bool ``[rows, vocab]``: row ``r`` allows the tokens the grammar accepts after
        ``output`` and ``chain[:r]``. Rows after a chain token the grammar refuses (or
        after ``output`` itself breaking it) allow everything: no token there can be kept,
        since verification stops at the refused one."""
        allowed = torch.ones(rows, self.vocab_size, dtype=torch.bool)
        if not self._follow(list(output)):
            return allowed
        for r in range(rows):
            allowed[r] = self._allowed()
            if r + 1 < rows and not self._follow([*output, *chain[: r + 1]]):
                break
        return allowed

    def _follow(self, tokens: list[int]) -> bool:
        """Brings the matcher to exactly ``tokens``; False where the grammar refuses one
        (the matcher then holds the longest prefix it accepts)."""
        common = 0
        for a, b in zip(self.consumed, tokens, strict=False):
            if a != b:
                break
            common += 1
        if common < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - common)
            del self.consumed[common:]
        rest = tokens[common:]
        taken = self.matcher.try_consume_tokens(rest) if rest else 0
        self.consumed += rest[:taken]
        return taken == len(rest)

    def _allowed(self) -> torch.Tensor:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        row = torch.zeros(self.vocab_size, dtype=torch.bool)
        row[: len(mask)] = torch.from_numpy(mask)
        return row
