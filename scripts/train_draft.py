"""Distil a small draft for SmolLM2-135M-Instruct (the real target) on this machine.

One reproducible recipe (fixed seeds; config, package versions and timings logged to
``<out>/train_log.json``):

1. Chat prompts from documentation on the machine (``draft_prompts``); a held-out set,
   from source files no training prompt comes from, is saved as ``heldout.json``
   (``{"prompts": [user turn, ...]}``, what ``coordinator.launcher.held_out_prompts`` reads).
   Beside them, ``--chat-requests`` conversations over the categories people ask a chat
   model (``chat_requests``: composed from hand-written patterns, deduplicated, some
   two-turn with the target's first answer, some with a system prompt), made once and
   cached under ``--data-dir``; the teacher answers them first.
2. Teacher data (``draft_teacher``): the target's greedy and sampled answers, with its
   top-k next-token log-probs at every prompt and answer position, generated in batches
   (the target in bfloat16; how often its argmax is the float32 runtime's is logged)
   until the generation budget is spent; cached under ``--data-dir`` (git-ignored) and
   keyed by prompt, so a later run reuses every answer to a prompt it still asks.
3. Output head over a frequency-ranked vocabulary subset (FR-Spec): the ``--head-size``
   ids most frequent in the target's answers (then in the prompts, then by BPE rank).
4. Draft: Llama with the target's widths; the target's embedding (shared and frozen) and
   final norm, ``num_layers`` of its layers (the choice with the lowest initial validation
   loss among ``LAYER_CANDIDATES``), and a head initialised from the embedding rows of the
   subset.
   Loss: cross-entropy to the target's distribution renormalised over the subset (KL up
   to a constant) at every position (prompt positions weighted ``prompt_weight``), plus
   ``ce_weight`` x cross-entropy on the target's argmax at answer positions, in bfloat16
   autocast (float32 master weights). Training stops at the time budget; the checkpoint
   with the best validation top-1 agreement is kept.
5. Save: the draft's own tensors (no embedding) in ``draft.safetensors``; the folder is
   completed with the target's embedding and tokenizer by ``fetch_models.complete_draft``
   (also run by ``scripts/fetch_models.py``), then FP8 KV scales are calibrated.

Usage: ``python scripts/train_draft.py [--gen-minutes 40] [--train-minutes 55] [--num-layers 6]``.
``--init-from DIR`` trains a draft saved before further (its layers and head as they are) on
all the teacher data, the cached answers plus those this run adds, with a fresh warm-up and
cosine schedule to ``--lr``; ``train_log.json`` records the run it continues. With
``--rerank-head`` its head's ids are chosen afresh from this run's answers (the rows of the
ids it keeps stay as trained, a new id's row starts from its embedding row).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from chat_requests import Writer, build_chats
from draft_prompts import build_prompts
from draft_teacher import (
    Teacher,
    TeacherSequence,
    agreement_with_runtime,
    cached_answers,
    generate,
)
from fetch_models import DRAFT_DIR, MODEL_DIR, calibrate_kv_scales, complete_draft
from safetensors.torch import load_file, save_file
from torch import nn
from train_models import log, lr_at, run_facts
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdec.config import SPECULATORS_CONFIG, tuned_speculation
from specdec.runtime import ModelRunner
from specdec.runtime.loader import kv_scale_tensors

ROOT = Path(__file__).resolve().parent.parent
DRAFT_WEIGHTS = "draft.safetensors"
# Target layers copied into the draft's layers, in order, per draft depth.
LAYER_CANDIDATES = {
    2: ((0, 29), (0, 28), (1, 29), (0, 27), (0, 1), (0, 15), (28, 29)),
    3: ((0, 1, 28), (0, 14, 28), (0, 27, 28), (0, 28, 29), (0, 1, 29), (1, 28, 29), (0, 2, 28)),
    4: ((0, 1, 2, 28), (0, 1, 27, 28), (0, 1, 28, 29), (0, 1, 14, 28), (0, 2, 27, 28)),
    6: (
        (0, 1, 2, 14, 27, 28),
        (0, 1, 9, 18, 27, 28),
        (0, 1, 2, 3, 27, 28),
        (0, 1, 14, 27, 28, 29),
        (0, 1, 7, 14, 21, 28),
    ),
}


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    heldout_every: int = 20  # one source file in N (by path hash) is held out
    num_heldout_prompts: int = 32
    max_prompt_tokens: int = 112  # with the chat template's system turn
    # Chat conversations (``chat_requests``), beside the documentation prompts; a two-turn
    # one carries the target's first answer, hence the larger bound.
    chat_requests: int = 8000
    # The conversations' seeds, each its own set of ``chat_requests`` (0: the first chat
    # run's; 1: the second's; 1 and 2: the third's, which kept the second's answers; 1, 2
    # and 3, the first from both pattern sets: the fourth's).
    chat_seeds: tuple[int, ...] = (1, 2, 3)
    max_chat_tokens: int = 320
    chat_repeat: int = 2  # each written chat's answer this many times per epoch
    gen_batch: int = 128
    max_new_tokens: int = 96
    sampled_every: int = 4  # one answer in N is sampled, the others greedy
    temperature: float = 0.7  # for the sampled answers
    top_k: int = 32  # teacher log-probs kept per position
    gen_minutes: float = 40.0
    num_layers: int = 6
    head_size: int = 6144
    # With ``--init-from``: choose the head's ids afresh from this run's answers (rows of
    # the ids it keeps stay as trained) instead of keeping the continued draft's.
    rerank_head: bool = False
    num_val_sequences: int = 16
    batch_tokens: int = 4096
    lr: float = 6e-4  # peak; a continued draft (``--init-from``) warms up again to it
    prompt_weight: float = 0.3
    ce_weight: float = 0.5
    train_minutes: float = 55.0
    eval_every_seconds: float = 150.0


def encode_chat(tokenizer, prompt: str | list[dict[str, str]]) -> list[int]:
    """A user turn (or a whole conversation ending in one) through the chat template."""
    chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_prompts(tokenizer, prompts: list, max_tokens: int) -> list[list[int]]:
    """Each prompt through the chat template; the ones that fit in ``max_tokens``."""
    encoded = (encode_chat(tokenizer, prompt) for prompt in prompts)
    return [ids for ids in encoded if len(ids) <= max_tokens]


def teacher_writer(teacher: Teacher, tokenizer, seed: int) -> Writer:
    """``chat_requests``' writer: the target's replies to instructions, sampled at the
    temperature asked (greedy at 0)."""
    gen = torch.Generator().manual_seed(seed)

    def write(instructions: list[str], temperature: float, max_tokens: int) -> list[str]:
        prompts = [encode_chat(tokenizer, i) for i in instructions]
        sampled = [temperature > 0] * len(prompts)
        seqs = generate(teacher, prompts, sampled, max_tokens, max(temperature, 1e-3), 1, gen)
        return [
            tokenizer.decode(s.token_ids[s.prompt_len :], skip_special_tokens=True) for s in seqs
        ]

    return write


def chat_prompts(recipe: Recipe, teacher: Teacher, tokenizer, seed: int, path: Path) -> list:
    """The conversations of ``seed`` the target writes (``chat_requests``), made once and
    kept in ``path``, so the teacher's cached answers keep answering the prompts."""
    if path.is_file():
        return json.loads(path.read_text())
    t0 = time.time()
    chats = build_chats(teacher_writer(teacher, tokenizer, seed), seed, recipe.chat_requests,
                        batch=recipe.gen_batch)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chats, indent=0, ensure_ascii=False) + "\n")
    log(f"chat requests: {len(chats)} conversations in {(time.time() - t0) / 60:.1f} min")
    return chats


