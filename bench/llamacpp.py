"""specdec against llama.cpp on the same weights, on this machine.

    python bench/llamacpp.py [--pair tiny|real] [--json] [--rounds 3] [--new-tokens 128]
                             [--k 6]

``--pair real``: the default pair on SmolLM2-135M-Instruct's own Q4_1 GGUF, the file both
engines read (specdec keeps its Q4_1 / Q8_0 blocks), on eight hand-written general
chat prompts (the first of each category of ``bench/prompts/general_chat.json``) rendered
through the chat template: llama.cpp decode only and target-only generation at 1 and 2
threads against specdec's runtime, the target-only stack on one thread (``specdec up
--no-draft --target-num-threads 1``) and on every core (the baseline coordinator on the
default stack's target service), and the speculative stack with its defaults (``specdec
up``: the target on every core, which leaves the draft its core while the draft computes);
llama.cpp runs no speculative row there, as the draft's frequency-ranked head has no GGUF
form.
``--pair tiny`` (the default) is the bundled pair, as below.

1. Builds llama.cpp once from the ``llama-cpp-python`` sdist on the package index (its
   vendored tree, unedited; cmake Release, ``-DGGML_NATIVE=ON -DLLAMA_CURL=OFF``, only the
   tools used here, ``-j2``: about 15 minutes) into ``$SPECDEC_CACHE_DIR/llamacpp``.
2. Converts the tiny pair to GGUF f32 and f16 with llama.cpp's ``convert_hf_to_gguf.py``,
   from copies of the folders without the FP8 KV-scale tensors it has no name for; the
   tiny tokenizer's pre-tokenizer is GPT-2's regex under a hash the converter does not
   list, so a wrapper names it ``gpt-2`` when the converter finds no name. The converter
   imports ``sentencepiece`` (``pip install sentencepiece``) even for BPE tokenizers.
3. Checks that llama.cpp tokenises the held-out prompts as specdec does and continues
   them greedily with the same text.
4. Alternates llama.cpp and specdec rounds on the same prompts and prints the medians:
   decode only (``llama-bench`` tg / specdec's runtime), target-only generation
   (``llama-completion`` eval speed / the stack's target-only coordinator) and speculative
   generation (``llama-speculative-simple`` / the stack), with 1 and 2 llama.cpp threads
   and specdec's defaults (the target on every core, one of them left to the draft while
   it computes), f32 and f16 weights. Generation rates are the
   decode phase on both sides: llama.cpp times it after the prompt, specdec after each
   stream's first token (``Completion.decode_tok_s``); specdec's whole-request rates
   (prefill and first token included) are printed too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

from specdec.bench import decode_rate, measure
from specdec.client import GenerateParams, generate_concurrently
from specdec.config import (
    GENERAL_CHAT,
    REAL_DRAFT,
    REAL_TARGET,
    TINY_DRAFT,
    TINY_TARGET,
    StackConfig,
    model_folder,
)
from specdec.coordinator.engine.config import SpeculativeConfig
from specdec.kernels.native import cache_root
from specdec.launcher import Stack, held_out_prompts

ROOT = Path(__file__).resolve().parents[1]

SDIST = "llama-cpp-python==0.3.36"
TOOLS = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-tokenize")
DTYPES = {"f32": "float32", "f16": "float16"}  # GGUF outtype -> specdec --dtype
NUM_PROMPTS = 4
NEAR_TIE = 0.01  # logits
# --no-repack: on a CPU that lists AMX but whose kernel does not grant its tile state (this
# development VM), llama.cpp's repacked weights die with SIGILL on the first prompt batch;
# it changes nothing for f32 / f16 weights and halves Q4_1 decode (llama-bench keeps repack:
# tg128 at one thread 113-120 tok/s with it, 56 without, on the real target's Q4_1 file).
GREEDY = ("--temp", "0", "--ignore-eos", "-no-cnv", "--simple-io", "--no-repack")
# Runs llama.cpp's converter unedited, naming an unlisted BPE pre-tokenizer "gpt-2".
CONVERT = """
import runpy, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
from conversion.base import TextModel
listed = TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return listed(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
TextModel.get_vocab_base_pre = pre
sys.argv = [sys.argv[1] + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llama(bin_dir: Path, tool: str, *args) -> subprocess.CompletedProcess:
    return run([bin_dir / tool, *args])


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{done.stderr[-3000:]}")
    return done


def build(home: Path) -> tuple[Path, Path]:
    """(llama.cpp source tree, folder of its binaries), built unless already there."""
    bin_dir = home / "build" / "bin"
    sources = sorted(home.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if sources and all((bin_dir / tool).is_file() for tool in TOOLS):
        return sources[-1], bin_dir
    home.mkdir(parents=True, exist_ok=True)
    print(f"building llama.cpp from {SDIST} in {home} (about 15 minutes)", file=sys.stderr)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            SDIST,
            "-d",
            home,
        ]
    )
    with tarfile.open(next(home.glob("llama_cpp_python-*.tar.gz"))) as archive:
        archive.extractall(home, filter="data")
    source = sorted(home.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]
    run(
        [
            "cmake",
            "-S",
            source,
            "-B",
            home / "build",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
        ]
    )
    run(["cmake", "--build", home / "build", "-j2", "--target", *TOOLS])
    return source, bin_dir


def convert(source: Path, model: Path, outtype: str, out_dir: Path) -> Path:
    """``model`` as GGUF ``outtype``, converted once per checkpoint."""
    from safetensors.torch import load_file, save_file

    weights = model / "model.safetensors"
    gguf = out_dir / f"{model.name}-{weights.stat().st_size}-{outtype}.gguf"
    if gguf.is_file():
        return gguf
    if importlib.util.find_spec("sentencepiece") is None:
        raise RuntimeError("llama.cpp's converter needs sentencepiece: pip install sentencepiece")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / model.name
        shutil.copytree(model, copy, ignore=shutil.ignore_patterns("*.safetensors"))
        tensors = load_file(weights)
        kept = {k: v for k, v in tensors.items() if not k.endswith(("k_scale", "v_scale"))}
        save_file(kept, copy / "model.safetensors", metadata={"format": "pt"})
        run([sys.executable, "-c", CONVERT, source, copy, "--outtype", outtype, "--outfile", gguf])
    return gguf


def general_chat_prompts() -> list[str]:
    """The first hand-written chat prompt of each category, as text through the real
    target's chat template."""
    from specdec.runtime.loader import load_tokenizer

    tokenizer = load_tokenizer(model_folder(str(REAL_TARGET)))
    prompts = {}
    for p in json.loads(GENERAL_CHAT.read_text())["prompts"]:
        prompts.setdefault(p["category"], p)
    prompts = list(prompts.values())
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p["content"]}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]


