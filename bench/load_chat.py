"""Multi-turn chat load for bench/load.py (KV capacity, preemption, prefix caching), and the
measuring pieces both of its modes share.

Every user holds one conversation: the shared system prompt (~300 tokens), then `turns`
user messages (hand-written everyday requests, bench/prompts/general_chat.json), each
answer (`max_tokens`, greedy, EOS ignored so lengths are known) appended as the
assistant's turn, so the last turn's context is ~600 tokens on the real pair. A target
without a chat template (the tiny pair) gets the same conversation as plain text.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields, replace

import grpc
import numpy as np

from specdec.bench import chat_prompts
from specdec.client import Completion, CoordinatorClient, GenerateParams, Prompt, run_together
from specdec.config import GENERAL_CHAT, StackConfig, model_folder
from specdec.coordinator.api.chat import ChatTemplate
from specdec.launcher import Stack
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

# The same for every user, so its KV is what a prefix cache shares between them.
SYSTEM_PROMPT = (
    "You are Sam, the assistant of a small online help desk that answers everyday questions "
    "for people at home and at work. Be friendly, plain and brief: answer the question that "
    "was asked, in short paragraphs or a short list, and stop. Use simple words and explain "
    "any technical term the first time you use it. When a request is unclear, say what you "
    "assumed and answer that; ask a question back only when no sensible answer is possible. "
    "When you write something for the user to send, such as an email, a note or a message, "
    "match the tone they asked for, keep it short, and leave placeholders in square brackets "
    "for names, dates and details you do not know. When you explain how to do something, give "
    "the steps in order, one action per step, and mention what the user needs before they "
    "start. For arithmetic and reasoning, show the working in a few lines and then give the "
    "answer on its own line. For code, give one complete, runnable example with a sentence on "
    "what it does; prefer the standard library, and name the language and version if it "
    "matters. For questions about health, money, law or safety, give general information, say "
    "clearly that it is not professional advice, and suggest who to ask. Never invent facts, "
    "quotes, prices, opening hours or references; if you do not know, say so and suggest where "
    "to look. Keep every answer under two hundred words unless the user asks for more."
)
SINGLE_TURN_LEVELS = (1, 4)  # concurrent clients
SINGLE_TURN_REQUESTS = 20  # per level


@dataclass(frozen=True)
class ChatLoad:
    users: int = field(default=32, metadata={"help": "concurrent conversations"})
    turns: int = field(default=4, metadata={"help": "user messages in each"})
    max_tokens: int = field(default=64, metadata={"help": "tokens per answer (greedy)"})


def add_chat_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--multi-turn", action="store_true", help="multi-turn chats instead of the load+burst"
    )
    parser.add_argument(
        "--compare-caching",
        action="store_true",
        help="the multi-turn load on two fresh stacks, prefix caching on and off",
    )
    parser.add_argument(
        "--single-turn-ttft",
        action="store_true",
        help=f"TTFT of one-turn chats at {' and '.join(map(str, SINGLE_TURN_LEVELS))} clients",
    )
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="--single-turn-ttft with every answer --max-tokens long, so the clients' "
        "requests arrive together (the worst case) instead of answer lengths of 0.5-1.5x",
    )
    for f in fields(ChatLoad):
        text = f"{f.metadata['help']} (default %(default)s)"
        parser.add_argument("--" + f.name.replace("_", "-"), type=int, default=f.default, help=text)


class Recorder:
    """What client threads' streams delivered: errors by status code, times to the first
    token, gaps between tokens, counts. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: Counter[str] = Counter()
        self.ttft: list[float] = []
        self.gaps: list[float] = []
        self.num_requests = 0
        self.num_tokens = 0

    def one_request(
        self, client: CoordinatorClient, prompt: Prompt, params: GenerateParams
    ) -> Completion | None:
        """Streams one request and records it: its completion, or None when it failed."""
        out, gaps = Completion(), []
        start = last = time.perf_counter()
        try:
            for response in client.stream(prompt, params, timeout=300):
                now = time.perf_counter()
                if response.token_ids:
                    if not out.token_ids:
                        out.first_token_seconds = now - start
                    else:
                        gaps.append((now - last) / len(response.token_ids))
                    last = now
                    out.token_ids.extend(response.token_ids)
                out.text += response.text
                out.num_prompt_tokens = response.num_prompt_tokens
        except grpc.RpcError as e:
            with self.lock:
                self.errors[e.code().name] += 1
            return None
        out.seconds = time.perf_counter() - start
        with self.lock:
            self.num_requests += 1
            self.num_tokens += len(out.token_ids)
            self.ttft.append(out.first_token_seconds)
            self.gaps += gaps
        return out


