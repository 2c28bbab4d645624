"""A request's sampling parameters, checked where they enter a model service."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specdec.kernels.random_stream import RandomStream
from specdec.kernels.sampling import logits_to_probs
from specdec.runtime.errors import InvalidRequestError
from specdec.runtime.logits_processing import LogitsProcessing
from specdec.runtime.sampling_limits import MAX_LOGPROBS, MIN_SAMPLING_TEMPERATURE
from specdec.runtime.structured_output import GrammarError, grammar_of
from specdec.v1 import common_pb2


@dataclass(frozen=True)
class Sampling:
    """``SamplingParams`` checked: temperature 0 = greedy; top_p 0 means off (1.0)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    processing: LogitsProcessing = LogitsProcessing()
    logprobs: int | None = None  # top logprobs per emitted token; None: none asked
    grammar: str | None = None  # structured output, as an llguidance grammar
    prompt_logprobs: int | None = None  # top logprobs per prompt token; None: none asked

    @classmethod
    def from_proto(cls, msg: common_pb2.SamplingParams, request_id: str) -> Sampling:
        t, p = msg.temperature, msg.top_p
        if not (t >= 0.0 and t != float("inf")):
            raise InvalidRequestError(
                f"request {request_id}: temperature must be a finite number >= 0, got {t}"
            )
        if not 0.0 <= p <= 1.0:
            raise InvalidRequestError(f"request {request_id}: top_p must be in [0, 1], got {p}")
        if not 0.0 <= msg.min_p <= 1.0:
            raise InvalidRequestError(
                f"request {request_id}: min_p must be in [0, 1], got {msg.min_p}"
            )
        rep = msg.repetition_penalty or 1.0
        if not (math.isfinite(rep) and rep > 0):
            raise InvalidRequestError(
                f"request {request_id}: repetition_penalty must be > 0, got {rep}"
            )
        pen = (msg.presence_penalty, msg.frequency_penalty)
        bias = sorted(msg.logit_bias.items())
        if not all(math.isfinite(v) for v in (*pen, *(b for _, b in bias))):
            raise InvalidRequestError(
                f"request {request_id}: penalties and logit_bias must be finite numbers"
            )
        for name in ("logprobs", "prompt_logprobs"):
            if msg.HasField(name) and getattr(msg, name) > MAX_LOGPROBS:
                raise InvalidRequestError(
                    f"request {request_id}: {name} must be in [0, {MAX_LOGPROBS}], got "
                    f"{getattr(msg, name)}"
                )
        try:
            grammar = grammar_of(msg.structured_output)
        except GrammarError as e:
            raise InvalidRequestError(f"request {request_id}: {e}") from None
        seed = msg.seed if msg.HasField("seed") else None
        greedy = t < MIN_SAMPLING_TEMPERATURE  # as the coordinator: 1e-38 would overflow
        processing = LogitsProcessing(
            presence_penalty=float(msg.presence_penalty),
            frequency_penalty=float(msg.frequency_penalty),
            repetition_penalty=float(rep),
            logit_bias=tuple((int(t), float(b)) for t, b in bias),
            min_tokens=int(msg.min_tokens),
            min_tokens_stop_ids=tuple(msg.min_tokens_stop_ids),
            num_prompt_tokens=int(msg.num_prompt_tokens),
        )
        return cls(
            0.0 if greedy else float(t),
            float(p) if p > 0 else 1.0,
            int(msg.top_k),
            seed,
            float(msg.min_p),
            processing,
            int(msg.logprobs) if msg.HasField("logprobs") else None,
            grammar,
            int(msg.prompt_logprobs) if msg.HasField("prompt_logprobs") else None,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def reads_history(self) -> bool:
        """Its logits depend on the tokens before each position (``processed``)."""
        return self.processing.active or self.grammar is not None

    @property
    def needs_logits(self) -> bool:
        """Each step needs the logits themselves, not only their argmax (no C decode loop)."""
        return self.reads_history or self.logprobs is not None

    def id_out_of_range(self, vocab_size: int) -> int | None:
        """The first token id the parameters name that is not below ``vocab_size``."""
        named = [t for t, _ in self.processing.logit_bias] + list(
            self.processing.min_tokens_stop_ids
        )
        return next((t for t in named if t >= vocab_size), None)

    def processed(
        self,
        logits: torch.Tensor,
        history: Sequence[int] | np.ndarray,
        chain: Sequence[int],
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The logits with the tokens ``allowed`` (bool, as ``logits``; the grammar's
        masks) forbids at -inf, then min_tokens, logit_bias and the penalties
        (``LogitsProcessing``)."""
        if allowed is not None:
            logits = logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))
        if not self.processing.active:
            return logits
        return self.processing.apply(logits, history, chain)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p, self.min_p)

    def random_stream(self, domain: str) -> RandomStream:
        """This request's draws on the service named by ``domain``: keyed by ``seed`` when
        set (reproducible output), else by fresh entropy."""
        return RandomStream.for_request(self.seed, domain)