def check_agreement(
    bin_dir: Path, gguf: Path, target: Path, prompts: list[str], new_tokens: int, strict: bool
) -> list[int]:
    """llama.cpp's token ids (of ``gguf``) equal specdec's (of ``target``); ``strict``: its
    greedy text is ours up to the first near-tie (top-2 logits closer than NEAR_TIE, where
    float32 summation order decides), RuntimeError if not. Returns the agreeing tokens per
    prompt (not strict: the greedy tokens whose text llama.cpp's starts with; on quantized
    weights llama.cpp multiplies 8-bit activations in integers, so its logits differ from
    float32 math by more than summation order)."""
    import torch

    from specdec.runtime import ModelRunner, SequenceChunk
    from specdec.runtime.loader import load_tokenizer

    tokenizer = load_tokenizer(model_folder(str(target)))
    runner = ModelRunner.from_pretrained(target, num_pages=128)
    agreed = []
    for i, prompt in enumerate(prompts):
        ours = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        argv = ["-m", gguf, "-p", prompt, "--ids", "--no-bos", "--log-disable"]
        out = llama(bin_dir, "llama-tokenize", *argv).stdout
        theirs = json.loads(out.strip().splitlines()[-1])
        if theirs != ours:
            raise RuntimeError(
                f"prompt {i}: llama.cpp tokenises it as {theirs[:9]}.., we {ours[:9]}.."
            )
        runner.open("check")
        logits = runner.extend([SequenceChunk("check", ours)])[0]
        greedy: list[int] = []
        clear = new_tokens
        for t in range(new_tokens):
            top = torch.topk(logits[-1], 2)
            if clear == new_tokens and float(top.values[0] - top.values[1]) < NEAR_TIE:
                clear = t
            greedy.append(int(top.indices[0]))
            logits = runner.extend([SequenceChunk("check", greedy[-1:])])[0]
        runner.release("check")
        argv = ["-m", gguf, "-p", prompt, "-n", new_tokens, *GREEDY, "--no-display-prompt", "-t", 1]
        text = llama(bin_dir, "llama-completion", *argv).stdout
        same = max(
            n for n in range(new_tokens + 1) if text.startswith(tokenizer.decode(greedy[:n]))
        )
        if strict and same < clear:
            raise RuntimeError(f"prompt {i}: llama.cpp's greedy text differs from ours")
        agreed.append(min(same, clear) if strict else same)
    return agreed