def percentile_ms(seconds: list[float], q: float) -> float | None:
    return round(float(np.percentile(seconds, q)) * 1000, 1) if seconds else None


def model_infos(stack: Stack) -> dict[str, common_pb2.ModelInfo]:
    """`GetInfo` of each model service (the first replica's target, and the draft)."""
    services = [("target", stack.target_address, target_pb2_grpc.TargetServiceStub)]
    if stack.draft_address:
        services.append(("draft", stack.draft_address, draft_pb2_grpc.DraftServiceStub))
    infos = {}
    for name, address, stub_cls in services:
        with grpc.insecure_channel(address) as channel:
            infos[name] = stub_cls(channel).GetInfo(
                common_pb2.InfoRequest(), timeout=10, metadata=stack.internal_metadata
            )
    return infos


def cache_counters(stack: Stack) -> dict:
    """Since the stack started: the coordinator's preemptions and prompt tokens taken from
    the target's prefix cache, and each service's prefix-cache lookups and hits (tokens).
    0 where this checkout's services do not report them yet."""
    with CoordinatorClient(stack.address) as client:
        totals = client.totals()
    return {
        "num_preemptions": getattr(totals, "num_preemptions", 0),
        "num_cached_tokens": getattr(totals, "num_cached_tokens", 0),
        "services": {
            name: {
                "enabled": getattr(info, "prefix_caching", None),
                "queries": getattr(info, "prefix_cache_queries", 0),
                "hits": getattr(info, "prefix_cache_hits", 0),
            }
            for name, info in model_infos(stack).items()
        },
    }


def cache_report(before: dict, after: dict) -> dict:
    """What the counters of `cache_counters` say happened between `before` and `after`."""
    report: dict = {k: after[k] - before[k] for k in ("num_preemptions", "num_cached_tokens")}
    report["prefix_cache"] = {}
    for name, now in after["services"].items():
        queries = now["queries"] - before["services"][name]["queries"]
        hits = now["hits"] - before["services"][name]["hits"]
        report["prefix_cache"][name] = {
            "enabled": now["enabled"],
            "queries": queries,
            "hits": hits,
            "hit_rate": round(hits / queries, 3) if queries else None,
        }
    return report


def has_chat_template(config: StackConfig) -> bool:
    folder = config.tokenizer or str(model_folder(config.target_model))
    return ChatTemplate.from_pretrained(folder) is not None


def as_prompt(history: list[dict[str, str]], chat: bool) -> Prompt:
    """The conversation as a request's prompt: chat messages, or for a target without a
    chat template plain "Role: content" paragraphs ending where the answer starts."""
    if chat:
        return list(history)
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in history]
    return "\n\n".join([*turns, "Assistant:"])


def user_messages(users: int, turns: int) -> list[list[str]]:
    """Each user's messages: a sample of general_chat.json's prompts keyed by the user, so
    conversations differ but a run repeats."""
    pool = [chat[0]["content"] for chat in chat_prompts(str(GENERAL_CHAT))]
    return [random.Random(user).sample(pool, min(turns, len(pool))) for user in range(users)]


def warm_up(stack: Stack, chat: bool) -> None:
    """One short request no measured one shares a prefix with beyond the template's start."""
    with CoordinatorClient(stack.address) as client:
        client.generate(
            as_prompt([{"role": "user", "content": "Hello!"}], chat),
            GenerateParams(max_tokens=4, ignore_eos=True),
            timeout=300,
        )


