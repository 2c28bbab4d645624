"""A small synchronous client of `Coordinator.Generate`, used by the CLI and tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from specdec.auth import API_KEY_ENV
from specdec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

# Text, token ids, or chat messages ({"role": ..., "content": ...}, OpenAI's shape).
Prompt = str | list[int] | list[dict[str, str]]


@dataclass(frozen=True)
class GenerateParams:
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    num_speculative_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None  # top logprobs per token (0-20); None: no logprobs
    n: int = 1
    prompt_logprobs: int | None = None  # top logprobs per prompt token; None: none
    structured_output: common_pb2.StructuredOutput | None = None


@dataclass
class Completion:
    """What one Generate stream delivered."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    num_prompt_tokens: int = 0
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    first_token_seconds: float = 0.0  # time to the first token (prefill included)
    # With params.logprobs: per token, (its logprob, [(top token id, logprob), ...]).
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    # With params.prompt_logprobs: as logprobs, for the prompt's tokens from the second on.
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first per second after it: the decode phase alone, as
        llama.cpp's "eval time" counts it."""
        after = self.seconds - self.first_token_seconds
        return (len(self.token_ids) - 1) / after if len(self.token_ids) > 1 and after > 0 else 0.0

    def as_json(self) -> dict:
        return {
            "token_ids": self.token_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "num_prompt_tokens": self.num_prompt_tokens,
            "stats": self.stats,
        }


def generate_request(
    prompt: Prompt, params: GenerateParams, request_id: str = ""
) -> coordinator_pb2.GenerateRequest:
    message = coordinator_pb2.GenerateRequest(
        request_id=request_id,
        sampling=common_pb2.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty,
            logit_bias=dict(params.logit_bias),
            min_tokens=params.min_tokens,
        ),
        max_tokens=params.max_tokens,
        stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos,
        n=params.n,
    )
    if isinstance(prompt, str):
        message.text = prompt
    elif prompt and isinstance(prompt[0], dict):
        chat = [coordinator_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in prompt]
        message.messages.messages.extend(chat)
    else:
        message.token_ids.ids.extend(prompt)
    if params.seed is not None:
        message.sampling.seed = params.seed
    if params.logprobs is not None:
        message.sampling.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        message.sampling.prompt_logprobs = params.prompt_logprobs
    if params.structured_output is not None:
        message.sampling.structured_output.CopyFrom(params.structured_output)
    if params.num_speculative_tokens is not None:
        message.num_speculative_tokens = params.num_speculative_tokens
    return message


def _logprobs(messages) -> list[tuple[float, list[tuple[int, float]]]]:
    return [(t.logprob, list(zip(t.top_token_ids, t.top_logprobs, strict=True))) for t in messages]


def stats_dict(stats: coordinator_pb2.SpecDecodeStats) -> dict:
    """Every field of ``stats`` (repeated ones as lists), the totals' ``step_seconds`` aside."""
    out = {f.name: getattr(stats, f.name) for f in stats.DESCRIPTOR.fields}
    out["accepted_per_position"] = list(out["accepted_per_position"])
    del out["step_seconds"]
    return out


class CoordinatorClient:
    """``api_key`` None: the ``SPECDEC_API_KEY`` environment variable, if set. ``tls_ca``:
    a PEM CA file to verify a coordinator that serves TLS."""

    def __init__(self, address: str, api_key: str | None = None, tls_ca: str = "") -> None:
        if tls_ca:
            with open(tls_ca, "rb") as f:
                credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
            self.channel = grpc.secure_channel(address, credentials)
        else:
            self.channel = grpc.insecure_channel(address)
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
        self.metadata = (("authorization", f"Bearer {key}"),) if key else ()

    def stream(
        self, prompt: Prompt, params: GenerateParams, timeout: float | None = None
    ) -> Iterator[coordinator_pb2.GenerateResponse]:
        message = generate_request(prompt, params)
        return self.stub.Generate(message, timeout=timeout, metadata=self.metadata)

    def generate(
        self,
        prompt: Prompt,
        params: GenerateParams,
        on_text: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> Completion:
        """Runs one request to the end (its first sample when n > 1); `on_text` sees each
        text delta as it arrives."""
        return self.generate_samples(prompt, params, on_text, timeout)[0]

    def generate_samples(
        self,
        prompt: Prompt,
        params: GenerateParams,
        on_text: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> list[Completion]:
        """Runs one request to the end: its ``params.n`` samples, by index."""
        outs = [Completion() for _ in range(max(params.n, 1))]
        start = time.perf_counter()
        for response in self.stream(prompt, params, timeout):
            out = outs[response.index]
            if response.token_ids and not out.token_ids:
                out.first_token_seconds = time.perf_counter() - start
            out.token_ids.extend(response.token_ids)
            out.text += response.text
            out.num_prompt_tokens = response.num_prompt_tokens
            out.logprobs += _logprobs(response.logprobs)
            out.prompt_logprobs += _logprobs(response.prompt_logprobs)
            if on_text is not None and response.text:
                on_text(response.text)
            if response.finish_reason:
                out.finish_reason = response.finish_reason
                out.stats = stats_dict(response.stats)
                out.seconds = time.perf_counter() - start
        return outs

    def totals(self) -> coordinator_pb2.SpecDecodeStats:
        return self.stub.GetStats(
            coordinator_pb2.StatsRequest(), timeout=10, metadata=self.metadata
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_together(worker: Callable[[int, threading.Barrier], None], n: int) -> float:
    """Runs ``worker(i, barrier)`` for i in 0..n-1 on n threads; each calls
    ``barrier.wait()`` once it is ready to send, and the clock runs from the moment all are
    ready until the last finishes. Returns those seconds."""
    barrier = threading.Barrier(n + 1)
    threads = [threading.Thread(target=worker, args=(i, barrier)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def generate_concurrently(
    address: str, prompts: list, params: GenerateParams | list[GenerateParams]
) -> tuple[float, list[Completion]]:
    """One stream per prompt, all at once; returns (generated tokens/s, completions).

    `params` is shared or one per prompt. Raises the first failed request's grpc.RpcError.
    """
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    outs: list[Completion | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def worker(i: int, barrier: threading.Barrier) -> None:
        with CoordinatorClient(address) as client:
            barrier.wait()
            try:
                outs[i] = client.generate(prompts[i], per_prompt[i])
            except grpc.RpcError as e:
                errors.append(e)

    seconds = run_together(worker, len(prompts))
    if errors:
        raise errors[0]
    return sum(len(o.token_ids) for o in outs) / seconds, outs
