"""Measure the SmolLM2 draft against its target with the project's runtime.

On the held-out chat prompts (``heldout.json``, never trained on): the target's
greedy answer (``--new-tokens``, stopping at EOS), replayed as chain speculative decoding
with ``--k`` greedy draft tokens per round (``eval_models.acceptance``): mean acceptance
length = 1 + accepted / drafts, and the acceptance rate per draft position. Then the cost
of one decode step of each model at batch 1 on one thread (median over ``--repeats``
steps at a ``--context``-token cache, the two models interleaved so load on the machine
hits both alike). Last, the same greedy requests through the running stack (``Stack``:
three processes, one core per model service, K = ``--k`` on every step, never cut short by
``--draft-p-min``), where the acceptance comes from the stats the Generate responses
report; then once more with prompt lookup first (``--prompt-lookup``, the default
configuration's n-gram sizes): the draft service as `specdec up` runs it. Figures go to
``<draft>/eval.json``. A draft that reads the target's features is measured through the
stack only (its proposals need the target's hidden states, which the stack carries).

Last, the hand-written general chat set (``bench/prompts/general_chat.json``, ten prompts
in each of eight categories, never trained or tuned on) through the stack at K =
``--k``: mean acceptance length per category, greedy and at T = 0.7
(``--general-chat-only``: that alone, into ``<draft>/general_chat.json``).

Usage: ``python scripts/eval_draft.py [--k 5] [--new-tokens 64] [--prompt-lookup 3,4]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from eval_models import acceptance
from fetch_models import DRAFT_DIR, MODEL_DIR

from specdec.bench import acceptance_summary
from specdec.client import CoordinatorClient, GenerateParams
from specdec.config import GENERAL_CHAT, StackConfig, draft_dtype
from specdec.coordinator.engine.config import DEFAULT_SPECULATIVE_CONFIG, SpeculativeConfig
from specdec.launcher import Stack
from specdec.runtime import ModelRunner, SequenceChunk
from specdec.runtime.loader import load_tokenizer


def greedy(runner: ModelRunner, context: list[int], num_new: int, stop: bool) -> list[int]:
    """``num_new`` greedy tokens after ``context`` (fewer when ``stop`` and EOS comes)."""
    runner.open("eval")
    try:
        logits = runner.extend([SequenceChunk("eval", context)])[0]
        out: list[int] = []
        while len(out) < num_new:
            out.append(int(logits[-1].argmax()))
            if stop and out[-1] in runner.eos_token_ids:
                break
            if len(out) < num_new:
                logits = runner.extend([SequenceChunk("eval", [out[-1]])])[0]
        return out
    finally:
        runner.release("eval")


def step_ms(runners: dict[str, ModelRunner], context: int, repeats: int) -> dict[str, float]:
    """Median wall time of one single-token decode step per runner, batch 1."""
    ids = torch.randint(0, 49152, (context,), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {name: [] for name in runners}
    for runner in runners.values():
        runner.open("bench")
        runner.extend([SequenceChunk("bench", ids.tolist())])
    for _ in range(repeats):
        for name, runner in runners.items():
            start = time.perf_counter()
            runner.extend([SequenceChunk("bench", [5])])
            times[name].append(time.perf_counter() - start)
            runner.truncate("bench", context)
    for runner in runners.values():
        runner.release("bench")
    return {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}


def fixed_k_stack(target: Path, draft: Path, spec: dict) -> Stack:
    """The stack proposing ``spec``'s K on every step: no confidence cut, and no speculation
    gate holding a request back at K = 0 where speculation would not pay."""
    return Stack(
        StackConfig(
            target_model=str(target),
            draft_model=str(draft),
            speculative_config=json.dumps(spec),
            draft_p_min=0.0,
            speculative_gate="off",
            port=0,
        )
    )


def stack_acceptance(
    target: Path,
    draft: Path,
    questions: list[str],
    k: int,
    new_tokens: int,
    lookup: tuple[int, int] = (0, 0),
):
    """Mean acceptance length and per-position acceptance as the stack reports them: each
    held-out chat alone (batch 1), greedy, ``new_tokens`` at most, K = ``k`` throughout;
    prompt lookup first where ``lookup`` (n_min, n_max) is set."""
    spec = {"num_speculative_tokens": k}
    if any(lookup):
        spec.update(prompt_lookup_min=lookup[0], prompt_lookup_max=lookup[1])
    params = GenerateParams(max_tokens=new_tokens)
    with fixed_k_stack(target, draft, spec) as stack, CoordinatorClient(stack.address) as client:
        outs = [client.generate([{"role": "user", "content": q}], params) for q in questions]
    return {
        "generated_tokens": sum(len(o.token_ids) for o in outs),
        "num_drafts": sum(o.stats["num_drafts"] for o in outs),
        "num_accepted_tokens": sum(o.stats["num_accepted_tokens"] for o in outs),
        "num_lookup_drafts": sum(o.stats["num_lookup_drafts"] for o in outs),
        **acceptance_summary(outs),
    }


def general_chat_acceptance(target: Path, draft: Path, k: int, new_tokens: int) -> dict:
    """Mean acceptance length per category of the hand-written general chat set
    (``GENERAL_CHAT``: no draft was trained or tuned on it), through the stack at K = ``k``
    on every step (no confidence cut, no prompt lookup), each prompt alone: greedy, then
    sampled at T = 0.7 (seeded by its index, so a rerun draws the same)."""
    prompts = json.loads(GENERAL_CHAT.read_text())["prompts"]
    spec = {"num_speculative_tokens": k}
    modes = {
        "greedy": lambda i: GenerateParams(max_tokens=new_tokens),
        "t0.7": lambda i: GenerateParams(max_tokens=new_tokens, temperature=0.7, seed=i),
    }
    result: dict = {"num_prompts": len(prompts), "k": k, "new_tokens": new_tokens}
    with fixed_k_stack(target, draft, spec) as stack, CoordinatorClient(stack.address) as client:
        for mode, params in modes.items():
            by_category: dict[str, list] = {}
            for i, p in enumerate(prompts):
                out = client.generate([{"role": "user", "content": p["content"]}], params(i))
                by_category.setdefault(p["category"], []).append(out)
            everything = [o for outs in by_category.values() for o in outs]
            result[mode] = {
                "overall": acceptance_summary(everything)["mean_acceptance_length"],
                **{
                    category: acceptance_summary(outs)["mean_acceptance_length"]
                    for category, outs in by_category.items()
                },
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, default=DRAFT_DIR)
    parser.add_argument("--target", type=Path, default=MODEL_DIR)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--samples", type=int, default=2, help="answers kept in eval.json")
    default_lookup = SpeculativeConfig.from_json(DEFAULT_SPECULATIVE_CONFIG).prompt_lookup
    parser.add_argument(
        "--prompt-lookup",
        default=",".join(map(str, default_lookup)),
        help="n_min,n_max of the stack's second run with prompt lookup first",
    )
    parser.add_argument(
        "--general-chat-only",
        action="store_true",
        help="only the per-category figures on the general chat set (into general_chat.json)",
    )
    args = parser.parse_args()
    if args.general_chat_only:
        figures = general_chat_acceptance(args.target, args.draft, args.k, args.new_tokens)
        (args.draft / "general_chat.json").write_text(json.dumps(figures, indent=1) + "\n")
        print(json.dumps(figures, indent=1))
        return
    lookup = tuple(int(n) for n in args.prompt_lookup.split(","))
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args.target)
    target = ModelRunner.from_pretrained(args.target, num_pages=64, max_model_len=1024)
    # The draft as `specdec up` serves it: its checkpoint's dtype when 16-bit, the linears
    # quantized as --draft-quantization's default says.
    dtype = draft_dtype(str(args.draft), "auto", "float32")
    quantization = StackConfig.draft_quantization
    draft = ModelRunner.from_pretrained(
        args.draft, num_pages=64, max_model_len=1024, dtype=dtype, quantization=quantization
    )
    questions = json.loads((args.draft / "heldout.json").read_text())["prompts"]
    counts: list[int] = []  # accepted tokens per round
    samples = []
    replayed = not draft.model_config.reads_target_features
    for question in questions if replayed else ():
        chat = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        out = greedy(target, prompt, args.new_tokens, stop=True)
        counts += acceptance(out, prompt, lambda c, k: greedy(draft, c, k, stop=False), args.k)
        if len(samples) < args.samples:
            own = greedy(draft, prompt, args.new_tokens, stop=True)
            samples.append(
                {
                    "prompt": question,
                    "target_greedy": tokenizer.decode(out),
                    "draft_greedy": tokenizer.decode(own),
                }
            )
    rounds, accepted = len(counts), sum(counts)
    timings = step_ms({"target": target, "draft": draft}, args.context, args.repeats)
    figures = {"num_prompts": len(questions), "k": args.k, "new_tokens": args.new_tokens}
    if replayed:
        figures |= {
            "rounds": rounds,
            "accepted": accepted,
            "mean_acceptance_length": round(1 + accepted / rounds, 3),
            "acceptance_rate": round(accepted / (rounds * args.k), 3),
            "acceptance_per_position": [
                round(sum(a > n for a in counts) / rounds, 3) for n in range(args.k)
            ],
        }
    figures |= {
        "decode_step_ms_batch1_1thread": {k: round(v, 2) for k, v in timings.items()},
        "context_tokens": args.context,
        "draft_to_target_cost": round(timings["draft"] / timings["target"], 4),
        "draft_dtype": dtype,
        "draft_quantization": quantization,
        "through_the_stack": stack_acceptance(
            args.target, args.draft, questions, args.k, args.new_tokens
        ),
        "general_chat": general_chat_acceptance(args.target, args.draft, args.k, args.new_tokens),
        "prompt_lookup": lookup,
        "through_the_stack_with_prompt_lookup": stack_acceptance(
            args.target, args.draft, questions, args.k, args.new_tokens, lookup
        ),
        "samples": samples,
    }
    (args.draft / "eval.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
