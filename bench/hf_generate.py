"""transformers baselines for `specdec bench`: target-only and assisted generation, batch 1.

Same weights as the stack, one process, greedy, `--new-tokens` tokens per held-out prompt
(eos ignored via min_new_tokens). Assisted generation uses `assistant_model=` with
transformers' default assistant schedule. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoTokenizer

# This folder's runtime.py would shadow the package: put the project first on the path.
from specdec.client import Prompt
from specdec.config import TINY_DRAFT, TINY_TARGET, model_folder
from specdec.launcher import held_out_prompts
from specdec.runtime.loader import load_hf_model


@torch.no_grad()
def timed_greedy(model, input_ids: torch.Tensor, new_tokens: int, **kwargs):
    """``(seconds, output ids)`` of a greedy ``generate`` of exactly ``new_tokens`` tokens."""
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        **kwargs,
    )
    return time.perf_counter() - start, out


def tok_s(target, prompts: list[torch.Tensor], new_tokens: int, **kwargs) -> float:
    generated, seconds = 0, 0.0
    for ids in prompts:
        elapsed, out = timed_greedy(target, ids, new_tokens, **kwargs)
        seconds += elapsed
        generated += out.shape[1] - ids.shape[1]
    return generated / seconds


def encode(tokenizer, prompt: Prompt) -> torch.Tensor:
    """``[1, n]`` ids, as the coordinator tokenises text or renders chat messages."""
    if isinstance(prompt, str):
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False)
    return torch.tensor([list(ids)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(TINY_TARGET))
    parser.add_argument("--draft", default=str(TINY_DRAFT))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=4)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(model_folder(args.target)), local_files_only=True)
    target = load_hf_model(args.target)  # a GGUF too: transformers dequantises it
    draft = load_hf_model(args.draft)  # a frequency-ranked head included
    prompts = [encode(tokenizer, p) for p in held_out_prompts(args.target, args.num_prompts)]
    tok_s(target, prompts[:1], 8)  # warm-up
    tok_s(target, prompts[:1], 8, assistant_model=draft)
    result = {
        "hf_target_only_tok_s_bs1": round(tok_s(target, prompts, args.new_tokens), 2),
        "hf_assisted_tok_s_bs1": round(
            tok_s(target, prompts, args.new_tokens, assistant_model=draft), 2
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
