"""`specdec bench`: speculative vs target-only serving through the running stack, and HF.

For each batch size B, B concurrent greedy requests (held-out prompts, `--new-tokens` new
tokens each, eos ignored) run twice: on the speculative coordinator and on a target-only
coordinator in front of the same target service. Throughput is generated tokens over the
wall time of the whole batch. `overhead_share_bs1` is the share of the batch-1
speculative step time spent outside model forward passes (both services' forward time,
less the draft's beside a verify (work ahead, ingest only), over the coordinator's step
time). Each figure is the best of two alternating runs. ``host_steal_share`` is the share
of the host's CPU time its hypervisor gave to other machines while the stack ran (Linux's
steal time; on a shared VM it can pass 0.3 and halve every figure for minutes). The
transformers baselines run in a separate process (`bench/hf_generate.py`) before the stack
starts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

import grpc

from specdec.bench_gateway import measure_gateway
from specdec.client import (
    Completion,
    CoordinatorClient,
    GenerateParams,
    Prompt,
    generate_concurrently,
)
from specdec.config import StackConfig
from specdec.coordinator.engine.config import SpeculativeConfig
from specdec.gateway import free_port
from specdec.launcher import Stack, held_out_prompts
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc

HF_SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "hf_generate.py"
PROC_STAT = Path("/proc/stat")
NUM_BS1_PROMPTS = 4
REPEATS = 2


def forward_seconds(stack: Stack) -> float:
    total = 0.0
    for address, stub_cls in (
        (stack.target_address, target_pb2_grpc.TargetServiceStub),
        (stack.draft_address, draft_pb2_grpc.DraftServiceStub),
    ):
        with grpc.insecure_channel(address) as channel:
            info = stub_cls(channel).GetInfo(
                common_pb2.InfoRequest(), timeout=10, metadata=stack.internal_metadata
            )
            total += info.forward_seconds - info.ahead_forward_seconds
    return total


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(stolen, all) CPU ticks of every core since boot (Linux's /proc/stat: user, nice,
    system, idle, iowait, irq, softirq, steal), None where there is no such file."""
    try:
        line = stat.read_text().split("\n", 1)[0]
    except OSError:
        return None
    ticks = [int(t) for t in line.split()[1:9]]
    return (ticks[7] if len(ticks) == 8 else 0), sum(ticks)


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the CPU ticks between two ``cpu_ticks()`` that were stolen."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round((end[0] - start[0]) / (end[1] - start[1]), 3)


def decode_rate(runs: list[tuple[float, list[Completion]]]) -> float:
    """The decode phase's tokens/s (each stream's tokens after its first, per second after
    it; prefill and time to first token left out, as llama.cpp's "eval time" leaves them):
    summed over a run's concurrent streams, averaged over the runs."""
    return sum(sum(o.decode_tok_s for o in outs) for _, outs in runs) / len(runs)


def acceptance_summary(outs: list[Completion]) -> dict:
    """Mean acceptance length, per-position acceptance and the share of drafts prompt
    lookup found, over the completions' stats."""
    drafts = sum(o.stats["num_drafts"] for o in outs)
    looked_up = sum(o.stats["num_lookup_drafts"] for o in outs)
    accepted = sum(o.stats["num_accepted_tokens"] for o in outs)
    # K can rise as a batch's requests finish, so positions come from the stats.
    per_position = [0] * max((len(o.stats["accepted_per_position"]) for o in outs), default=0)
    for o in outs:
        for i, count in enumerate(o.stats["accepted_per_position"]):
            per_position[i] += count
    return {
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else 1.0,
        "acceptance_per_position": [round(n / drafts, 3) for n in per_position] if drafts else [],
        "lookup_share": round(looked_up / drafts, 3) if drafts else 0.0,
    }


def chat_prompts(path: str) -> list[Prompt]:
    """The prompts of a JSON file (``{"prompts": [{"content": ..., "category": ...}]}``, as
    ``bench/prompts/general_chat.json``) as one-turn chats, categories taking turns, so
    the first few cover as many categories as they can."""
    by_category: dict[str, list[Prompt]] = {}
    for p in json.loads(Path(path).read_text())["prompts"]:
        chat = [{"role": "user", "content": p["content"]}]
        by_category.setdefault(p.get("category", ""), []).append(chat)
    rounds = zip_longest(*by_category.values())
    return [chat for round_ in rounds for chat in round_ if chat is not None]