def teacher_data(
    recipe: Recipe, teacher: Teacher, prompts: list[list[int]], path: Path
) -> list[TeacherSequence]:
    """The target's answers to ``prompts`` in order, those not cached generated until
    ``gen_minutes`` is spent; prompts left unanswered are left out.

    Cached in ``path`` after every batch, keyed by prompt: a later run reuses every answer
    whose prompt it still asks (the prompts follow the sources on this machine) and
    generates the rest with a fresh budget."""
    cache = cached_answers(path)
    missing = [i for i, p in enumerate(prompts) if tuple(p) not in cache]
    log(f"teacher data {path}: {len(prompts) - len(missing)} of {len(prompts)} answers cached")
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(recipe.seed + 1 + len(cache))
    t0 = time.time()
    budget = recipe.gen_minutes * 60
    batch_seconds = 0.0
    for start in range(0, len(missing), recipe.gen_batch):
        if time.time() - t0 + batch_seconds > budget:
            break
        t_batch = time.time()
        batch = missing[start : start + recipe.gen_batch]
        every = recipe.sampled_every
        sampled = [i % every == every - 1 for i in batch]
        seqs = generate(
            teacher,
            [prompts[i] for i in batch],
            sampled,
            recipe.max_new_tokens,
            recipe.temperature,
            recipe.top_k,
            gen,
        )
        cache.update((tuple(s.token_ids[: s.prompt_len]), s) for s in seqs)
        partial = path.with_suffix(".partial")
        torch.save(list(cache.values()), partial)
        partial.replace(path)  # a run stopped mid-save leaves the last whole cache
        batch_seconds = time.time() - t_batch
        log(f"teacher: {len(cache)} answers cached ({batch_seconds:.0f} s this batch)")
    return [cache[tuple(p)] for p in prompts if tuple(p) in cache]


