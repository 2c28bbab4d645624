"""`specdec demo`: the stack on the default pair, streaming, with a measured speedup."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from specdec.client import Completion, CoordinatorClient, GenerateParams
from specdec.config import StackConfig, draft_speculation
from specdec.launcher import Stack, held_out_prompts


def _rate(outs: list[Completion]) -> float:
    return sum(len(o.token_ids) for o in outs) / sum(o.seconds for o in outs)


def run_demo(config: StackConfig, num_prompts: int, max_tokens: int, verbose: bool) -> int:
    config = draft_speculation(replace(config, port=0, with_baseline=True))
    print(f"specdec demo: target {config.target_model}, draft {config.draft_model}")
    print(
        f"  kv-cache-dtype {config.kv_cache_dtype}, speculative-config {config.speculative_config}"
        f", draft-p-min {config.draft_p_min:g}"
    )
    start = time.perf_counter()
    with Stack(config, echo=verbose) as stack:
        print(f"stack ready in {time.perf_counter() - start:.1f}s: coordinator {stack.address}")
        params = GenerateParams(max_tokens=max_tokens)
        prompts = held_out_prompts(config.target_model, num_prompts)
        spec, base = [], []
        with CoordinatorClient(stack.address) as client:
            client.generate(prompts[0], replace(params, max_tokens=8))  # warm-up
            for i, prompt in enumerate(prompts, 1):
                shown = prompt if isinstance(prompt, str) else f"{prompt[-1]['content']}\n"
                print(f"\n=== prompt {i}/{len(prompts)} ===\n{shown}", end="")
                print("\033[1m", end="")
                out = client.generate(prompt, params, on_text=_print)
                print("\033[0m")
                s = out.stats
                drafted, accepted = s["num_draft_tokens"], s["num_accepted_tokens"]
                print(
                    f"--- {len(out.token_ids)} tokens in {out.seconds:.2f}s "
                    f"({len(out.token_ids) / out.seconds:.1f} tok/s); acceptance "
                    f"{accepted}/{drafted} = {accepted / max(1, drafted):.2f}, mean acceptance "
                    f"length {1 + accepted / max(1, s['num_drafts']):.2f}"
                )
                spec.append(out)
        print("\ntarget-only decoding of the same prompts (same target service, no draft) ...")
        with CoordinatorClient(stack.baseline_address) as client:
            client.generate(prompts[0], replace(params, max_tokens=8))
            base = [client.generate(prompt, params) for prompt in prompts]
    same = all(a.token_ids == b.token_ids for a, b in zip(spec, base, strict=True))
    drafted = sum(o.stats["num_draft_tokens"] for o in spec)
    accepted = sum(o.stats["num_accepted_tokens"] for o in spec)
    speedup = _rate(spec) / _rate(base)
    print(
        f"\nspeculative {_rate(spec):.1f} tok/s vs target-only {_rate(base):.1f} tok/s: "
        f"speedup {speedup:.2f}x; acceptance rate {accepted / max(1, drafted):.2f}; "
        f"greedy outputs identical to target-only: {'yes' if same else 'NO'}"
    )
    return 0 if same else 1


def _print(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