def measure(
    stack: Stack,
    spec: SpeculativeConfig,
    batch_sizes: list[int],
    new_tokens: int,
    prompts: list[Prompt] | None = None,
    num_bs1_prompts: int = NUM_BS1_PROMPTS,
):
    """Per batch size: speculative and target-only rates (best of REPEATS alternating
    runs) and acceptance, on ``prompts`` (default: the pair's held-out prompts); batch 1
    runs the first ``num_bs1_prompts`` one at a time."""
    params = GenerateParams(max_tokens=new_tokens, ignore_eos=True)
    if prompts is None:
        count = max(max(batch_sizes), num_bs1_prompts)
        prompts = held_out_prompts(stack.config.target_model, count)
    warm = replace(params, max_tokens=8)
    for address in (stack.address, stack.baseline_address):
        generate_concurrently(address, prompts[:2], warm)
    report, overhead = {}, None
    for bs in batch_sizes:
        if bs == 1:
            rounds = [prompts[i : i + 1] for i in range(min(num_bs1_prompts, len(prompts)))]
        else:
            rounds = [prompts[:bs]]
        spec_rates, base_rates, spec_decode, base_decode, outs = [], [], [], [], []
        # Alternate the two stacks and keep each one's best run: this machine's speed
        # wanders between runs, and the best run is the least disturbed one.
        for _ in range(REPEATS):
            with CoordinatorClient(stack.address) as client:
                step_s, fwd_s = client.totals().step_seconds, forward_seconds(stack)
                spec_runs = [generate_concurrently(stack.address, r, params) for r in rounds]
                if bs == 1:
                    step_s = client.totals().step_seconds - step_s
                    overhead = 1 - (forward_seconds(stack) - fwd_s) / step_s
            base_runs = [generate_concurrently(stack.baseline_address, r, params) for r in rounds]
            spec_rates.append(sum(r for r, _ in spec_runs) / len(spec_runs))
            base_rates.append(sum(r for r, _ in base_runs) / len(base_runs))
            spec_decode.append(decode_rate(spec_runs))
            base_decode.append(decode_rate(base_runs))
            outs += [o for _, batch in spec_runs for o in batch]
        report[str(bs)] = {
            "k": spec.k_for_batch_size(bs),
            "target_only_tok_s": round(max(base_rates), 2),
            "spec_tok_s": round(max(spec_rates), 2),
            "target_only_decode_tok_s": round(max(base_decode), 2),
            "spec_decode_tok_s": round(max(spec_decode), 2),
            **acceptance_summary(outs),
        }
        row = report[str(bs)]
        print(
            f"bench: batch {bs} done ({len(report)}/{len(batch_sizes)}): "
            f"{row['spec_tok_s']:.1f} vs {row['target_only_tok_s']:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    return report, overhead


def hf_baselines(config: StackConfig, new_tokens: int) -> dict:
    if not HF_SCRIPT.is_file():
        raise RuntimeError(f"{HF_SCRIPT} is missing: run specdec bench from a source checkout")
    argv = [
        sys.executable, str(HF_SCRIPT), "--target", config.target_model,
        "--draft", config.draft_model, "--new-tokens", str(new_tokens),
        "--num-prompts", str(NUM_BS1_PROMPTS),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"transformers baseline failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_bench(config: StackConfig, args: argparse.Namespace) -> int:
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    hf = {} if args.no_hf else hf_baselines(config, args.new_tokens)
    config = replace(config, port=0, with_baseline=True)
    if args.gateway:
        config = replace(config, gateway_port=config.gateway_port or free_port())
    prompts = chat_prompts(args.prompts) if args.prompts else None
    with Stack(config, echo=args.verbose) as stack:
        spec = SpeculativeConfig.from_json(stack.config.speculative_config)
        ticks = cpu_ticks()
        batch, overhead = measure(
            stack, spec, batch_sizes, args.new_tokens, prompts, args.num_prompts
        )
        gateway = measure_gateway(stack, [1, 4], args.new_tokens) if args.gateway else None
        stolen = steal_share(ticks, cpu_ticks())
    result = {
        "batch": batch,
        **({"gateway": gateway} if gateway else {}),
        "hf_assisted_tok_s_bs1": hf.get("hf_assisted_tok_s_bs1"),
        "hf_target_only_tok_s_bs1": hf.get("hf_target_only_tok_s_bs1"),
        "overhead_share_bs1": None if overhead is None else round(overhead, 3),
        "host_steal_share": stolen,
    }
    if args.plot:
        from specdec.bench_plot import plot_bench

        plot_bench(batch, args.plot)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'batch':>5} {'K':>3} {'target-only tok/s':>18} {'spec tok/s':>11} {'speedup':>8} "
          f"{'mean acc. len':>13} {'decode phase: target-only / spec':>33}")  # fmt: skip
    for bs, row in batch.items():
        speedup = row["spec_tok_s"] / row["target_only_tok_s"]
        decode = f"{row['target_only_decode_tok_s']:.1f} / {row['spec_decode_tok_s']:.1f}"
        print(
            f"{bs:>5} {row['k']:>3} {row['target_only_tok_s']:>18.1f} {row['spec_tok_s']:>11.1f} "
            f"{speedup:>7.2f}x {row['mean_acceptance_length']:>13.2f} {decode:>33}"
        )
    for key in (
        "hf_target_only_tok_s_bs1",
        "hf_assisted_tok_s_bs1",
        "overhead_share_bs1",
        "host_steal_share",
    ):
        print(f"{key}: {result[key]}")
    for bs, row in (gateway or {}).items():
        print(
            f"through the gateway, batch {bs}: {row['gateway_tok_s']:.1f} tok/s, direct gRPC "
            f"{row['direct_grpc_tok_s']:.1f} ({row['gateway_over_direct']:.2f}x)"
        )
    return 0
