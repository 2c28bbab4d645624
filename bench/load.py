"""Load benchmark: many concurrent clients for a while, then a burst past the queue limit;
or multi-turn chats, for KV capacity, preemption and prefix caching.

    python bench/load.py [--clients 64] [--seconds 60] [--json] [--target-model ...]
    python bench/load.py --multi-turn [--users 32] [--turns 4] [--max-tokens 64] [--json]
    python bench/load.py --compare-caching [--users ...]
    python bench/load.py --single-turn-ttft [--max-tokens 64]

Starts the stack (`specdec up`'s defaults and flags: the tiny pair unless told otherwise)
with `--max-queue-len` (64 here), runs `--clients` client threads that each send greedy and sampled
requests back to back (held-out prompts, 16-64 new tokens) for `--seconds`, and reports:
errors by status code, requests and generated tokens per second, p50/p99 time to first
token and inter-token gap, each model service's free KV pages and resident memory before
and after (pages must be back to idle), and then a burst of `max_num_seqs + max_queue_len
+ 32` requests sent at once: the excess must be refused with RESOURCE_EXHAUSTED at once.
Prints one JSON object with `--json`.

`--multi-turn` (bench/load_chat.py) instead runs `--users` conversations at once through
the coordinator's chat messages: a shared ~300-token system prompt, then `--turns` user
messages from bench/prompts/general_chat.json, each greedy answer of `--max-tokens`
appended to the history (~600-token contexts by the last turn on the real pair). It
reports requests, errors by status code, TTFT p50/p99 (and p50 per turn), output tokens/s,
the last turn's prompt length, the coordinator's preemptions and prompt tokens taken from
the prefix cache, and each model service's prefix-cache hits per lookup (tokens), all
counted over the run. `--compare-caching` runs it on two fresh stacks, prefix caching on
and off (`--no-enable-prefix-caching`), and adds TTFT p50 on/off. `--single-turn-ttft`
reports TTFT p50 of one-turn chats at 1 and at 4 concurrent clients (20 requests each,
each client sending its next when its last finished) and their ratio (4 / 1). These
modes print readable lines, or one JSON object with `--json`.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import grpc
from load_chat import (
    ChatLoad,
    Recorder,
    add_chat_args,
    compare_caching,
    model_infos,
    percentile_ms,
    readable_lines,
    run_multi_turn,
    single_turn_ttft,
)

from specdec.cli import add_stack_args, stack_config
from specdec.client import CoordinatorClient, GenerateParams
from specdec.config import TINY_DRAFT, TINY_TARGET
from specdec.launcher import Stack, held_out_prompts


def service_state(stack: Stack) -> dict:
    """Free KV pages and resident memory (MiB) of each model service."""
    state = {}
    for name, info in model_infos(stack).items():
        process = next(p for p in stack.processes if p.name == name)
        state[name] = {"free_pages": info.num_free_pages, "rss_mib": rss_mib(process.proc.pid)}
    return state


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def run_load(stack: Stack, prompts: list, clients: int, seconds: float) -> dict:
    recorder = Recorder()
    stop_at = time.monotonic() + seconds

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        with CoordinatorClient(stack.address) as client:
            while time.monotonic() < stop_at:
                params = GenerateParams(max_tokens=rng.randint(16, 64), ignore_eos=True)
                if rng.random() < 0.5:
                    params = replace(params, temperature=0.8, top_k=40, seed=rng.randrange(2**31))
                recorder.one_request(client, rng.choice(prompts), params)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {
        "errors_by_code": dict(recorder.errors),
        "num_requests": recorder.num_requests,
        "requests_per_s": round(recorder.num_requests / elapsed, 2),
        "generated_tok_s": round(recorder.num_tokens / elapsed, 1),
        "ttft_ms_p50": percentile_ms(recorder.ttft, 50),
        "ttft_ms_p99": percentile_ms(recorder.ttft, 99),
        "itl_ms_p50": percentile_ms(recorder.gaps, 50),
        "itl_ms_p99": percentile_ms(recorder.gaps, 99),
    }


def run_burst(stack: Stack, prompt, size: int) -> dict:
    """`size` requests at once; how many were refused with RESOURCE_EXHAUSTED, how fast."""
    codes: Counter[str] = Counter()
    refusal_seconds: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(size)

    def one() -> None:
        with CoordinatorClient(stack.address) as client:
            barrier.wait()
            start = time.perf_counter()
            try:
                client.generate(prompt, GenerateParams(max_tokens=32, ignore_eos=True))
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                codes[code] += 1
                if code == "RESOURCE_EXHAUSTED":
                    refusal_seconds.append(time.perf_counter() - start)

    threads = [threading.Thread(target=one) for _ in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worst = round(max(refusal_seconds), 3) if refusal_seconds else None
    return {"sent": size, "by_code": dict(codes), "max_seconds_to_refusal": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_stack_args(parser)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    add_chat_args(parser)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(
        target_model=str(TINY_TARGET), draft_model=str(TINY_DRAFT), port=0, max_queue_len=64
    )
    args = parser.parse_args()
    config = stack_config(args)
    if args.multi_turn or args.compare_caching or args.single_turn_ttft:
        if args.single_turn_ttft and (args.multi_turn or args.compare_caching):
            parser.error("--single-turn-ttft runs alone (its own stack)")
        load = ChatLoad(users=args.users, turns=args.turns, max_tokens=args.max_tokens)
        if args.compare_caching:
            mode, result = "compare_caching", compare_caching(config, load, echo=args.verbose)
        else:
            with Stack(config, echo=args.verbose) as stack:
                if args.single_turn_ttft:
                    result = single_turn_ttft(stack, load.max_tokens, not args.lockstep)
                    mode = "single_turn_ttft"
                else:
                    mode, result = "multi_turn", run_multi_turn(stack, load)
        print(json.dumps(result) if args.json else "\n".join(readable_lines(mode, result)))
        return
    with Stack(config, echo=args.verbose) as stack:
        prompts = held_out_prompts(config.target_model, 16)
        before = service_state(stack)
        load = run_load(stack, prompts, args.clients, args.seconds)
        time.sleep(1.0)  # releases go out before the next step
        after = service_state(stack)
        burst = run_burst(stack, prompts[0], config.max_num_seqs + config.max_queue_len + 32)
    result = {
        "clients": args.clients,
        "seconds": args.seconds,
        **load,
        "services_before": before,
        "services_after": after,
        "pages_back_to_idle": all(
            after[s]["free_pages"] == before[s]["free_pages"] for s in before
        ),
        "burst": burst,
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