def logged_rate(bin_dir: Path, tool: str, argv: list, pattern: str) -> float:
    """The last number ``pattern`` captures in the tool's log. This llama.cpp logs from a
    thread that exit does not wait for (``common_log``, leaked on purpose), so on a busy
    machine a run now and then ends with its log cut short: such a run is tried again, five
    times at most."""
    for _ in range(5):
        err = llama(bin_dir, tool, *argv).stderr
        found = re.findall(pattern, err)
        if found:
            return float(found[-1])
    raise RuntimeError(f"{tool} logged no rate in five runs:\n{err[-2000:]}")


def llama_rates(bin_dir, target, draft, prompts, threads, new_tokens, k) -> dict[str, float]:
    """llama.cpp's tokens/s: decode only, target-only and (with a draft) speculative
    generation (mean over the prompts)."""
    argv = ["-m", target, "-t", threads, "-p", 0, "-n", new_tokens, "-o", "json"]
    rates = {"decode": json.loads(llama(bin_dir, "llama-bench", *argv).stdout)[0]["avg_ts"]}
    completion, spec = [], []
    for prompt in prompts:
        argv = ["-m", target, "-p", prompt, "-n", new_tokens, *GREEDY, "-t", threads]
        pattern = r"perf_print:\s+eval time =.*?([\d.]+) tokens per second"  # not prompt eval
        completion.append(logged_rate(bin_dir, "llama-completion", argv, pattern))
        if draft is None:
            continue
        argv = ["-m", target, "-md", draft, "-p", prompt, "-n", new_tokens, "--temp", "0",
                "--spec-type", "draft-simple", "--spec-draft-n-max", k, "--spec-draft-n-min", 0,
                "-t", threads, "-td", threads]  # fmt: skip
        pattern = r"decoded .* speed:\s*([\d.]+) t/s"
        spec.append(logged_rate(bin_dir, "llama-speculative-simple", argv, pattern))
    rates["target_only"] = statistics.mean(completion)
    if spec:
        rates["spec"] = statistics.mean(spec)
    return rates


WHOLE = ("target_only", "spec")  # specdec's generation rates also taken over whole requests


def runtime_decode_rate(target: Path, dtype: str, new_tokens: int) -> float:
    """specdec's runtime alone: greedy decode tok/s at batch 1, one step a call."""
    spec_bench = importlib.util.spec_from_file_location("bench_runtime", ROOT / "bench/runtime.py")
    bench_runtime = importlib.util.module_from_spec(spec_bench)
    spec_bench.loader.exec_module(bench_runtime)
    from specdec.runtime import ModelRunner

    runner = ModelRunner.from_pretrained(target, num_pages=64, dtype=dtype)
    bench_runtime.run_ours(runner, 1, 4)
    seconds, _ = bench_runtime.run_ours(runner, 1, new_tokens)
    return new_tokens / seconds


