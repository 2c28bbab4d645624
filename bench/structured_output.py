"""Structured output under speculation: the ten JSON schemas of
``bench/prompts/json_schemas.json``, each with its chat request, greedy, on one stack.

    python bench/structured_output.py [--target-model PATH] [--draft-model PATH] [--json]

Per case: the answer constrained by its schema, speculative and target-only (K = 0), and
the same request unconstrained, speculative. Prints whether each constrained answer parses
and validates, whether speculative equals target-only, and the drafts' acceptance: mean
accepted tokens per draft, constrained against unconstrained (the draft proposes under the
schema's mask, so it wastes no proposal on a token the target cannot take).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import jsonschema

from specdec.client import Completion, CoordinatorClient, GenerateParams
from specdec.config import REAL_DRAFT, REAL_TARGET, StackConfig
from specdec.launcher import Stack
from specdec.v1 import common_pb2

CASES = Path(__file__).parent / "prompts" / "json_schemas.json"


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def accepted_per_draft(stats: list[dict]) -> float:
    drafts = sum(s["num_drafts"] for s in stats)
    return sum(s["num_accepted_tokens"] for s in stats) / drafts if drafts else 0.0


def decode_tokens_per_second(runs: list[tuple[dict, Completion]]) -> float:
    """Tokens after the first over the seconds after it (the decode phase), summed over
    requests run one at a time."""
    tokens = sum(len(c.token_ids) - 1 for _, c in runs)
    return tokens / sum(c.seconds - c.first_token_seconds for _, c in runs)


def run(address: str, max_tokens: int) -> dict:
    cases = json.loads(CASES.read_text())["cases"]
    rows, constrained, free = [], [], []
    with CoordinatorClient(address) as client:
        for case in cases:
            messages = [{"role": "user", "content": case["prompt"]}]
            schema = common_pb2.StructuredOutput(json_schema=json.dumps(case["schema"]))
            params = GenerateParams(max_tokens=max_tokens, structured_output=schema)
            spec = client.generate(messages, params)
            target_only = client.generate(messages, replace(params, num_speculative_tokens=0))
            plain = client.generate(messages, GenerateParams(max_tokens=max_tokens))
            constrained.append((spec.stats, spec))
            free.append((plain.stats, plain))
            rows.append(
                {
                    "text": spec.text,
                    "valid": valid(spec.text, case["schema"]),
                    "equals_target_only": spec.token_ids == target_only.token_ids,
                    "tokens": len(spec.token_ids),
                    "accepted_per_draft": round(accepted_per_draft([spec.stats]), 3),
                    "unconstrained_accepted_per_draft": round(accepted_per_draft([plain.stats]), 3),
                }
            )
    ours = accepted_per_draft([s for s, _ in constrained])
    theirs = accepted_per_draft([s for s, _ in free])
    return {
        "constrained_decode_tok_s": round(decode_tokens_per_second(constrained), 1),
        "unconstrained_decode_tok_s": round(decode_tokens_per_second(free), 1),
        "cases": rows,
        "valid": sum(r["valid"] for r in rows),
        "equal_to_target_only": sum(r["equals_target_only"] for r in rows),
        "accepted_per_draft": round(ours, 3),
        "unconstrained_accepted_per_draft": round(theirs, 3),
        "ratio": round(ours / theirs, 3) if theirs else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-model", default=str(REAL_TARGET))
    parser.add_argument("--draft-model", default=str(REAL_DRAFT))
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    config = StackConfig(port=0, target_model=args.target_model, draft_model=args.draft_model)
    with Stack(config, timeout=240) as stack:
        figures = run(stack.address, args.max_tokens)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for i, row in enumerate(figures["cases"]):
        print(
            f"{i}: valid={row['valid']} equal={row['equals_target_only']} "
            f"tokens={row['tokens']} accepted/draft {row['accepted_per_draft']} "
            f"(unconstrained {row['unconstrained_accepted_per_draft']})  {row['text'][:60]!r}"
        )
    n = len(figures["cases"])
    print(
        f"valid {figures['valid']}/{n}, equal to target-only {figures['equal_to_target_only']}/{n}"
        f"; accepted per draft {figures['accepted_per_draft']} constrained, "
        f"{figures['unconstrained_accepted_per_draft']} unconstrained "
        f"(ratio {figures['ratio']}); decode {figures['constrained_decode_tok_s']} tok/s "
        f"constrained, {figures['unconstrained_decode_tok_s']} unconstrained"
    )


if __name__ == "__main__":
    main()
