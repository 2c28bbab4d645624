"""The checks every public API makes before a request enters the engine.

Every value is checked here, ranges included, so nothing a client sends can fail inside a
step, where it would take the requests batched beside it down too."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import replace

from specdec.coordinator.engine.core import ModelLimits
from specdec.coordinator.engine.errors import InvalidRequest
from specdec.coordinator.engine.request import Request, SamplingParams
from specdec.runtime.sampling_limits import MAX_LOGPROBS, MIN_SAMPLING_TEMPERATURE
from specdec.runtime.structured_output import GrammarError, grammar_of
from specdec.v1 import common_pb2

MAX_SEED = 2**64 - 1  # the services' seed is a uint64 (common.proto)
MAX_REQUEST_ID_CHARS = 256


def checked_request(
    request_id: str,
    prompt_ids: list[int],
    limits: ModelLimits,
    *,
    sampling: SamplingParams,
    max_tokens: int | None,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    k_cap: int | None = None,
    scope: str = "",
) -> Request:
    """A `Request`, or InvalidRequest saying which value is wrong and what would fit.
    Within the engine the request is ``scope/request_id``, apart from other callers'.

    ``sampling`` as the client sent it: ``top_p`` 0 and ``repetition_penalty`` 0 mean
    unset; ``max_tokens`` None or 0 means the rest of the context."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"request_id has {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS}"
        )
    if not prompt_ids:
        raise InvalidRequest("empty prompt")
    too_big = next((t for t in prompt_ids if not 0 <= t < limits.vocab_size), None)
    if too_big is not None:
        raise InvalidRequest(f"token id {too_big} is out of range (vocab size {limits.vocab_size})")
    stop_token_ids = frozenset(stop_token_ids)
    outside = sorted(t for t in stop_token_ids if not 0 <= t < limits.vocab_size)
    if outside:
        raise InvalidRequest(
            f"stop_token_ids {outside} are out of range (vocab size {limits.vocab_size})"
        )
    if max_tokens is not None and max_tokens < 0:
        raise InvalidRequest(f"max_tokens must be >= 0 (0 = unset), got {max_tokens}")
    if k_cap is not None and k_cap < 0:
        raise InvalidRequest(f"num_speculative_tokens must be >= 0, got {k_cap}")
    sampling = checked_sampling(sampling, limits.vocab_size)
    if sampling.structured_output is not None and ignore_eos:
        raise InvalidRequest(
            "ignore_eos cannot be combined with structured output: the output ends where "
            "the constraint does"
        )
    if max_tokens and sampling.min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({sampling.min_tokens}) must be at most max_tokens ({max_tokens})"
        )
    num_prompt = len(prompt_ids)
    room = limits.max_model_len - num_prompt
    if room < 1:
        raise InvalidRequest(
            f"prompt has {num_prompt} tokens; max_model_len is {limits.max_model_len}"
        )
    max_tokens = max_tokens or room
    if max_tokens > room:
        raise InvalidRequest(
            f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
            f"({limits.max_model_len}); lower max_tokens to at most {room}"
        )
    return Request(
        request_id=f"{scope}/{request_id}" if scope else request_id,
        client_request_id=request_id,
        prompt_ids=prompt_ids,
        sampling=sampling,
        max_tokens=max_tokens,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        k_cap=k_cap,
    )


def sampling_params(message, **fields) -> SamplingParams:
    """The sampling fields both public APIs' messages name alike (``specdec.v1``'s and
    vLLM's ``SamplingParams``), as the client sent them, and ``fields``."""
    return SamplingParams(
        top_p=message.top_p,
        top_k=message.top_k,
        seed=message.seed if message.HasField("seed") else None,
        min_p=message.min_p,
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        repetition_penalty=message.repetition_penalty,
        logit_bias=tuple(message.logit_bias.items()),
        min_tokens=message.min_tokens,
        **fields,
    )


async def compile_constraint(structured: common_pb2.StructuredOutput) -> None:
    """Compiles a request's constraint on a worker thread (llguidance can take a second on
    a large grammar, which the event loop must not wait for), so that ``checked_sampling``
    finds it compiled; InvalidRequest naming the problem when it does not compile."""
    try:
        await asyncio.to_thread(grammar_of, structured)
    except GrammarError as e:
        raise InvalidRequest(str(e)) from None


def checked_sampling(s: SamplingParams, vocab_size: int) -> SamplingParams:
    """``s`` with its unset values normalised, or InvalidRequest naming the value that is
    out of range (OpenAI's ranges for the penalties and logit_bias, vLLM's for the rest)."""
    if s.seed is not None and not 0 <= s.seed <= MAX_SEED:
        raise InvalidRequest(f"seed must be an integer in [0, 2^64 - 1], got {s.seed}")
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidRequest(
            f"temperature must be a finite number >= 0 (0 = greedy), got {s.temperature}"
        )
    top_p = s.top_p if s.top_p != 0 else 1.0
    if math.isnan(top_p) or not 0 < top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}")
    if s.top_k < 0:
        raise InvalidRequest(f"top_k must be >= 0 (0 = off), got {s.top_k}")
    if math.isnan(s.min_p) or not 0 <= s.min_p <= 1:
        raise InvalidRequest(f"min_p must be in [0, 1], got {s.min_p}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(s, name)
        if math.isnan(value) or not -2 <= value <= 2:
            raise InvalidRequest(f"{name} must be in [-2, 2], got {value}")
    repetition = s.repetition_penalty or 1.0
    if not (math.isfinite(repetition) and repetition > 0):
        raise InvalidRequest(f"repetition_penalty must be a finite number > 0, got {repetition}")
    for token, bias in s.logit_bias:
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"logit_bias names token id {token}, out of range (vocab size {vocab_size})"
            )
        if math.isnan(bias) or not -100 <= bias <= 100:
            raise InvalidRequest(f"logit_bias for token {token} must be in [-100, 100], got {bias}")
    if s.min_tokens < 0:
        raise InvalidRequest(f"min_tokens must be >= 0, got {s.min_tokens}")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(s, name)
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise InvalidRequest(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
    structured = s.structured_output
    if structured is not None and structured.WhichOneof("kind") is None:
        structured = None
    try:
        grammar_of(structured or common_pb2.StructuredOutput())
    except GrammarError as e:
        raise InvalidRequest(str(e)) from None
    return replace(
        s,
        structured_output=structured,
        # As in vLLM, temperatures too small to divide logits by safely are greedy.
        temperature=s.temperature if s.temperature >= MIN_SAMPLING_TEMPERATURE else 0.0,
        top_p=top_p,
        repetition_penalty=repetition,
        logit_bias=tuple(sorted(s.logit_bias)),
    )