def run_multi_turn(stack: Stack, load: ChatLoad) -> dict:
    chat = has_chat_template(stack.config)
    messages = user_messages(load.users, load.turns)
    params = GenerateParams(max_tokens=load.max_tokens, ignore_eos=True)
    recorder = Recorder()
    # Per user, per turn answered: (TTFT seconds, prompt tokens). A failed turn ends the
    # conversation, since there is no answer to build the next turn on.
    answered: list[list[tuple[float, int]]] = [[] for _ in range(load.users)]

    def user(i: int, barrier: threading.Barrier) -> None:
        history = [{"role": "system", "content": SYSTEM_PROMPT}]
        with CoordinatorClient(stack.address) as client:
            barrier.wait()
            for text in messages[i]:
                history.append({"role": "user", "content": text})
                out = recorder.one_request(client, as_prompt(history, chat), params)
                if out is None:
                    return
                answered[i].append((out.first_token_seconds, out.num_prompt_tokens))
                history.append({"role": "assistant", "content": out.text})

    warm_up(stack, chat)
    before = cache_counters(stack)
    seconds = run_together(user, load.users)
    after = cache_counters(stack)
    by_turn = [[u[t] for u in answered if len(u) > t] for t in range(load.turns)]
    last_prompts = [n for _, n in by_turn[-1]] if by_turn else []
    return {
        "users": load.users,
        "turns": load.turns,
        "max_tokens": load.max_tokens,
        "chat_template": chat,
        "prefix_caching": getattr(stack.config, "enable_prefix_caching", None),
        "seconds": round(seconds, 1),
        "num_requests": recorder.num_requests,
        "errors_by_code": dict(recorder.errors),
        "ttft_ms_p50": percentile_ms(recorder.ttft, 50),
        "ttft_ms_p99": percentile_ms(recorder.ttft, 99),
        "ttft_ms_p50_by_turn": [percentile_ms([s for s, _ in t], 50) for t in by_turn],
        "output_tok_s": round(recorder.num_tokens / seconds, 1),
        "last_turn_prompt_tokens_mean": round(float(np.mean(last_prompts))) if last_prompts else 0,
        "last_turn_prompt_tokens_max": max(last_prompts, default=0),
        **cache_report(before, after),
    }


def compare_caching(config: StackConfig, load: ChatLoad, echo: bool) -> dict:
    """The multi-turn load on two fresh stacks, prefix caching on then off."""
    if "enable_prefix_caching" not in {f.name for f in fields(StackConfig)}:
        raise SystemExit(
            "--compare-caching needs StackConfig.enable_prefix_caching (coordinator/launcher.py"
            "), which this checkout does not have yet"
        )
    runs = {}
    for name, on in (("caching_on", True), ("caching_off", False)):
        with Stack(replace(config, enable_prefix_caching=on), echo=echo) as stack:
            runs[name] = run_multi_turn(stack, load)
    on, off = runs["caching_on"]["ttft_ms_p50"], runs["caching_off"]["ttft_ms_p50"]
    return {**runs, "ttft_p50_ratio_on_off": round(on / off, 3) if on and off else None}


def one_turn_at_a_time(
    stack: Stack, requests: list[tuple[Prompt, GenerateParams]], clients: int
) -> Recorder:
    """`requests` dealt to `clients` clients, each sending its next when its last finished."""
    recorder = Recorder()

    def client_loop(i: int, barrier: threading.Barrier) -> None:
        with CoordinatorClient(stack.address) as client:
            barrier.wait()
            for prompt, params in requests[i::clients]:
                recorder.one_request(client, prompt, params)

    run_together(client_loop, clients)
    return recorder


def answer_lengths(max_tokens: int, n: int, varied: bool) -> list[int]:
    """Each request's answer length: ``max_tokens``, or with ``varied`` spread evenly over
    0.5-1.5x it (in a fixed shuffled order), as benchmark clients draw output lengths, so
    that concurrent clients do not finish, and send their next request, in lockstep."""
    if not varied:
        return [max_tokens] * n
    return [max(1, round(max_tokens * (0.5 + (i * 37 % n) / n))) for i in range(n)]


