"""What the gateway worker streams back for one sample: its tokens cut at the first stop
string, and their logprobs (and the prompt's) in the gateway's messages."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg_grpc_proto.generated import vllm_engine_pb2
from tokenizers import Tokenizer

from specdec.coordinator.api.detokenizer import IncrementalDetokenizer
from specdec.coordinator.engine.errors import InvalidRequest


@dataclass
class SampleOutput:
    """One sample's tokens so far (and their logprobs when asked; else None)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    prompt_logprobs: list | None = None

    def extend(self, delta: SampleOutput) -> None:
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs


class InIndexOrder:
    """A non-streamed request's sample completes, let go in index order: the gateway numbers
    such a request's choices in the order their completes arrive, so a sample that ends
    before one of lower index waits for it (else the same seeded call could come back with
    its choices swapped)."""

    def __init__(self) -> None:
        self.waiting: dict[int, vllm_engine_pb2.GenerateResponse] = {}
        self.next_index = 0

    def release(
        self, index: int, complete: vllm_engine_pb2.GenerateResponse
    ) -> list[vllm_engine_pb2.GenerateResponse]:
        """``complete`` (sample ``index``'s) is ready; the completes now due, in order."""
        self.waiting[index] = complete
        due = []
        while self.next_index in self.waiting:
            due.append(self.waiting.pop(self.next_index))
            self.next_index += 1
        return due


class StopStrings:
    """Finds the first stop string in a growing output. ``update`` takes the new token ids
    and returns how many of them to keep: all when no stop string is complete, else up to
    and including the token that completes the earliest match. None matches before the
    ``min_tokens``-th token."""

    def __init__(self, stops: list[str], tokenizer: Tokenizer | None, min_tokens: int = 0) -> None:
        if stops and tokenizer is None:
            raise InvalidRequest("stop strings need the coordinator's --tokenizer")
        if any(not s for s in stops):
            raise InvalidRequest("stop strings must not be empty")
        self.stops = stops
        self.matched: str | None = None
        self.min_tokens = min_tokens
        self._count = 0  # tokens seen
        self._detokenizer = IncrementalDetokenizer(tokenizer) if stops else None
        self._text = ""

    def update(self, token_ids: list[int]) -> int:
        if self._detokenizer is None:
            return len(token_ids)
        for i, token in enumerate(token_ids):
            before = len(self._text)
            self._text += self._detokenizer.update([token])
            self._count += 1
            if self._count < self.min_tokens:
                continue  # as vLLM: no stop before min_tokens
            # Matches that end in the new text (earlier ones were looked for before).
            hits = [
                (at, s)
                for s in self.stops
                if (at := self._text.find(s, max(0, before - len(s) + 1))) >= 0
            ]
            if hits:
                self.matched = min(hits)[1]
                return i + 1
        return len(token_ids)


def output_logprobs(
    token_ids: list[int], logprobs: list | None
) -> vllm_engine_pb2.OutputLogProbs | None:
    """The gateway's message for ``token_ids`` and their ``common_pb2.TokenLogprobs``."""
    if logprobs is None:
        return None
    return vllm_engine_pb2.OutputLogProbs(
        token_logprobs=[t.logprob for t in logprobs],
        token_ids=token_ids,
        top_logprobs=[
            vllm_engine_pb2.TopLogProbs(values=t.top_logprobs, token_ids=t.top_token_ids)
            for t in logprobs
        ],
    )


def input_logprobs(
    prompt_ids: list[int], logprobs: list | None
) -> vllm_engine_pb2.InputLogProbs | None:
    """The gateway's message for the prompt: the first token has no logprob."""
    if logprobs is None:
        return None
    none = vllm_engine_pb2.InputTokenLogProb()
    return vllm_engine_pb2.InputLogProbs(
        token_logprobs=[none]
        + [vllm_engine_pb2.InputTokenLogProb(value=t.logprob) for t in logprobs],
        token_ids=prompt_ids,
        top_logprobs=[vllm_engine_pb2.TopLogProbs()]
        + [
            vllm_engine_pb2.TopLogProbs(values=t.top_logprobs, token_ids=t.top_token_ids)
            for t in logprobs
        ],
    )
