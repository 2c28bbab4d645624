"""Structured output: a request's constraint as an llguidance grammar, and the tokens each
position of a sequence allows under it.

A ``GrammarState`` follows one sequence's output tokens. Asked for the masks of a step's
rows (the position after the output so far, then after each token of a chain), it first
brings its matcher to that output (rolling back what the sequence no longer holds,
consuming what it gained), so the same state serves the target's verification, with
rejected proposals rolled back, and the draft's picks, proposal after proposal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

import llguidance
import numpy as np
import torch

from specdec.runtime.structured_output import GrammarError


class GrammarTokenizer:
    """The model folder's ``tokenizer.json`` as llguidance reads it: loaded when the
    service starts (0.2 s for a 49k vocabulary, which the first structured request would
    otherwise wait for, with every request batched beside it); a missing or unreadable file
    fails the structured requests alone."""

    def __init__(self, model: str, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        path = Path(model)
        self.path = (path.parent if path.is_file() else path) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        with contextlib.suppress(GrammarError):
            self._loaded()

    def state(self, grammar: str) -> GrammarState:
        """A fresh state for ``grammar``; GrammarError when it does not compile or the
        tokenizer cannot be read."""
        return GrammarState(grammar, self.matcher, self.vocab_size, self.num_ids)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A matcher at the grammar's start; GrammarError as ``state``."""
        tokenizer = self._loaded()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"structured output: {matcher.get_error()}")
        return matcher

    @property
    def num_ids(self) -> int:
        """Token ids the tokenizer knows (the model's vocabulary may pad past them)."""
        return self._loaded().vocab_size

    def _loaded(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            if not self.path.is_file():
                raise GrammarError(f"structured output needs the model's {self.path}")
            try:
                self._tokenizer = llguidance.LLTokenizer(
                    self.path.read_text(), eos_token=self.eos_token_ids or None
                )
            except (OSError, ValueError, RuntimeError) as e:
                raise GrammarError(f"structured output: cannot read {self.path}: {e}") from None
        return self._tokenizer


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

    def __init__(
        self,
        grammar: str,
        new_matcher: Callable[[str], llguidance.LLMatcher],
        vocab_size: int,
        num_ids: int,
    ) -> None:
        self.grammar = grammar
        self.new_matcher = new_matcher
        self.matcher = new_matcher(grammar)
        self.vocab_size = vocab_size  # the model's (its logits' width)
        self.num_ids = num_ids  # the tokenizer's: the grammar refuses every id past them
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
            if r + 1 < rows and not self._extend([chain[r]]):
                break
        return allowed

    def _follow(self, tokens: list[int]) -> bool:
        """Brings the matcher to exactly ``tokens``; False where the grammar refuses one
        (the matcher then holds the longest prefix it accepts). A matcher that fell into
        llguidance's error state is made again and replayed, never reused."""
        common = 0
        for a, b in zip(self.consumed, tokens, strict=False):
            if a != b:
                break
            common += 1
        if common < len(self.consumed):
            if not self.matcher.rollback(len(self.consumed) - common):
                return self._restart(tokens)
            del self.consumed[common:]
        return self._extend(tokens[common:])

    def _extend(self, tokens: list[int]) -> bool:
        """Consumes the longest prefix of ``tokens`` the grammar accepts (an id past the
        tokenizer's is refused); True when it accepted them all. A matcher that broke is
        made again at what it accepted."""
        usable = next((i for i, t in enumerate(tokens) if t >= self.num_ids), len(tokens))
        taken = self.matcher.try_consume_tokens(tokens[:usable]) if usable else 0
        if self.matcher.is_error():
            return self._restart(self.consumed + tokens[:taken]) and taken == len(tokens)
        self.consumed += tokens[:taken]
        return taken == len(tokens)

    def _restart(self, tokens: list[int]) -> bool:
        self.matcher = self.new_matcher(self.grammar)
        self.consumed = []
        taken = self.matcher.try_consume_tokens(tokens) if tokens else 0
        self.consumed = tokens[:taken]
        return taken == len(tokens) and not self.matcher.is_error()

    def _allowed(self) -> torch.Tensor:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        row = torch.zeros(self.vocab_size, dtype=torch.bool)
        row[: len(mask)] = torch.from_numpy(mask)
        return row