def single_turn_ttft(stack: Stack, max_tokens: int, varied: bool = True) -> dict:
    """TTFT of one-turn chats at each level of concurrent clients; each level gets prompts
    of its own (all categories), so none finds another level's prompt in the prefix cache.
    ``varied``: answer lengths vary (``answer_lengths``); else every answer is
    ``max_tokens`` long and the clients' requests arrive together (the worst case: their
    prompts are prefilled in one step)."""
    chat = has_chat_template(stack.config)
    pool = [as_prompt(c, chat) for c in chat_prompts(str(GENERAL_CHAT))]
    lengths = answer_lengths(max_tokens, SINGLE_TURN_REQUESTS, varied)
    warm_up(stack, chat)
    report: dict = {
        "requests_per_level": SINGLE_TURN_REQUESTS,
        "max_tokens": max_tokens,
        "answer_lengths": "varied 0.5-1.5x" if varied else "all max_tokens (lockstep)",
    }
    for level, clients in enumerate(SINGLE_TURN_LEVELS):
        first = level * SINGLE_TURN_REQUESTS
        requests = [
            (pool[(first + i) % len(pool)], GenerateParams(max_tokens=n, ignore_eos=True))
            for i, n in enumerate(lengths)
        ]
        recorder = one_turn_at_a_time(stack, requests, clients)
        report[f"ttft_ms_p50_{clients}_clients"] = percentile_ms(recorder.ttft, 50)
        report[f"errors_by_code_{clients}_clients"] = dict(recorder.errors)
    low = report[f"ttft_ms_p50_{SINGLE_TURN_LEVELS[0]}_clients"]
    high = report[f"ttft_ms_p50_{SINGLE_TURN_LEVELS[-1]}_clients"]
    report["ttft_p50_ratio"] = round(high / low, 3) if low and high else None
    return report


def multi_turn_lines(r: dict) -> list[str]:
    on_off = {True: "on", False: "off", None: "?"}
    caches = [
        f"{name} {c['hits']}/{c['queries']} tokens"
        + (f" ({c['hit_rate']:.1%})" if c["hit_rate"] is not None else "")
        + f", {on_off[c['enabled']]}"
        for name, c in r["prefix_cache"].items()
    ]
    return [
        f"multi-turn: {r['users']} users x {r['turns']} turns, {r['max_tokens']}-token answers,"
        f" {'chat messages' if r['chat_template'] else 'plain text'},"
        f" prefix caching {on_off[r['prefix_caching']]}, {r['seconds']} s",
        f"  requests: {r['num_requests']} ok; errors: {r['errors_by_code'] or 'none'}",
        f"  TTFT ms: p50 {r['ttft_ms_p50']}, p99 {r['ttft_ms_p99']};"
        f" p50 by turn {r['ttft_ms_p50_by_turn']}",
        f"  output tokens/s: {r['output_tok_s']}",
        f"  last turn's prompt tokens: mean {r['last_turn_prompt_tokens_mean']},"
        f" max {r['last_turn_prompt_tokens_max']}",
        f"  preemptions: {r['num_preemptions']}",
        f"  prefix cache hits (service's word on/off): {'; '.join(caches)};"
        f" prompt tokens from the cache (coordinator): {r['num_cached_tokens']}",
    ]


def readable_lines(mode: str, r: dict) -> list[str]:
    """`mode`'s report (as `run_multi_turn`, `compare_caching` or `single_turn_ttft` made
    it) as lines for a person."""
    if mode == "multi_turn":
        return multi_turn_lines(r)
    if mode == "compare_caching":
        return [
            "prefix caching on:",
            *multi_turn_lines(r["caching_on"]),
            "prefix caching off:",
            *multi_turn_lines(r["caching_off"]),
            f"TTFT p50 on/off: {r['ttft_p50_ratio_on_off']}",
        ]
    levels = SINGLE_TURN_LEVELS
    return [
        f"single-turn TTFT p50 ({r['requests_per_level']} requests per level,"
        f" {r['max_tokens']}-token answers):",
        *(
            f"  {c} client(s): {r[f'ttft_ms_p50_{c}_clients']} ms;"
            f" errors: {r[f'errors_by_code_{c}_clients'] or 'none'}"
            for c in levels
        ),
        f"  ratio {levels[-1]}/{levels[0]}: {r['ttft_p50_ratio']}",
    ]
