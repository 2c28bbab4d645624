"""Measure the bundled target/draft pair with transformers alone, on held-out prompts.

Prints parameter counts, the per-token forward cost ratio (batch 1, 200-token cache),
greedy acceptance with K draft tokens, top-1 agreement on held-out text, the share of
distinct 4-grams in the target's greedy continuations, and (with --samples) sampled text.

Usage: ``python scripts/eval_models.py [--models models] [--json] [--samples 3]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

BARS = {
    "cost_ratio": 8.0,
    "acceptance_rate": 0.65,
    "mean_tokens_per_round": 2.6,
    "top1_agreement": 0.55,
    "distinct_4gram_share": 0.4,
}


def load(folder: Path):
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


@torch.no_grad()
def forward_ms(model, vocab: int, context: int = 200, repeats: int = 40) -> float:
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0))
    cache = model(ids, use_cache=True).past_key_values
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cache = model(ids[:, -1:], past_key_values=cache, use_cache=True).past_key_values
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1000


@torch.no_grad()
def greedy(model, ids: list[int], new_tokens: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False
    )
    return out[0, len(ids) :].tolist()


def acceptance(
    target_out: list[int],
    prompt: list[int],
    propose: Callable[[list[int], int], list[int]],
    k: int,
) -> list[int]:
    """Replays greedy speculative decoding over the target's own greedy output.

    Greedy speculative output equals target greedy output, so each round's accepted count
    is the matching prefix of the draft's rollout (``propose(context, k)``: its ``k``
    greedy tokens) and the target's next tokens. Returns the accepted count of each round
    (``k`` tokens drafted per round).
    """
    counts = []
    i = 0
    while i < len(target_out):
        proposal = propose(prompt + target_out[:i], k)
        a = 0
        while a < k and i + a < len(target_out) and proposal[a] == target_out[i + a]:
            a += 1
        counts.append(a)
        i += a + 1
    return counts


def distinct_4gram_share(tokens: list[int]) -> float:
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / max(1, len(grams))


@torch.no_grad()
def top1_agreement(target, draft, texts: list[list[int]]) -> float:
    agree = total = 0
    for ids in texts:
        x = torch.tensor([ids])
        t = target(x).logits.argmax(-1)
        d = draft(x).logits.argmax(-1)
        agree += (t == d).sum().item()
        total += t.numel()
    return agree / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--samples", type=int, default=0, help="print N sampled continuations")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.models / "target", local_files_only=True)
    target, draft = load(args.models / "target"), load(args.models / "draft")
    heldout = json.loads((args.models / "heldout.json").read_text())
    prompts = [tokenizer(p)["input_ids"] for p in heldout["prompts"][: args.num_prompts]]
    texts = [tokenizer(t)["input_ids"][:256] for t in heldout["texts"]]

    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    vocab = target.config.vocab_size
    target_ms, draft_ms = forward_ms(target, vocab), forward_ms(draft, vocab)

    counts: list[int] = []  # accepted tokens per round
    shares = []
    for prompt in prompts:
        out = greedy(target, prompt, args.new_tokens)
        shares.append(distinct_4gram_share(out))
        counts += acceptance(out, prompt, lambda context, k: greedy(draft, context, k), args.k)
    rounds, accepted, drafted = len(counts), sum(counts), args.k * len(counts)
    emitted = args.new_tokens * len(prompts)
    figures = {
        "target_params": n_target,
        "draft_params": n_draft,
        "param_ratio": round(n_target / n_draft, 2),
        "target_forward_ms": round(target_ms, 2),
        "draft_forward_ms": round(draft_ms, 2),
        "cost_ratio": round(target_ms / draft_ms, 2),
        "num_prompts": len(prompts),
        "k": args.k,
        "acceptance_rate": round(accepted / drafted, 3),
        "mean_tokens_per_round": round(emitted / rounds, 3),
        "top1_agreement": round(top1_agreement(target, draft, texts), 3),
        "distinct_4gram_share": round(sum(shares) / len(shares), 3),
    }
    figures["meets_bars"] = all(figures[k] >= v for k, v in BARS.items())
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            bar = f"  (bar >= {BARS[key]})" if key in BARS else ""
            print(f"{key:24s} {value}{bar}")
    gen = torch.Generator().manual_seed(0)
    for prompt in heldout["prompts"][: args.samples]:
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        x = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=96,
            do_sample=True,
            temperature=0.8,
            top_p=0.95,
        )
        print(f"\n--- prompt ---\n{prompt}--- target sample (T=0.8, top_p=0.95) ---")
        print(tokenizer.decode(out[0, x.shape[1] :]))


if __name__ == "__main__":
    main()
