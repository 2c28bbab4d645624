"""One generation request: its committed token log and what each service holds of it."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from specdec.coordinator.engine.features import FeatureLog
from specdec.coordinator.engine.speculation_gate import GateRecord
from specdec.coordinator.engine.stats import SpecStats
from specdec.v1 import common_pb2


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0, top_p 1, min_p 0 and the penalties' defaults = off.
    The logits processing (common.proto ``SamplingParams``) runs on the model services."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None  # top logprobs per output token; None: no logprobs
    structured_output: common_pb2.StructuredOutput | None = None
    prompt_logprobs: int | None = None  # top logprobs per prompt token; None: none

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class AheadProposal:
    """Proposals the draft prepared while the target verified a step (pipelining). They
    hold when the committed log, from length ``base``, continues with exactly ``assumed``
    (the proposals under verification and the draft's guess of the target's token)."""

    base: int
    assumed: tuple[int, ...]
    token_ids: list[int]
    draft_probs: list  # common_pb2.SparseProbs, one per token when sampling
    looked_up: bool = False  # found by prompt lookup

    def holds_for(self, token_ids: list[int]) -> bool:
        end = self.base + len(self.assumed)
        return len(token_ids) == end and tuple(token_ids[self.base :]) == self.assumed


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, not yet scheduled
    RUNNING = "running"  # prefilling or decoding
    FINISHED = "finished"
    ABORTED = "aborted"  # cancelled by the client
    FAILED = "failed"


@dataclass
class RequestOutput:
    """One delta streamed to the client; the last has `finished` or `error` set."""

    token_ids: list[int]
    finish_reason: str | None = None
    error: Exception | None = None
    # With sampling.logprobs: common_pb2.TokenLogprobs, one per token id.
    logprobs: list | None = None
    # With sampling.prompt_logprobs, on the first output: the prompt's from position 1.
    prompt_logprobs: list | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class Request:
    """Per-request state. `token_ids` is the committed log: prompt followed by output.

    `num_target_cached` is the length the target holds (its report after each step);
    `num_draft_cached` the length the draft holds, None when unknown (the draft failed or
    lost it), which makes the scheduler release it on the draft and re-ingest from 0.
    """

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: frozenset[int] = frozenset(),
        ignore_eos: bool = False,
        k_cap: int | None = None,
        client_request_id: str | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("empty prompt")
        self.request_id = request_id  # unique in the engine and on both services
        self.client_request_id = client_request_id or request_id  # as the client sent it
        self.sample_of: str | None = None  # n > 1: the first sample's request_id
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.sampling = sampling
        self.sampling_message: object | None = None  # common_pb2.SamplingParams, set on arrival
        # With sampling.prompt_logprobs: the prompt's (common_pb2.TokenLogprobs) from
        # position 1, as its prefill chunks return them.
        self.prompt_logprobs: list = []
        self.max_tokens = max_tokens
        self.stop_token_ids = stop_token_ids
        self.ignore_eos = ignore_eos
        self.k_cap = k_cap
        self.num_target_cached = 0
        self.num_draft_cached: int | None = 0
        # The target's features of the committed positions, for a draft that reads them.
        self.features: FeatureLog | None = None
        # The draft's proposals for the next step, one per outcome of the verify it prepared.
        self.ahead: list[AheadProposal] = []
        self.accepted_all = False  # the last verify accepted every proposal (K > 0)
        self.gate = GateRecord()  # what SpeculationGate measured of it
        self.stats = SpecStats()
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.span_context: object | None = None  # the request span, linked from step spans
        self.arrival_time = 0.0
        self.first_token_time: float | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        """Committed length."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prefill_end(self) -> int:
        """Tokens the target must hold before the request decodes: its prompt, or, resumed
        after a preemption, every committed token but the last (the next verify feeds it)."""
        return self.num_prompt_tokens if self.num_output_tokens == 0 else self.num_tokens - 1

    @property
    def is_prefilling(self) -> bool:
        return self.num_target_cached < self.prefill_end

    def preempt(self) -> None:
        """Back to waiting with nothing held: both services release it, and it resumes by
        prefilling its committed log (recompute), so its output does not change."""
        self.status = RequestStatus.WAITING
        self.num_target_cached = 0
        self.num_draft_cached = None  # released, then re-ingested from 0
        self.ahead = []
        self.accepted_all = False
        self.stats.num_preemptions += 1

    @property
    def is_done(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)

    def commit(
        self, token_ids: list[int], eos_token_ids: frozenset[int], max_model_len: int
    ) -> list[int]:
        """Appends verified tokens up to the first stop and returns those appended.

        A stop token (eos unless ignore_eos, or a stop_token_id) is committed and ends the
        request with "stop"; reaching max_tokens or max_model_len ends it with "length".
        Tokens after the stop are dropped. Sets `finish_reason` when the request ends.
        """
        committed: list[int] = []
        for token in token_ids:
            self.token_ids.append(token)
            committed.append(token)
            if token in self.stop_token_ids or (not self.ignore_eos and token in eos_token_ids):
                self.finish_reason = "stop"
            elif self.num_output_tokens >= self.max_tokens or self.num_tokens >= max_model_len:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                break
        return committed

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, committed={self.num_tokens}, "
            f"target={self.num_target_cached}, draft={self.num_draft_cached})"
        )
