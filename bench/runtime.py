"""Greedy decode throughput: specdec's runtime vs ``transformers`` (and, for a GGUF,
``llama-bench``) on the same checkpoint.

    python bench/runtime.py [--model PATH] [--json] [--new-tokens 128] [--attention-backend B]
                            [--dtypes float32,float16,bfloat16]

Batch 1 and batch 8 (eight prompts of equal length, so HF needs no padding), ``auto`` KV
cache; each engine's best of ``--rounds`` alternating rounds; one row per weight dtype,
both engines loading the checkpoint in it (ours computes in float32 over 16-bit weights,
transformers in the dtype itself). A GGUF model (a ``.gguf`` file or a folder holding
one) is one row: ours keeps its block formats, transformers dequantises it to float32;
llama.cpp's ``llama-bench`` then decodes the same file (``tg`` of ``--new-tokens``, same
threads; built by bench/llamacpp.py on first use), against ours one step a call
(``extend``) and in the C greedy loop the target service's multi-step decode runs.
Default model: the real target's Q4_1 GGUF (``models/smollm2-135m-instruct-q4_1``,
fetched by scripts/fetch_models.py), else the bundled tiny ``models/target``, else a
random ~20M-parameter Qwen3 built in a temp folder.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from hf_generate import timed_greedy

from specdec.config import REAL_TARGET, TINY_TARGET, has_model_files
from specdec.kernels import dense_ops
from specdec.kernels.attention import ATTENTION_BACKENDS
from specdec.runtime import ModelRunner, SequenceChunk
from specdec.runtime.gguf_file import gguf_path, is_gguf
from specdec.runtime.loader import load_hf_model

ROOT = Path(__file__).resolve().parents[1]

PROMPT_LEN = 16
BENCH_QWEN3 = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def build_random_qwen3(folder: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**BENCH_QWEN3)).save_pretrained(folder)
    return folder


def prompts(batch: int, vocab: int) -> list[list[int]]:
    return [[(31 * b + 7 * i + 3) % vocab for i in range(PROMPT_LEN)] for b in range(batch)]


def run_ours(runner: ModelRunner, batch: int, new_tokens: int) -> tuple[float, list[list[int]]]:
    seq_ids = [f"bench-{batch}-{b}" for b in range(batch)]
    start = time.perf_counter()
    for seq_id in seq_ids:
        runner.open(seq_id)
    batch_prompts = prompts(batch, runner.vocab_size)
    chunks = [SequenceChunk(s, p) for s, p in zip(seq_ids, batch_prompts, strict=True)]
    out: list[list[int]] = [[] for _ in seq_ids]
    for step in range(new_tokens):
        logits = runner.extend(chunks)
        tokens = torch.cat(logits).argmax(-1).tolist()
        for b, token in enumerate(tokens):
            out[b].append(token)
        if step + 1 < new_tokens:
            chunks = [SequenceChunk(s, [t]) for s, t in zip(seq_ids, tokens, strict=True)]
    elapsed = time.perf_counter() - start
    for seq_id in seq_ids:
        runner.release(seq_id)
    return elapsed, out


def run_c_loop(runner: ModelRunner, new_tokens: int) -> float:
    """Seconds for ``new_tokens`` greedy tokens at batch 1 in one ``decode_greedy`` call
    (the C loop of the target service's multi-step decode); inf where it does not run."""
    runner.open("bench-loop")
    runner.extend([SequenceChunk("bench-loop", prompts(1, runner.vocab_size)[0])])
    start = time.perf_counter()
    picks = runner.decode_greedy(["bench-loop"], [0], new_tokens)
    elapsed = time.perf_counter() - start
    runner.release("bench-loop")
    return elapsed if picks is not None else float("inf")


def llama_bench_rate(model_path: Path, new_tokens: int, threads: int, rounds: int) -> float:
    """llama.cpp's ``llama-bench`` tg rate on the GGUF (tok/s), its best of ``rounds``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_llamacpp", ROOT / "bench/llamacpp.py")
    llamacpp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llamacpp)
    _, bin_dir = llamacpp.build(llamacpp.cache_root() / "llamacpp")
    argv = ["-m", gguf_path(model_path), "-t", threads, "-p", 0, "-n", new_tokens]
    argv += ["-r", rounds, "-o", "json"]
    return json.loads(llamacpp.llama(bin_dir, "llama-bench", *argv).stdout)[0]["avg_ts"]


def run_hf(model, batch: int, new_tokens: int, vocab: int) -> tuple[float, list[list[int]]]:
    input_ids = torch.tensor(prompts(batch, vocab))
    elapsed, out = timed_greedy(model, input_ids, new_tokens, pad_token_id=0)
    return elapsed, out[:, PROMPT_LEN:].tolist()


def bench(
    model_path: Path,
    new_tokens: int,
    rounds: int,
    attention_backend: str = "auto",
    dtype: str = "float32",
) -> tuple[dict[str, float], dict[str, str]]:
    """Figures keyed ``{ours,hf}_tok_s_bs{1,8}`` (float32) or ``..._{dtype}``."""
    hf = load_hf_model(model_path).to(getattr(torch, dtype))
    vocab = hf.config.vocab_size
    pages_per_seq = -(-(PROMPT_LEN + new_tokens) // 16)
    runner = ModelRunner.from_pretrained(
        model_path,
        num_pages=8 * pages_per_seq + 8,
        attention_backend=attention_backend,
        dtype=dtype,
    )
    suffix = "" if dtype == "float32" else f"_{dtype}"
    run_ours(runner, 1, 4)  # warm-up
    run_hf(hf, 1, 4, vocab)
    results: dict[str, float] = {}
    agreement: dict[str, str] = {}
    for batch in (1, 8):
        # Alternate the engines and keep each one's best round: on a shared machine the
        # slow rounds measure the neighbours, not the engine.
        ours_s = hf_s = float("inf")
        for _ in range(rounds):
            elapsed, ours_tokens = run_ours(runner, batch, new_tokens)
            ours_s = min(ours_s, elapsed)
            elapsed, hf_tokens = run_hf(hf, batch, new_tokens, vocab)
            hf_s = min(hf_s, elapsed)
        results[f"ours_tok_s_bs{batch}{suffix}"] = round(batch * new_tokens / ours_s, 1)
        results[f"hf_tok_s_bs{batch}{suffix}"] = round(batch * new_tokens / hf_s, 1)
        if batch == 1:
            loop_s = min(run_c_loop(runner, new_tokens) for _ in range(rounds))
            results[f"ours_c_loop_tok_s_bs1{suffix}"] = round(new_tokens / loop_s, 1)
        # Greedy outputs agree unless a near-tie flips (reported, not asserted).
        same = sum(a == b for a, b in zip(ours_tokens, hf_tokens, strict=True))
        agreement[f"{batch}{suffix}"] = f"{same}/{batch}"
    return results, agreement


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds per batch size; best kept"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads for both engines: torch's intra-op threads, and our C kernels' pool",
    )
    parser.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="our runtime's attention (auto: the C kernel on the CPU)",
    )
    parser.add_argument(
        "--dtypes", default="float32,float16,bfloat16", help="weight dtypes, one row each"
    )
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",")
    torch.set_num_threads(args.threads)
    dense_ops.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if model_path is None:
            found = [m for m in (REAL_TARGET, TINY_TARGET) if has_model_files(str(m))]
            model_path = found[0] if found else None
        if model_path is None:
            model_path = build_random_qwen3(Path(tmp) / "qwen3-20m")
        gguf = is_gguf(model_path)
        if gguf:
            dtypes = ["float32"]  # ours reads the blocks as they are; transformers in float32
        results: dict[str, float] = {}
        agreement: dict[str, str] = {}
        for dtype in dtypes:
            figures, same = bench(
                model_path, args.new_tokens, args.rounds, args.attention_backend, dtype
            )
            results.update(figures)
            agreement.update(same)
        if gguf:
            results["llama_bench_tg_tok_s"] = round(
                llama_bench_rate(model_path, args.new_tokens, args.threads, args.rounds), 1
            )

    if args.json:
        print(json.dumps(results))
        return
    print(
        f"model: {model_path}  greedy, {args.new_tokens} new tokens, auto KV, "
        f"{args.attention_backend} attention, {args.threads} thread(s), best of {args.rounds} "
        f"alternating rounds"
    )
    print(f"{'weights':>9} {'batch':>5} {'ours tok/s':>11} {'hf tok/s':>9} {'speed-up':>9}  same")
    for dtype in dtypes:
        suffix = "" if dtype == "float32" else f"_{dtype}"
        for batch in (1, 8):
            ours = results[f"ours_tok_s_bs{batch}{suffix}"]
            hf = results[f"hf_tok_s_bs{batch}{suffix}"]
            same = agreement[f"{batch}{suffix}"]
            print(f"{dtype:>9} {batch:>5} {ours:>11.1f} {hf:>9.1f} {ours / hf:>8.2f}x  {same}")
    loop = results["ours_c_loop_tok_s_bs1"]
    print(f"ours at batch 1 in the C greedy loop (the service's multi-step decode): {loop:.1f}")
    if "llama_bench_tg_tok_s" in results:
        llama = results["llama_bench_tg_tok_s"]
        print(
            f"llama-bench tg{args.new_tokens} on the same file, {args.threads} thread(s): "
            f"{llama:.1f} tok/s; ours / llama-bench: one step a call "
            f"{results['ours_tok_s_bs1'] / llama:.2f}x, C loop {loop / llama:.2f}x"
        )


if __name__ == "__main__":
    main()