def specdec_rates(
    config: StackConfig, new_tokens: int, prompts: list | None = None
) -> dict[str, float]:
    """specdec's tokens/s: the runtime's decode (one thread), and batch-1 target-only and
    speculative generation through the stack ``config`` describes (target-only: a
    coordinator with no draft on the same target service): the decode phase, as llama.cpp
    reports it (after the first token), and the whole request."""
    decode = runtime_decode_rate(Path(config.target_model), config.dtype, new_tokens)
    config = replace(config, with_baseline=True)
    with Stack(config) as stack:
        spec = SpeculativeConfig.from_json(config.speculative_config)
        report, _ = measure(stack, spec, [1], new_tokens, prompts)
    row = report["1"]
    return {
        "decode": decode,
        "target_only": row["target_only_decode_tok_s"],
        "spec": row["spec_decode_tok_s"],
        "target_only_with_prefill": row["target_only_tok_s"],
        "spec_with_prefill": row["spec_tok_s"],
    }


def target_only_one_thread(config: StackConfig, new_tokens: int, prompts: list) -> float:
    """``specdec up --no-draft --target-num-threads 1``'s decode-phase tok/s at batch 1."""
    params = GenerateParams(max_tokens=new_tokens, ignore_eos=True)
    with Stack(replace(config, no_draft=True, target_num_threads=1, port=0)) as stack:
        generate_concurrently(stack.address, prompts[:2], replace(params, max_tokens=8))
        runs = [generate_concurrently(stack.address, [prompt], params) for prompt in prompts]
    return decode_rate(runs)


def tiny_stack(dtype: str, k: int) -> StackConfig:
    return StackConfig(
        target_model=str(TINY_TARGET),
        draft_model=str(TINY_DRAFT),
        dtype=dtype,
        speculative_config=json.dumps({"num_speculative_tokens": k}),
        draft_p_min=0.0,  # the tiny pair's best: its draft is accepted five tokens in six
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=6, help="draft tokens per step, both engines")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    home = cache_root() / "llamacpp"
    source, bin_dir = build(home)
    if args.pair == "real":
        real_pair(bin_dir, args)
        return
    prompts = held_out_prompts(str(TINY_TARGET), NUM_PROMPTS)
    ggufs = {
        (name, outtype): convert(source, model, outtype, home)
        for name, model in (("target", TINY_TARGET), ("draft", TINY_DRAFT))
        for outtype in DTYPES
    }
    agreed = check_agreement(bin_dir, ggufs["target", "f32"], TINY_TARGET, prompts, 32, True)
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for outtype, dtype in DTYPES.items():
            target, draft = ggufs["target", outtype], ggufs["draft", outtype]
            for threads in (1, 2):
                rates = llama_rates(
                    bin_dir, target, draft, prompts, threads, args.new_tokens, args.k
                )
                for kind, rate in rates.items():
                    samples.setdefault(f"llamacpp_{kind}_{outtype}_t{threads}", []).append(rate)
            for kind, rate in specdec_rates(tiny_stack(dtype, args.k), args.new_tokens).items():
                samples.setdefault(f"specdec_{kind}_{outtype}", []).append(rate)
    figures = {key: round(statistics.median(v), 1) for key, v in samples.items()}
    figures["greedy_tokens_agreeing"] = agreed
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"tiny pair, greedy, {args.new_tokens} new tokens, K = {args.k}, "
        f"{len(prompts)} held-out prompts, medians of {args.rounds} alternating rounds, tok/s;\n"
        f"greedy text equal to llama.cpp's for {agreed} of 32 tokens (up to the first near-tie)"
    )
    print(f"{'':34} {'llama.cpp 1 thread':>18} {'llama.cpp 2 threads':>19} {'specdec':>8}")
    for kind, label in (
        ("decode", "decode only, target"),
        ("target_only", "target-only generation"),
        ("spec", "speculative generation"),
    ):
        for outtype in DTYPES:
            one, two = (figures[f"llamacpp_{kind}_{outtype}_t{t}"] for t in (1, 2))
            ours = figures[f"specdec_{kind}_{outtype}"]
            print(f"{label + ', ' + outtype:34} {one:>18.1f} {two:>19.1f} {ours:>8.1f}")
    for outtype in DTYPES:
        alone, spec = (figures[f"specdec_{k}_with_prefill_{outtype}"] for k in WHOLE)
        print(f"specdec, {outtype}, whole requests (prefill and first token included): "
              f"target-only {alone:.1f}, speculative {spec:.1f}")  # fmt: skip
    print(
        "specdec: its own runtime on one thread for decode only, the stack with its defaults "
        "else (the target on every core, one left to the draft while it computes); "
        "generation rates count the decode phase (after the first token), as llama.cpp's do"
    )


