"""Train the bundled tokenizer, target and draft on Python source found on this machine.

One reproducible recipe (fixed seeds, config logged to ``models/train_log.json``):

1. Corpus: the running interpreter's standard library (minus ``test/`` folders) plus the
   ``.py`` files of the packages installed in the project's venv. Split by file into
   train / held-out; held-out prompts and text are written to ``models/heldout.json``.
2. Tokenizer: byte-level BPE (``tokenizers``), saved so ``AutoTokenizer`` loads it offline.
3. Target: a deep, narrow Qwen3 trained with next-token loss.
4. Draft: a one-layer Qwen3 initialised with the target's embeddings, trained by
   distillation from the target (soft targets on corpus text and on the target's own
   greedy continuations, teacher run in no-grad batches).
5. FP8 KV scales per layer (``amax / fp8_max`` over held-out text) stored as
   ``model.layers.{i}.self_attn.k_scale`` / ``v_scale`` tensors, the names vLLM reads.

Usage: ``python scripts/train_models.py [--out models] [--target-steps N] [--draft-steps N]``.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from specdec.config import SPECULATORS_CONFIG, tuned_speculation
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.loader import kv_scale_tensors

EOS = "<|endoftext|>"
FP8_E4M3_MAX = 448.0
CORPUS_PACKAGES = ("transformers", "torch", "grpc", "google", "opentelemetry", "tokenizers")


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    vocab_size: int = 4096
    seq_len: int = 256
    heldout_every: int = 40  # one file in N (by path hash) is held out
    max_corpus_bytes: int = 40_000_000
    target_layers: int = 16
    target_hidden: int = 256
    target_intermediate: int = 768
    draft_hidden: int = 256
    draft_intermediate: int = 1536
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    target_steps: int = 520
    target_batch: int = 16
    target_lr: float = 2e-3
    draft_steps: int = 900
    draft_batch: int = 16
    draft_lr: float = 2e-3
    num_continuation_prompts: int = 384
    continuation_tokens: int = 96
    num_heldout_prompts: int = 48


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_facts(recipe, packages: tuple[str, ...]) -> dict:
    """What every training log starts with: the recipe, Python and package versions, and
    the threads torch ran on."""
    return {
        "recipe": asdict(recipe),
        "python": sys.version.split()[0],
        "package_versions": {p: metadata.version(p) for p in packages},
        "torch_threads": torch.get_num_threads(),
    }


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    files = [
        p for p in stdlib.rglob("*.py") if not {"test", "tests", "site-packages"} & set(p.parts)
    ]
    for package in CORPUS_PACKAGES:
        files += sorted((site / package).rglob("*.py"))
    return sorted(set(files))


def is_heldout(path: Path, every: int) -> bool:
    return int(hashlib.sha1(str(path).encode()).hexdigest(), 16) % every == 0


def read_corpus(recipe: Recipe) -> tuple[list[str], list[str]]:
    rng = random.Random(recipe.seed)
    files = corpus_files()
    rng.shuffle(files)
    train, heldout, size = [], [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not 200 <= len(text) <= 200_000:
            continue
        (heldout if is_heldout(path, recipe.heldout_every) else train).append(text)
        size += len(text)
        if size >= recipe.max_corpus_bytes:
            break
    log(f"corpus: {len(train)} train files, {len(heldout)} held-out files, {size / 1e6:.1f} MB")
    return train, heldout


def train_tokenizer(texts: list[str], recipe: Recipe) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.model_max_length = 2048
    return fast


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += enc + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def model_config(
    recipe: Recipe, layers: int, hidden: int, intermediate: int, eos: int
) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=recipe.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def batches(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        yield torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def lr_at(step: int, total: int, peak: float) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def heldout_loss(model: Qwen3ForCausalLM, stream: torch.Tensor, seq_len: int) -> float:
    model.eval()
    n = min(32, (len(stream) - 1) // seq_len)
    x = stream[: n * seq_len].view(n, seq_len)
    with torch.no_grad():
        losses = [model(x[i : i + 8], labels=x[i : i + 8]).loss.item() for i in range(0, n, 8)]
    model.train()
    return sum(losses) / len(losses)


def train_target(recipe: Recipe, train: torch.Tensor, heldout: torch.Tensor, eos: int):
    torch.manual_seed(recipe.seed)
    cfg = model_config(
        recipe, recipe.target_layers, recipe.target_hidden, recipe.target_intermediate, eos
    )
    model = Qwen3ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.target_lr, weight_decay=0.1)
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    data = batches(train, recipe.target_batch, recipe.seq_len, gen)
    t0 = time.time()
    for step in range(recipe.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe.target_steps, recipe.target_lr)
        x = next(data)
        loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == recipe.target_steps - 1:
            tok_s = (step + 1) * x.numel() / (time.time() - t0)
            log(f"target step {step}: loss {loss.item():.3f} ({tok_s:.0f} tok/s)")
    minutes = (time.time() - t0) / 60
    loss = heldout_loss(model, heldout, recipe.seq_len)
    log(f"target done in {minutes:.1f} min, held-out loss {loss:.3f}")
    return model.eval(), {"train_minutes": round(minutes, 1), "heldout_loss": round(loss, 4)}


@torch.no_grad()
def greedy_continuations(model: Qwen3ForCausalLM, prompts: torch.Tensor, new_tokens: int):
    out = model.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
    )
    return out


def train_draft(recipe, target, train: torch.Tensor, heldout: torch.Tensor, eos: int):
    torch.manual_seed(recipe.seed + 2)
    cfg = model_config(recipe, 1, recipe.draft_hidden, recipe.draft_intermediate, eos)
    draft = Qwen3ForCausalLM(cfg)
    if recipe.draft_hidden == recipe.target_hidden:
        # Start from the target's token embeddings (tied with its output head): the draft
        # then only has to learn the contextual part.
        draft.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    gen = torch.Generator().manual_seed(recipe.seed + 3)
    t0 = time.time()
    # The target's own greedy continuations: the regime the draft is judged in.
    prompt_len = 64
    starts = torch.randint(
        0, len(train) - prompt_len, (recipe.num_continuation_prompts,), generator=gen
    )
    prompts = torch.stack([train[s : s + prompt_len] for s in starts.tolist()])
    continuations = torch.cat(
        [
            greedy_continuations(target, prompts[i : i + 32], recipe.continuation_tokens)
            for i in range(0, len(prompts), 32)
        ]
    )
    log(f"draft: {len(continuations)} target continuations in {time.time() - t0:.0f} s")
    opt = torch.optim.AdamW(draft.parameters(), lr=recipe.draft_lr, weight_decay=0.0)
    data = batches(train, recipe.draft_batch // 2, recipe.seq_len, gen)
    cont_len = continuations.shape[1]
    for step in range(recipe.draft_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe.draft_steps, recipe.draft_lr)
        text = next(data)[:, :cont_len]
        pick = torch.randint(0, len(continuations), (recipe.draft_batch // 2,), generator=gen)
        x = torch.cat([text, continuations[pick]])
        with torch.no_grad():
            teacher = F.log_softmax(target(x).logits.float(), dim=-1)
        student = F.log_softmax(draft(x).logits.float(), dim=-1)
        kd = F.kl_div(student, teacher, log_target=True, reduction="batchmean") / x.shape[1]
        hard = F.nll_loss(student.flatten(0, 1), teacher.argmax(-1).flatten())
        loss = kd + 0.5 * hard
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == recipe.draft_steps - 1:
            agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean().item()
            log(f"draft step {step}: kd {kd.item():.3f} top-1 agreement {agree:.3f}")
    minutes = (time.time() - t0) / 60
    loss = heldout_loss(draft, heldout, recipe.seq_len)
    log(f"draft done in {minutes:.1f} min, held-out loss {loss:.3f}")
    return draft.eval(), {"train_minutes": round(minutes, 1), "heldout_loss": round(loss, 4)}


@torch.no_grad()
def kv_scales(
    model: Qwen3ForCausalLM, heldout: torch.Tensor, seq_len: int
) -> dict[str, torch.Tensor]:
    """Per-layer amax of K (after RoPE) and V over held-out text, divided by e4m3's max."""
    n = min(16, len(heldout) // seq_len)
    x = heldout[: n * seq_len].view(n, seq_len)
    cache = model(x, use_cache=True).past_key_values

    def scale(t: torch.Tensor) -> float:
        return (t.abs().max().float().clamp(min=1e-6) / FP8_E4M3_MAX).item()

    k = [scale(layer.keys) for layer in cache.layers]
    v = [scale(layer.values) for layer in cache.layers]
    return kv_scale_tensors(KVScaleTable(1, "fp8", k, v))


def save_model(model, tokenizer, scales: dict[str, torch.Tensor], folder: Path) -> None:
    # Settings measured for the draft this one replaces stay until they are measured again.
    tuned = tuned_speculation(folder)
    model.save_pretrained(folder, safe_serialization=True)
    if tuned:
        config = json.loads((folder / "config.json").read_text())
        config[SPECULATORS_CONFIG] = tuned
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(folder)
    # The generic class name loads with transformers 4.x (vLLM, SGLang) as well as 5.x.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        do_sample=False,
    ).save_pretrained(folder)
    weights_path = folder / "model.safetensors"
    weights = load_file(weights_path)
    weights.update(scales)
    save_file(weights, weights_path, metadata={"format": "pt"})


