"""The most speculation can give on this machine: spec / target-only with a free draft and
nothing in a step but the target's verify forward.

    specdec bench --json --no-hf [flags] > bench.json
    python bench/ceiling.py --bench-json bench.json [--target-model PATH] [--json]

A speculative step at batch B and K verifies B × (K + 1) tokens in one target forward and
commits B × E(K) of them, E(K) = 1 + a_1 + ... + a_K with a_i the acceptance at draft
position i that the bench measured (at batch 1: greedy acceptance does not depend on the
batch). Target-only serving commits B tokens a forward (its multi-step C loop,
``ModelRunner.decode_greedy``). Both forwards are timed here, in one process, the target
loaded as its service loads it (float32, ``auto`` KV cache, one thread by default), each
sequence holding ``--context`` tokens (default 150: the tiny pair's bench prompts average 85
tokens, and its streams are 64 tokens into their 128 halfway). Per batch size and K, two ceilings:

- ``forward``: E(K) × t_target_only / t_verify, spec over target-only with neither paying
  anything but its forwards;
- ``bench``: B × E(K) / t_verify over the bench's target-only decode-phase tokens/s. The
  bench's spec / target-only cannot exceed it, in the decode phase or over the whole run
  (both prefill the same prompts on the same target first).

``slack_ms`` is the time a step could spend on top of its verify (the draft's forwards on
the critical path, both RPCs, the coordinator) and still reach the batch size's bar in
``--bars`` against the bench's target-only figure; negative where even a free draft and no
overhead fall short.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.config import TINY_TARGET
from specdec.kernels import dense_ops
from specdec.runtime import ModelRunner, SequenceChunk

TARGET_ONLY_STEPS = 8  # forwards a target-only Verify runs (specdec's --num-scheduler-steps)


def expected_tokens(acceptance: list[float], k: int) -> float:
    """Tokens a sequence commits per step at K: the target's own token plus the accepted
    proposals, 1 + a_1 + ... + a_K."""
    if k > len(acceptance):
        raise ValueError(f"acceptance is known for {len(acceptance)} positions, not K={k}")
    return 1.0 + sum(acceptance[:k])


def ceilings(
    batch: int,
    k: int,
    acceptance: list[float],
    verify_s: float,
    target_only_s: float,
    target_only_tok_s: float,
    bar: float | None,
) -> dict[str, float | None]:
    """One batch size and K: the two ceilings and the slack at ``bar`` (module docstring;
    None without a bar).
    ``verify_s``: one forward of batch × (K + 1) tokens; ``target_only_s``: one forward of
    ``batch`` tokens in target-only's loop; ``target_only_tok_s``: the bench's decode phase."""
    tokens = expected_tokens(acceptance, k)
    spec_tok_s = batch * tokens / verify_s
    slack = None if bar is None else batch * tokens / (bar * target_only_tok_s) - verify_s
    return {
        "expected_tokens": round(tokens, 3),
        "verify_ms": round(verify_s * 1e3, 4),
        "target_only_forward_ms": round(target_only_s * 1e3, 4),
        "forward_ceiling": round(tokens * target_only_s / verify_s, 3),
        "bench_ceiling": round(spec_tok_s / target_only_tok_s, 3),
        "slack_ms": None if slack is None else round(slack * 1e3, 3),
    }


def _median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_forwards(
    runner: ModelRunner, batch: int, ks: list[int], context: int, repeats: int
) -> tuple[float, dict[int, float]]:
    """(one target-only forward of ``batch`` tokens, {K: one verify forward}) in seconds,
    medians over ``repeats``, each sequence holding ``context`` tokens; the cache is left
    as it was after each."""
    seq_ids = [f"ceiling-{batch}-{b}" for b in range(batch)]
    for b, seq_id in enumerate(seq_ids):
        runner.open(seq_id)
        runner.extend(
            [SequenceChunk(seq_id, [(b + i) % runner.vocab_size for i in range(context)])]
        )

    def restore() -> None:
        for seq_id in seq_ids:
            runner.truncate(seq_id, context)

    def target_only() -> None:
        if runner.decode_greedy(seq_ids, [1] * batch, TARGET_ONLY_STEPS) is None:
            for _ in range(TARGET_ONLY_STEPS):
                runner.extend([SequenceChunk(s, [1], 1) for s in seq_ids])
        restore()

    def verify(k: int) -> None:
        runner.extend([SequenceChunk(s, [1] * (k + 1), k + 1) for s in seq_ids])
        restore()

    try:
        target_only()  # warm-up
        per_forward = _median_seconds(target_only, repeats) / TARGET_ONLY_STEPS
        return per_forward, {k: _median_seconds(lambda k=k: verify(k), repeats) for k in ks}
    finally:
        for seq_id in seq_ids:
            runner.release(seq_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-json", type=Path, required=True, help="specdec bench --json")
    parser.add_argument("--target-model", type=Path, default=TINY_TARGET)
    parser.add_argument("--threads", type=int, default=1, help="the target service's threads")
    parser.add_argument(
        "--bars", default="1=3.0,4=2.2", help="spec / target-only to reach, per batch size"
    )
    parser.add_argument("--context", type=int, default=150, help="tokens each sequence holds")
    parser.add_argument("--repeats", type=int, default=30, help="timed forwards; median kept")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dense_ops.set_num_threads(args.threads)

    bars = {b: float(x) for b, x in (pair.split("=") for pair in args.bars.split(",") if pair)}
    bench = json.loads(args.bench_json.read_text())["batch"]
    acceptance = max((row["acceptance_per_position"] for row in bench.values()), key=len)
    if not acceptance:
        parser.error(f"{args.bench_json} measured no drafts: run the bench with K > 0 at batch 1")
    ks = list(range(1, len(acceptance) + 1))
    runner = ModelRunner.from_pretrained(args.target_model)
    report = {}
    for batch, row in bench.items():
        base_s, verify_s = time_forwards(runner, int(batch), ks, args.context, args.repeats)
        rows = {
            k: ceilings(
                int(batch), k, acceptance, verify_s[k], base_s, row["target_only_decode_tok_s"],
                bars.get(batch),
            )
            for k in ks
        }  # fmt: skip
        best = max(ks, key=lambda k: rows[k]["bench_ceiling"])
        report[batch] = {"best_k": best, **rows[best], "by_k": rows}
    if args.json:
        print(json.dumps({"context": args.context, "acceptance": acceptance, "batch": report}))
        return
    print(
        f"target {args.target_model}, {args.threads} thread(s), context {args.context}; "
        f"acceptance per position {acceptance}; slack at the bars {bars}"
    )
    print(f"{'batch':>5} {'K':>3} {'E(K)':>6} {'verify ms':>10} {'t-o fwd ms':>11} "
          f"{'forward ceiling':>16} {'bench ceiling':>14} {'slack ms':>9}")  # fmt: skip
    for batch, best in report.items():
        for k, r in best["by_k"].items():
            mark = " *" if k == best["best_k"] else ""
            print(
                f"{batch:>5} {k:>3} {r['expected_tokens']:>6.2f} {r['verify_ms']:>10.3f} "
                f"{r['target_only_forward_ms']:>11.3f} {r['forward_ceiling']:>15.2f}x "
                f"{r['bench_ceiling']:>13.2f}x {'' if r['slack_ms'] is None else r['slack_ms']:>9}"
                f"{mark}"
            )


if __name__ == "__main__":
    main()