def head_token_ids(
    data: list[TeacherSequence],
    size: int,
    special: list[int],
    keep: list[int] = (),
    among: set[int] | None = None,
) -> list[int]:
    """The ``size`` ids most frequent in the answers, then in the prompts, then by BPE rank
    (a lower id is an earlier merge), always with ``keep`` and the special tokens, chosen
    ``among`` those ids if given; sorted ascending."""
    answers = Counter(t for s in data for t in s.token_ids[s.prompt_len :])
    prompts = Counter(t for s in data for t in s.token_ids[: s.prompt_len])
    seen = set(answers) | set(prompts)
    ranked = sorted(
        seen & among if among is not None else seen, key=lambda t: (-answers[t], -prompts[t], t)
    )
    chosen = list(dict.fromkeys([*keep, *special, *ranked]))[:size]
    taken = set(chosen)
    rest = (t for t in range(size * 8) if t not in taken)
    while len(chosen) < size:
        chosen.append(next(rest))
    return sorted(chosen)


def draft_config(target: dict, head_ids: list[int], num_layers: int) -> dict:
    """The draft's ``config.json``: the target's, fewer layers, an untied subset head."""
    config = dict(target)
    config.update(
        num_hidden_layers=num_layers,
        tie_word_embeddings=False,
        head_token_ids=head_ids,
        torch_dtype="bfloat16",  # its own weights as stored (save_draft); served so
    )
    return config


def build_draft(config: dict, target: dict[str, torch.Tensor], layers: tuple[int, ...]):
    """An HF Llama body plus a subset head, initialised from the target."""
    hf = LlamaConfig(**{k: v for k, v in config.items() if k != "head_token_ids"})
    model = LlamaForCausalLM(hf)
    ids = torch.tensor(config["head_token_ids"])
    model.lm_head = nn.Linear(hf.hidden_size, len(ids), bias=False)
    state = {"lm_head.weight": target["model.embed_tokens.weight"][ids].clone()}
    for name, tensor in target.items():
        if not name.startswith("model.layers."):
            state[name] = tensor.clone()
            continue
        layer, _, rest = name.removeprefix("model.layers.").partition(".")
        for i, src in enumerate(layers):
            if int(layer) == src and not rest.endswith("_scale"):
                state[f"model.layers.{i}.{rest}"] = tensor.clone()
    model.load_state_dict(state, strict=True)
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def resize_head(model, config: dict, target: dict[str, torch.Tensor], head_ids: list[int]):
    """A continued draft's head over ``head_ids``: the rows of the ids it had kept, a new
    id's row from the target's embedding (as a new head starts)."""
    old = {t: row for row, t in enumerate(config["head_token_ids"])}
    weight = model.lm_head.weight.data
    rows = [
        weight[old[t]] if t in old else target["model.embed_tokens.weight"][t] for t in head_ids
    ]
    model.lm_head = nn.Linear(weight.shape[1], len(head_ids), bias=False)
    model.lm_head.weight.data = torch.stack(rows).float()
    config["head_token_ids"] = head_ids