def real_pair(bin_dir: Path, args: argparse.Namespace) -> None:
    """The default pair on the real target's Q4_1 GGUF, general chat prompts."""
    from specdec.runtime.gguf_file import gguf_path

    gguf = gguf_path(REAL_TARGET)
    prompts = general_chat_prompts()
    agreed = check_agreement(bin_dir, gguf, REAL_TARGET, prompts, 32, strict=False)
    config = StackConfig(target_model=str(REAL_TARGET), draft_model=str(REAL_DRAFT))
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for threads in (1, 2):
            rates = llama_rates(bin_dir, gguf, None, prompts, threads, args.new_tokens, args.k)
            for kind, rate in rates.items():
                samples.setdefault(f"llamacpp_{kind}_t{threads}", []).append(rate)
        for kind, rate in specdec_rates(config, args.new_tokens, prompts).items():
            samples.setdefault(f"specdec_{kind}", []).append(rate)
        one_thread = target_only_one_thread(config, args.new_tokens, prompts)
        samples.setdefault("specdec_target_only_t1", []).append(one_thread)
    figures = {key: round(statistics.median(v), 1) for key, v in samples.items()}
    figures["greedy_tokens_agreeing"] = agreed
    if args.json:
        print(json.dumps(figures))
        return
    best = max(figures["llamacpp_target_only_t1"], figures["llamacpp_target_only_t2"])
    print(
        f"real pair on {gguf.name}, greedy, {args.new_tokens} new tokens, {len(prompts)} "
        f"general chat prompts, medians of {args.rounds} alternating rounds, tok/s;\n"
        f"llama.cpp's greedy text starts with our first {agreed} of 32 tokens (its 8-bit "
        f"activations move its logits)"
    )
    head = f"{'':26} {'llama.cpp 1 thread':>18} {'llama.cpp 2 threads':>19}"
    print(f"{head} {'specdec 1 thread':>16} {'specdec every core':>18}")
    rows = (
        ("decode only, target", "decode", figures["specdec_decode"], None),
        (
            "target-only generation",
            "target_only",
            figures["specdec_target_only_t1"],
            figures["specdec_target_only"],
        ),
    )
    for label, kind, one_thread, every_core in rows:
        one, two = figures[f"llamacpp_{kind}_t1"], figures[f"llamacpp_{kind}_t2"]
        ours = f"{every_core:>18.1f}" if every_core is not None else f"{'-':>18}"
        print(f"{label:26} {one:>18.1f} {two:>19.1f} {one_thread:>16.1f} {ours}")
    spec = figures["specdec_spec"]
    print(f"{'speculative generation':26} {'-':>18} {'-':>19} {'-':>16} {spec:>18.1f}")
    print(
        f"specdec target-only, 1 thread / llama.cpp 1 thread: "
        f"{figures['specdec_target_only_t1'] / figures['llamacpp_target_only_t1']:.2f}x; "
        f"every core / llama.cpp 2 threads: "
        f"{figures['specdec_target_only'] / figures['llamacpp_target_only_t2']:.2f}x; "
        f"speculative / llama.cpp's best: {spec / best:.2f}x; "
        f"whole requests: target-only {figures['specdec_target_only_with_prefill']:.1f}, "
        f"speculative {figures['specdec_spec_with_prefill']:.1f}"
    )


if __name__ == "__main__":
    main()
