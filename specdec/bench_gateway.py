"""`specdec bench --gateway`: the same greedy workload straight to the coordinator over
gRPC and through the SGLang Model Gateway's OpenAI API, alternately; generated tokens/s
over the wall time of each batch, the best of `REPEATS` runs each."""

from __future__ import annotations

import json
import threading
import urllib.request

from specdec.client import GenerateParams, Prompt, generate_concurrently, run_together
from specdec.launcher import Stack, held_out_prompts

REPEATS = 3


def openai_request(model: str, prompt: Prompt, new_tokens: int) -> tuple[str, dict]:
    """(route, body) of a greedy OpenAI request that ignores eos, as the gRPC one does."""
    body = {"model": model, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return "/chat/completions", {**body, "messages": prompt}
    return "/completions", {**body, "prompt": prompt}


def through_gateway(url: str, model: str, prompts: list[Prompt], new_tokens: int) -> float:
    """Generated tokens/s of ``prompts`` sent at once to the gateway at ``url``; raises the
    first failed request's error."""
    tokens = [0] * len(prompts)
    errors: list[BaseException] = []

    def worker(i: int, barrier: threading.Barrier) -> None:
        route, body = openai_request(model, prompts[i], new_tokens)
        request = urllib.request.Request(
            url + route, json.dumps(body).encode(), {"content-type": "application/json"}
        )
        barrier.wait()
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                tokens[i] = json.load(reply)["usage"]["completion_tokens"]
        except (OSError, KeyError, ValueError) as e:
            errors.append(e)

    seconds = run_together(worker, len(prompts))
    if errors:
        raise errors[0]
    return sum(tokens) / seconds


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/models", timeout=10) as reply:
        return json.load(reply)["data"][0]["id"]


def measure_gateway(stack: Stack, batch_sizes: list[int], new_tokens: int) -> dict:
    prompts = held_out_prompts(stack.config.target_model, max(batch_sizes))
    params = GenerateParams(max_tokens=new_tokens, ignore_eos=True)
    model = served_model(stack.gateway_url)
    through_gateway(stack.gateway_url, model, prompts[:1], 8)  # warm-up
    report = {}
    for bs in batch_sizes:
        direct, gateway = [], []
        for _ in range(REPEATS):
            direct.append(generate_concurrently(stack.address, prompts[:bs], params)[0])
            gateway.append(through_gateway(stack.gateway_url, model, prompts[:bs], new_tokens))
        report[str(bs)] = {
            "direct_grpc_tok_s": round(max(direct), 2),
            "gateway_tok_s": round(max(gateway), 2),
            "gateway_over_direct": round(max(gateway) / max(direct), 3),
        }
    return report