def load_draft(path: Path, target: dict[str, torch.Tensor]):
    """``(config, model, layers, log)`` of a draft this script saved (``--init-from``), in
    float32, to train on with its head and layers as they are."""
    config = json.loads((path / "config.json").read_text())
    previous = json.loads((path / "train_log.json").read_text())
    layers = tuple(previous["layers_from_target"])
    model = build_draft(config, target, layers)
    own = load_file(path / DRAFT_WEIGHTS)
    own = {k: v.float() for k, v in own.items() if not k.endswith(("k_scale", "v_scale"))}
    missing, unexpected = model.load_state_dict(own, strict=False)
    if missing != ["model.embed_tokens.weight"] or unexpected:
        raise SystemExit(f"{path}: not a draft of this recipe ({missing=}, {unexpected=})")
    return config, model, layers, previous


class Batches:
    """Right-padded batches of about ``batch_tokens`` tokens; teacher targets mapped to
    positions in the head (``to_head``: vocabulary id -> head row, -1 if not covered)."""

    def __init__(self, data: list[TeacherSequence], to_head: torch.Tensor, recipe: Recipe):
        self.data, self.to_head, self.recipe = data, to_head, recipe

    def make(self, seqs: list[TeacherSequence]) -> dict[str, torch.Tensor]:
        length = max(len(s.token_ids) for s in seqs)
        x = torch.zeros(len(seqs), length, dtype=torch.int64)
        rows, answer, top_ids, top_lp, labels = [], [], [], [], []
        for b, s in enumerate(seqs):
            n = len(s.token_ids)
            x[b, :n] = torch.tensor(s.token_ids)
            rows.append(torch.arange(n - 1) + b * length)
            is_answer = torch.zeros(n - 1, dtype=torch.bool)
            is_answer[s.prompt_len - 1 :] = True
            answer.append(is_answer)
            top_ids.append(s.top_ids.long())
            top_lp.append(s.top_logprobs.float())
            # Hard targets: the target's argmax (what greedy verification accepts), on
            # answer positions only; in sampled answers it is not always the next token.
            label = s.top_ids[:, 0].long().clone()
            label[: s.prompt_len - 1] = -1
            labels.append(label)
        top = self.to_head[torch.cat(top_ids)]
        probs = torch.cat(top_lp).exp() * (top >= 0)
        labels = torch.cat(labels)
        covered = labels >= 0
        labels[covered] = self.to_head[labels[covered]]
        return {
            "x": x,
            "rows": torch.cat(rows),
            "answer": torch.cat(answer),
            "top": top.clamp(min=0),
            # Renormalised over the covered ids; rows with no covered mass drop out below.
            "probs": probs / probs.sum(-1, keepdim=True).clamp(min=1e-9),
            "labels": labels,  # head row of the target's argmax, or -1 (prompt, uncovered)
            "teacher_top1": torch.cat(top_ids)[:, 0],
        }

    def epoch(self, rng: random.Random, pool: int = 32):
        """Batches in random order; each is cut from a random pool of sequences sorted by
        length, so a batch pads little (its padding is computed and thrown away)."""
        order = list(self.data)
        rng.shuffle(order)
        batches: list[list[TeacherSequence]] = []
        pool_tokens = pool * self.recipe.batch_tokens
        start = 0
        while start < len(order):
            end, tokens = start, 0
            while end < len(order) and tokens < pool_tokens:
                tokens += len(order[end].token_ids)
                end += 1
            batch: list[TeacherSequence] = []
            batch_tokens = 0
            for s in sorted(order[start:end], key=lambda t: len(t.token_ids)):
                batch.append(s)
                batch_tokens += len(s.token_ids)
                if batch_tokens >= self.recipe.batch_tokens:
                    batches.append(batch)
                    batch, batch_tokens = [], 0
            if batch:
                batches.append(batch)
            start = end
        rng.shuffle(batches)
        for batch in batches:
            yield self.make(batch)


