"""A request's sampling parameters, checked where they enter a model service."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.kernels.random_stream import RandomStream
from specdec.kernels.sampling import logits_to_probs
from specdec.runtime.errors import InvalidRequestError
from specdec.v1 import common_pb2

MIN_SAMPLING_TEMPERATURE = 1e-5  # the coordinator's (coordinator/request.py), which has no torch


@dataclass(frozen=True)
class Sampling:
    """``SamplingParams`` checked: temperature 0 = greedy; top_p 0 means off (1.0)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @classmethod
    def from_proto(cls, msg: common_pb2.SamplingParams, request_id: str) -> Sampling:
        t, p = msg.temperature, msg.top_p
        if not (t >= 0.0 and t != float("inf")):
            raise InvalidRequestError(
                f"request {request_id}: temperature must be a finite number >= 0, got {t}"
            )
        if not 0.0 <= p <= 1.0:
            raise InvalidRequestError(f"request {request_id}: top_p must be in [0, 1], got {p}")
        seed = msg.seed if msg.HasField("seed") else None
        greedy = t < MIN_SAMPLING_TEMPERATURE  # as the coordinator: 1e-38 would overflow
        return cls(0.0 if greedy else float(t), float(p) if p > 0 else 1.0, int(msg.top_k), seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)

    def random_stream(self, domain: str) -> RandomStream:
        """This request's draws on the service named by ``domain``: keyed by ``seed`` when
        set (reproducible output), else by fresh entropy."""
        return RandomStream.for_request(self.seed, domain)