def heldout_samples(tokenizer, texts: list[str], recipe: Recipe) -> dict:
    rng = random.Random(recipe.seed + 4)
    prompts = []
    for text in rng.sample(texts, min(len(texts), recipe.num_heldout_prompts * 2)):
        lines = text.splitlines(keepends=True)
        if len(lines) < 20:
            continue
        start = rng.randrange(0, len(lines) - 12)
        prompt = "".join(lines[start : start + 8])
        if 40 <= len(tokenizer(prompt)["input_ids"]) <= 160:
            prompts.append(prompt)
        if len(prompts) == recipe.num_heldout_prompts:
            break
    return {"prompts": prompts, "texts": [t[:4000] for t in texts[:24]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--target-steps", type=int, default=Recipe.target_steps)
    parser.add_argument("--draft-steps", type=int, default=Recipe.draft_steps)
    parser.add_argument("--max-corpus-bytes", type=int, default=Recipe.max_corpus_bytes)
    parser.add_argument(
        "--stage",
        choices=("all", "draft"),
        default="all",
        help="draft: retrain only the draft, against the target and tokenizer already in --out",
    )
    args = parser.parse_args()
    recipe = Recipe(
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        max_corpus_bytes=args.max_corpus_bytes,
    )
    torch.manual_seed(recipe.seed)
    t_start = time.time()
    log(f"recipe: {asdict(recipe)}; torch threads {torch.get_num_threads()}")
    train_texts, heldout_texts = read_corpus(recipe)
    if args.stage == "all":
        tokenizer = train_tokenizer(train_texts, recipe)
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out / "target")
    train = encode_stream(tokenizer, train_texts)
    heldout = encode_stream(tokenizer, heldout_texts)
    log(f"tokens: {len(train) / 1e6:.2f}M train, {len(heldout) / 1e6:.2f}M held-out")
    if args.stage == "all":
        (args.out / "heldout.json").write_text(
            json.dumps(heldout_samples(tokenizer, heldout_texts, recipe), indent=1)
        )
        target, target_log = train_target(recipe, train, heldout, tokenizer.eos_token_id)
        scales = kv_scales(target, heldout, recipe.seq_len)
        save_model(target, tokenizer, scales, args.out / "target")
    else:
        target = Qwen3ForCausalLM.from_pretrained(args.out / "target").eval()
        target_log = json.loads((args.out / "train_log.json").read_text())["target"]
    draft, draft_log = train_draft(recipe, target, train, heldout, tokenizer.eos_token_id)
    save_model(draft, tokenizer, kv_scales(draft, heldout, recipe.seq_len), args.out / "draft")
    versions = {p: metadata.version(p) for p in ("torch", "transformers", "tokenizers", "grpcio")}
    report = {
        "recipe": asdict(recipe),
        "python": sys.version.split()[0],
        "corpus_packages": CORPUS_PACKAGES,
        "package_versions": versions,
        "train_tokens": len(train),
        "heldout_tokens": len(heldout),
        "target": target_log,
        "draft": draft_log,
        "stage": args.stage,
        "stage_minutes": round((time.time() - t_start) / 60, 1),
    }
    (args.out / "train_log.json").write_text(json.dumps(report, indent=1))
    log(f"done: {json.dumps(report)}")


if __name__ == "__main__":
    main()