def losses(model, batch: dict[str, torch.Tensor], recipe: Recipe) -> dict[str, torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(batch["x"]).last_hidden_state.flatten(0, 1)[batch["rows"]]
        logits = model.lm_head(hidden)
    logq = F.log_softmax(logits.float(), dim=-1)
    probs = batch["probs"]
    has_mass = probs.sum(-1) > 0
    soft = -(probs * logq.gather(1, batch["top"])).sum(-1)
    answer = batch["answer"]
    weights = torch.where(answer, 1.0, recipe.prompt_weight) * has_mass
    soft_loss = (soft * weights).sum() / weights.sum()
    labels = batch["labels"]
    hard_loss = F.nll_loss(logq[labels >= 0], labels[labels >= 0])
    return {
        "loss": soft_loss + recipe.ce_weight * hard_loss,
        "soft": soft_loss,
        "hard": hard_loss,
        "argmax": logq.argmax(-1),
    }


@torch.no_grad()
def validate(model, batches: list[dict], head_ids: torch.Tensor, recipe: Recipe) -> dict:
    """Soft loss and top-1 agreement with the target at answer positions."""
    model.eval()
    soft, agree, count = 0.0, 0, 0
    for batch in batches:
        out = losses(model, batch, recipe)
        soft += out["soft"].item()
        answer = batch["answer"]
        agree += int((head_ids[out["argmax"][answer]] == batch["teacher_top1"][answer]).sum())
        count += int(answer.sum())
    model.train()
    return {"soft": round(soft / len(batches), 4), "agreement": round(agree / count, 4)}


def pick_layers(config, target, val_batches, head_ids, recipe) -> tuple[tuple[int, ...], dict]:
    scores = {}
    candidates = LAYER_CANDIDATES[recipe.num_layers]
    for layers in candidates:
        model = build_draft(config, target, layers)
        scores[str(layers)] = validate(model, val_batches, head_ids, recipe)
        log(f"layers {layers}: initial validation {scores[str(layers)]}")
    best = min(candidates, key=lambda layers: scores[str(layers)]["soft"])
    return best, scores


def train(model, train_data: Batches, val_batches, head_ids, recipe: Recipe) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    rng = random.Random(recipe.seed + 2)
    budget = recipe.train_minutes * 60
    t0 = last_eval = time.time()
    best = {"step": 0, **validate(model, val_batches, head_ids, recipe)}
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    history, step, epoch, tokens = [best], 0, 0, 0
    log(f"train: initial validation {best}")
    while time.time() - t0 < budget:
        for batch in train_data.epoch(rng):
            progress = min(1.0, (time.time() - t0) / budget)
            for group in opt.param_groups:
                group["lr"] = lr_at(int(1000 * progress), 1000, recipe.lr)
            out = losses(model, batch, recipe)
            out["loss"].backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            tokens += batch["x"].numel()
            if step % 10 == 0:
                log(
                    f"step {step} (epoch {epoch}): soft {out['soft'].item():.3f} "
                    f"hard {out['hard'].item():.3f} ({tokens / (time.time() - t0):.0f} tok/s)"
                )
            done = time.time() - t0 >= budget
            if done or time.time() - last_eval >= recipe.eval_every_seconds:
                last_eval = time.time()
                result = {"step": step, **validate(model, val_batches, head_ids, recipe)}
                history.append(result)
                log(f"validation {result}")
                if result["agreement"] > best["agreement"]:
                    best = result
                    best_state = {k: v.clone() for k, v in model.state_dict().items()}
            if done:
                break
        epoch += 1
    model.load_state_dict(best_state)
    minutes = (time.time() - t0) / 60
    return {"steps": step, "epochs": epoch, "minutes": round(minutes, 1), "best": best,
            "history": history}  # fmt: skip


def save_draft(model, config: dict, out: Path) -> None:
    """``config.json`` (the head ids and the tuned settings each on one line),
    ``generation_config.json`` and the draft's own tensors (everything but the shared
    embedding, bfloat16) in ``DRAFT_WEIGHTS``."""
    out.mkdir(parents=True, exist_ok=True)
    # Settings measured for the draft this one replaces stay until they are measured again.
    tuned = tuned_speculation(out)
    config = {**config, **({SPECULATORS_CONFIG: tuned} if tuned else {})}
    one_line = [key for key in ("head_token_ids", SPECULATORS_CONFIG) if key in config]
    text = json.dumps({**config, **{key: f"@{key}@" for key in one_line}}, indent=2)
    for key in one_line:
        text = text.replace(f'"@{key}@"', json.dumps(config[key]))
    (out / "config.json").write_text(text + "\n")
    gen = json.loads((MODEL_DIR / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    # Stored in bfloat16 so six layers fit the 50 MB committed; the runtime widens them
    # to the serving dtype on load (the evaluation measures the stored weights).
    state = model.state_dict()
    weights = {
        k: v.to(torch.bfloat16).contiguous()
        for k, v in state.items()
        if k != "model.embed_tokens.weight"
    }
    save_file(weights, out / DRAFT_WEIGHTS, metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DRAFT_DIR)
    parser.add_argument("--data-dir", type=Path, default=ROOT / "runs" / "draft_data")
    parser.add_argument("--gen-minutes", type=float, default=Recipe.gen_minutes)
    parser.add_argument("--train-minutes", type=float, default=Recipe.train_minutes)
    parser.add_argument("--gen-batch", type=int, default=Recipe.gen_batch)
    parser.add_argument("--num-layers", type=int, choices=sorted(LAYER_CANDIDATES),
                        default=Recipe.num_layers)  # fmt: skip
    parser.add_argument("--head-size", type=int, default=Recipe.head_size,
                        help="ids the head scores; with --init-from, a larger size grows the "
                        "draft's head by the answers' most frequent ids it lacks, a smaller "
                        "one keeps its most frequent")  # fmt: skip
    parser.add_argument("--rerank-head", action="store_true",
                        help="with --init-from, the head's --head-size ids most frequent in "
                        "this run's answers (rows of the ids kept stay trained)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=Recipe.lr)
    parser.add_argument("--init-from", type=Path, default=None,
                        help="continue training the draft saved in this folder (its layers and "
                        "head) on all the teacher data, instead of starting from the target's "
                        "layers")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--chat-requests",
        type=int,
        default=Recipe.chat_requests,
        help="chat conversations composed from hand-written patterns",
    )
    parser.add_argument("--chat-seeds", default=",".join(map(str, Recipe.chat_seeds)),
                        help="the conversations' seeds, comma-separated")  # fmt: skip
    parser.add_argument("--teacher-only", action="store_true",
                        help="make (or extend) the cached teacher data, then stop")  # fmt: skip
    args = parser.parse_args()
    recipe = Recipe(
        gen_minutes=args.gen_minutes,
        train_minutes=args.train_minutes,
        gen_batch=args.gen_batch,
        num_layers=args.num_layers,
        head_size=args.head_size,
        rerank_head=args.rerank_head,
        lr=args.lr,
        chat_requests=args.chat_requests,
        chat_seeds=tuple(int(seed) for seed in args.chat_seeds.split(",")),
    )
    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.seed)
    t_start = time.time()
    timings: dict[str, float] = {}
    log(f"recipe: {asdict(recipe)}")
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
    train_prompts, heldout = build_prompts(
        recipe.seed, recipe.heldout_every, recipe.num_heldout_prompts
    )
    teacher = Teacher(MODEL_DIR)
    chats = [
        chat
        for seed in recipe.chat_seeds
        for chat in chat_prompts(
            recipe, teacher, tokenizer, seed, args.data_dir / f"chat_requests_seed{seed}.json"
        )
    ]
    docs = encode_prompts(tokenizer, train_prompts, recipe.max_prompt_tokens)
    # A request two seeds both composed is asked once.
    encoded = encode_prompts(tokenizer, chats, recipe.max_chat_tokens)
    written = list({tuple(ids): ids for ids in encoded}.values())
    # The written chats first: the teacher answers them before the documentation prompts
    # left, and the validation answers (the first ``num_val_sequences``) are chats.
    prompts = written + docs
    timings["prompts_minutes"] = round((time.time() - t_start) / 60, 2)
    log(
        f"prompts: {len(docs)} documentation and {len(written)} written chats that fit, "
        f"{len(heldout)} held out"
    )

    t0 = time.time()
    data = teacher_data(recipe, teacher, prompts, args.data_dir / "teacher.pt")
    timings["teacher_minutes"] = round((time.time() - t0) / 60, 2)
    if args.teacher_only:
        log(f"teacher data kept in {args.data_dir}; stopping before training (--teacher-only)")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "heldout.json").write_text(json.dumps({"prompts": heldout}, indent=1) + "\n")
    val_data, train_seqs = data[: recipe.num_val_sequences], data[recipe.num_val_sequences :]
    chat_set = {tuple(ids) for ids in written}
    train_chats = [s for s in train_seqs if tuple(s.token_ids[: s.prompt_len]) in chat_set]
    train_seqs += train_chats * (recipe.chat_repeat - 1)
    log(f"{len(train_chats)} written chats among the answers, {recipe.chat_repeat}x per epoch")
    max_len = recipe.max_chat_tokens + recipe.max_new_tokens
    runner = ModelRunner.from_pretrained(MODEL_DIR, max_model_len=max_len, num_pages=64)
    teacher_agreement = agreement_with_runtime(teacher, runner, val_data)
    del runner, teacher
    log(f"the bfloat16 teacher's argmax is the float32 runtime's at {teacher_agreement:.4f}")

    target = load_file(MODEL_DIR / "model.safetensors")
    previous = None
    special = sorted({0, 1, 2, *tokenizer.all_special_ids})
    if args.init_from:
        config, model, layers, previous = load_draft(args.init_from, target)
        head_ids = config["head_token_ids"]
        if recipe.rerank_head:
            head_ids = head_token_ids(train_seqs, recipe.head_size, special)
        elif recipe.head_size > len(head_ids):  # grown by the most frequent ids it lacks
            head_ids = head_token_ids(train_seqs, recipe.head_size, special, keep=head_ids)
        elif recipe.head_size < len(head_ids):  # trimmed to its most frequent ids
            head_ids = head_token_ids(train_seqs, recipe.head_size, special, among={*head_ids})
        if head_ids != config["head_token_ids"]:
            kept = len(set(head_ids) & set(config["head_token_ids"]))
            resize_head(model, config, target, head_ids)
            log(f"head now {len(head_ids)} ids, {kept} of them kept")
        log(f"continuing {args.init_from}: layers {layers}, best {previous['train']['best']}")
    else:
        target_config = json.loads((MODEL_DIR / "config.json").read_text())
        head_ids = head_token_ids(train_seqs, recipe.head_size, special)
        config = draft_config(target_config, head_ids, recipe.num_layers)
    head = torch.tensor(head_ids)
    to_head = torch.full((config["vocab_size"],), -1, dtype=torch.int64)
    to_head[head] = torch.arange(len(head))
    answers = [t for s in data for t in s.token_ids[s.prompt_len :]]
    coverage = sum(int(to_head[t] >= 0) for t in answers) / len(answers)
    log(f"head covers {coverage:.4f} of the target's answer tokens")

    val_batches = list(Batches(val_data, to_head, recipe).epoch(random.Random(0)))
    layer_scores = None
    if previous is None:
        t0 = time.time()
        layers, layer_scores = pick_layers(config, target, val_batches, head, recipe)
        timings["layer_pick_minutes"] = round((time.time() - t0) / 60, 2)
        log(f"layers {layers} chosen")
        model = build_draft(config, target, layers)
    del target
    train_log = train(model, Batches(train_seqs, to_head, recipe), val_batches, head, recipe)
    timings["train_minutes"] = train_log["minutes"]

    t0 = time.time()
    save_draft(model, config, args.out)
    complete_draft(args.out, MODEL_DIR)
    scales = kv_scale_tensors(calibrate_kv_scales(args.out))
    weights = load_file(args.out / DRAFT_WEIGHTS)
    save_file({**weights, **scales}, args.out / DRAFT_WEIGHTS, metadata={"format": "pt"})
    complete_draft(args.out, MODEL_DIR)  # again: the index now names the scales too
    timings["save_minutes"] = round((time.time() - t0) / 60, 2)
    timings["total_minutes"] = round((time.time() - t_start) / 60, 1)
    packages = ("torch", "transformers", "tokenizers", "safetensors")
    continued_from = previous and {
        "dir": str(args.init_from),
        "recipe": previous["recipe"],
        "num_teacher_sequences": previous["num_teacher_sequences"],
        "train": {k: previous["train"][k] for k in ("steps", "epochs", "minutes", "best")},
        "earlier": previous.get("continued_from"),
    }
    report = {
        **run_facts(recipe, packages),
        "target": str(MODEL_DIR.relative_to(ROOT)),
        "num_train_prompts_available": len(prompts),
        "num_teacher_sequences": len(data),
        "num_teacher_tokens": sum(len(s.token_ids) for s in data),
        "num_teacher_answer_tokens": len(answers),
        "num_sampled_answers": sum(s.sampled for s in data),
        "teacher_argmax_agreement_with_float32": round(teacher_agreement, 4),
        "head_coverage_of_answer_tokens": round(coverage, 4),
        "layers_from_target": list(layers),
        "layer_candidates_initial_validation": layer_scores,
        "continued_from": continued_from,
        "train": train_log,
        "timings": timings,
    }
    (args.out / "train_log.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"done in {timings['total_minutes']} min: best {train_log['best']}")


if __name__ == "__main__":
    main()
