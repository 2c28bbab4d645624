"""Counter-based random draws keyed by (key, domain, position, draw index).

A draw is a pure function of its coordinates, not the next value of a generator's state,
so a seeded request samples the same tokens whatever the batching, the step boundaries
or a service restart, and two services that use different domains can never share a
stream (the draft's proposals stay independent of the target's acceptance tests, which
chain rejection sampling needs to be lossless).
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from dataclasses import dataclass

import torch

DRAFT_DOMAIN = "specdec.draft"
TARGET_DOMAIN = "specdec.target"

# Draw indices within one (domain, position).
PROPOSE_DRAW = 0  # draft: the proposal at this position
ACCEPT_DRAW = 0  # target: the acceptance test of the proposal at this position
SAMPLE_DRAW = 1  # target: its own token at this position (after a rejection, bonus, K = 0)
KERNEL_SEED_DRAW = 2  # target: the seed of a fused kernel's generator for a step at this position

_U64 = (1 << 64) - 1
_MANTISSA_SCALE = 2.0**-53


@dataclass(frozen=True)
class RandomStream:
    """One request's draws on one service.

    ``key`` is the request's seed, or fresh entropy when it has none; ``domain`` names the
    service, so equal seeds on the draft and the target give unrelated draws.
    """

    key: int
    domain: str

    @classmethod
    def for_request(cls, seed: int | None, domain: str) -> RandomStream:
        """Seeded (reproducible) when ``seed`` is set, else keyed by fresh OS entropy."""
        return cls(secrets.randbits(64) if seed is None else seed & _U64, domain)

    def bits(self, position: int, draw: int) -> int:
        """64 uniformly distributed bits for ``(position, draw)``."""
        message = struct.pack("<QQQ", self.key, position & _U64, draw & _U64)
        digest = hashlib.blake2b(message, digest_size=8, person=self.domain.encode()[:16])
        return int.from_bytes(digest.digest(), "little")

    def uniform(self, position: int, draw: int) -> float:
        """A float64 in the open interval (0, 1) for ``(position, draw)``."""
        return ((self.bits(position, draw) >> 11) + 0.5) * _MANTISSA_SCALE

    def uniforms(self, positions: range, draw: int) -> torch.Tensor:
        """Float64 ``[len(positions)]``: one :meth:`uniform` per position."""
        return torch.tensor([self.uniform(p, draw) for p in positions], dtype=torch.float64)

    def torch_generator(self, position: int, device: torch.device) -> torch.Generator:
        """A generator seeded for the step that starts at ``position`` (fused kernels)."""
        gen = torch.Generator(device=device)
        gen.manual_seed(self.bits(position, KERNEL_SEED_DRAW) >> 1)
        return gen
