"""Train the real target's feature-reading draft (EAGLE-style) on this machine.

One reproducible recipe (fixed seeds; config, package versions and timings logged to
``<out>/train_log.json``):

1. Teacher data: ``train_draft.py``'s cache (``--data-dir``/teacher.pt): conversations
   composed from hand-written patterns (``chat_requests``; ``--chat-seeds`` picks which)
   and documentation prompts, the target's greedy and sampled answers, its top-k next-token
   log-probs at every position (``train_draft.py --teacher-only``).
2. Features: the target's final hidden state at every position of every sequence, one
   causal bfloat16 pass (``draft_teacher.Teacher``), cached beside it (``features.pt``).
3. Draft (``feature_draft``): one layer initialised from the target's last, ``fc`` the sum
   of the normalised token embedding and feature, a frequency-ranked head
   (``train_draft.head_token_ids``) initialised from the embedding rows.
4. Loss, unrolled over ``depth`` steps as a chain of proposals computes them: depth 1
   reads the target's features; depth d reads the draft's own depth d - 1 output one
   position before, and attends to the positions before that the target fed and to its
   own earlier depths. At each depth, cross-entropy to the target's distribution of the
   next token renormalised over the head (KL up to a constant), weighted ``decay``^(d - 1);
   answer positions (prompt positions at depth 1 too, weighted ``prompt_weight``).
   bfloat16 autocast, float32 master weights, AdamW, warm-up then cosine to 10 %.
5. Validation: chain acceptance replayed over held-out greedy teacher answers (one
   sequence in ``val_every``, never trained on): each round proposes ``k`` tokens from the
   committed prefix, accepted while they equal the answer's; the best checkpoint is kept.
   The general chat evaluation set is never used here.
6. Save: ``feature_draft.save_folder`` (the draft's own tensors in bfloat16; the target's
   embedding and tokenizer completed beside them).

Usage: ``python scripts/train_feature_draft.py [--train-minutes 60] [--init-from DIR]``; the
draft goes to the git-ignored ``runs/feature_draft/`` (``--out``): the stack serves the
six-layer draft of ``train_draft.py``, which measured faster (``models/README.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from draft_teacher import Teacher, TeacherSequence, causal_mask
from feature_draft import initial_weights, save_folder
from fetch_models import MODEL_DIR
from safetensors.torch import load_file
from torch import nn
from train_draft import encode_chat, head_token_ids
from train_models import log, run_facts
from transformers import AutoTokenizer

from specdec.config import tuned_speculation

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    head_size: int = 6144
    depth: int = 3  # unrolled proposal steps per position
    decay: float = 0.85  # weight of depth d: decay ** (d - 1)
    prompt_weight: float = 0.3
    batch_tokens: int = 4096
    lr: float = 1e-3
    train_minutes: float = 60.0
    val_every: int = 50  # one teacher sequence in N is held out
    # The written conversations (closest to what users ask) come this many times per epoch
    # where documentation answers share the teacher data.
    chat_repeat: int = 3
    num_val_sequences: int = 96
    k: int = 5
    eval_every_seconds: float = 300.0


class FeatureDraft(nn.Module):
    """The draft as training sees it: ``feature_draft``'s tensors (their folder names in
    ``weights``), a forward over whole sequences unrolled over depths."""

    def __init__(self, weights: dict[str, torch.Tensor], embedding: torch.Tensor, config: dict):
        super().__init__()
        if any("q_norm" in name for name in weights):
            raise ValueError("the training forward runs Llama layers (no q/k norm) only")
        self.names = list(weights)
        self.params = nn.ParameterList(nn.Parameter(t.float().clone()) for t in weights.values())
        self.register_buffer("embedding", embedding.float(), persistent=False)
        self.num_heads = config["num_attention_heads"]
        self.num_kv = config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.num_heads
        self.eps = config["rms_norm_eps"]
        theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
        half = self.head_dim // 2
        self.inv_freq = 1.0 / float(theta) ** (torch.arange(half).float() / half)

    def w(self, name: str) -> torch.Tensor:
        return self.params[self.names.index(name)]

    def folder_weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in zip(self.names, self.params, strict=True)}

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.rms_norm(x.float(), x.shape[-1:], self.w(name).float(), self.eps).to(x.dtype)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None, :, None].float() * self.inv_freq
        cos, sin = angles.cos(), angles.sin()
        x1, x2 = x.float().chunk(2, -1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def depths(self, token_ids: torch.Tensor, features: torch.Tensor, depth: int):
        """``token_ids`` ``[B, L]`` (token p at position p), ``features`` ``[B, L, H]``
        (what token p reads: the target's feature of position p - 1). Per depth d, the
        draft's output ``[B, L, H]`` at each position p as a chain computes it when
        position p - d + 1 was the last the target fed."""
        b, length = token_ids.shape
        positions = torch.arange(length).expand(b, length)
        embedded = self.norm(F.embedding(token_ids, self.embedding), "model.embed_norm.weight")
        i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
        keys, values, outs = [], [], []
        read = features
        p = "model.layers.0."
        for d in range(1, depth + 1):
            joined = torch.cat([embedded, self.norm(read, "model.feature_norm.weight")], -1)
            x = F.linear(joined, self.w("model.fc.weight"))
            h = self.norm(x, p + "input_layernorm.weight")
            q = F.linear(h, self.w(p + "self_attn.q_proj.weight"))
            k = F.linear(h, self.w(p + "self_attn.k_proj.weight"))
            v = F.linear(h, self.w(p + "self_attn.v_proj.weight"))
            q = self.rope(q.view(b, length, self.num_heads, -1).transpose(1, 2), positions)
            keys.append(self.rope(k.view(b, length, self.num_kv, -1).transpose(1, 2), positions))
            values.append(v.view(b, length, self.num_kv, -1).transpose(1, 2))
            # Depth d at p sees the target-fed positions up to p - d + 1 and depth m at
            # p - d + m (m = 2 .. d): the chain's own earlier proposals.
            mask = torch.cat([j <= i - d + 1] + [j == i - d + m for m in range(2, d + 1)], 1)
            out = F.scaled_dot_product_attention(
                q, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=mask, enable_gqa=True
            )
            x = x + F.linear(out.transpose(1, 2).reshape(b, length, -1),
                             self.w(p + "self_attn.o_proj.weight"))  # fmt: skip
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate = F.linear(h, self.w(p + "mlp.gate_proj.weight"))
            up = F.linear(h, self.w(p + "mlp.up_proj.weight"))
            x = x + F.linear(F.silu(gate) * up, self.w(p + "mlp.down_proj.weight"))
            out = self.norm(x, "model.norm.weight")
            outs.append(out)
            read = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)
        return outs

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.w("lm_head.weight"))


def reads(features: torch.Tensor) -> torch.Tensor:
    """A sequence's target features ``[L, H]`` (position p's at row p) as its tokens read
    them: token p reads position p - 1's, token 0 zeros."""
    return torch.cat([torch.zeros_like(features[:1]), features[:-1]])


@torch.inference_mode()
def target_features(teacher: Teacher, data: list[TeacherSequence], batch: int = 32) -> list:
    """The teacher's final hidden state (bfloat16) at every position of every sequence."""
    order = sorted(range(len(data)), key=lambda n: len(data[n].token_ids))
    out: list[torch.Tensor | None] = [None] * len(data)
    t0 = time.time()
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        lengths = torch.tensor([len(data[n].token_ids) for n in rows])
        width = int(lengths.max())
        ids = torch.full((len(rows), width), teacher.eos, dtype=torch.int64)
        for r, n in enumerate(rows):
            ids[r, : lengths[r]] = torch.tensor(data[n].token_ids)
        positions = torch.arange(width).expand(len(rows), width)
        cache = teacher.new_cache(len(rows), width)
        hidden = teacher.forward(ids, positions, cache, causal_mask(lengths, width))
        for r, n in enumerate(rows):
            out[n] = hidden[r, : lengths[r]].clone()
        if start // batch % 50 == 0:
            log(f"features: {start + len(rows)} of {len(data)} ({time.time() - t0:.0f} s)")
    return out


def cached_features(path: Path, data: list[TeacherSequence]) -> list[torch.Tensor]:
    """``target_features``, cached in ``path`` with the prompts they belong to."""
    keys = [tuple(s.token_ids) for s in data]
    if path.is_file():
        cached = torch.load(path, weights_only=False)
        if cached.get("keys") == keys:
            return cached["features"]
        log(f"{path} holds features of other sequences: computing them again")
    features = target_features(Teacher(MODEL_DIR), data)
    partial = path.with_suffix(".partial")
    torch.save({"keys": keys, "features": features}, partial)
    partial.replace(path)
    return features


def make_batch(seqs, feats, to_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """Right-padded tensors; per position p the target's distribution of token p + 1 mapped
    to head rows (``valid`` where some of its mass is covered)."""
    length = max(len(s.token_ids) for s in seqs)
    b, hidden = len(seqs), feats[0].shape[1]
    top_k = seqs[0].top_ids.shape[1]
    out = {
        "ids": torch.zeros(b, length, dtype=torch.int64),
        "features": torch.zeros(b, length, hidden, dtype=torch.bfloat16),
        "top": torch.zeros(b, length, top_k, dtype=torch.int64),
        "probs": torch.zeros(b, length, top_k),
        "valid": torch.zeros(b, length, dtype=torch.bool),
        "answer": torch.zeros(b, length, dtype=torch.bool),
    }
    for r, (s, f) in enumerate(zip(seqs, feats, strict=True)):
        n = len(s.token_ids)
        out["ids"][r, :n] = torch.tensor(s.token_ids)
        out["features"][r, :n] = reads(f)
        top = to_head[s.top_ids.long()]  # row p: the distribution after token p
        probs = s.top_logprobs.float().exp() * (top >= 0)
        out["top"][r, : n - 1] = top.clamp(min=0)
        out["probs"][r, : n - 1] = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
        out["valid"][r, : n - 1] = probs.sum(-1) > 0
        out["answer"][r, s.prompt_len - 1 : n - 1] = True
    return out


def losses(model: FeatureDraft, batch: dict, recipe: Recipe) -> tuple[torch.Tensor, list]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = model.depths(batch["ids"], batch["features"], recipe.depth)
    length = batch["ids"].shape[1]
    total, stats = 0.0, []
    for d, out in enumerate(outs, 1):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logq = F.log_softmax(model.logits(out).float(), -1)
        soft = -(batch["probs"] * logq.gather(-1, batch["top"])).sum(-1)
        reached = batch["valid"] & (torch.arange(length) >= d - 1)[None]
        weight = torch.where(batch["answer"], 1.0, recipe.prompt_weight if d == 1 else 0.0)
        weight = weight * reached
        loss = (soft * weight).sum() / weight.sum()
        counted = reached & batch["answer"]
        agree = ((logq.argmax(-1) == batch["top"][..., 0]) & counted).sum() / counted.sum()
        total = total + loss * recipe.decay ** (d - 1)
        stats.append((round(loss.item(), 3), round(agree.item(), 3)))
    return total, stats


@torch.no_grad()
def chain_acceptance(model, seqs, feats, head_ids: torch.Tensor, k: int) -> float:
    """Mean tokens per verify (accepted + 1) replaying greedy chains of ``k`` over each
    answer: a round from committed prefix [0, c] proposes while it equals the answer."""
    total = rounds = 0
    for s, f in zip(seqs, feats, strict=True):
        ids = torch.tensor(s.token_ids)[None]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = model.depths(ids, reads(f)[None], k)
            picks = [head_ids[model.logits(out[0]).float().argmax(-1)] for out in outs]
        tokens, c = s.token_ids, s.prompt_len  # the first answer token came from the prefill
        while c < len(tokens) - 1:
            accepted = 0
            for d in range(1, k + 1):
                # Depth d of the round at c runs at position c + d - 1 and proposes c + d.
                if c + d < len(tokens) and int(picks[d - 1][c + d - 1]) == tokens[c + d]:
                    accepted += 1
                else:
                    break
            rounds += 1
            total += accepted + 1
            c += accepted + 1
    return total / max(rounds, 1)


def batches(data: list[int], lengths: list[int], batch_tokens: int, rng: random.Random):
    """Sequence indices in batches of about ``batch_tokens``, similar lengths together."""
    order = sorted(data, key=lambda n: (lengths[n] // 16, rng.random()))
    out, batch, tokens = [], [], 0
    for n in order:
        batch.append(n)
        tokens += lengths[n]
        if tokens >= batch_tokens:
            out.append(batch)
            batch, tokens = [], 0
    if batch:
        out.append(batch)
    rng.shuffle(out)
    return out


def train(model, data, feats, train_ids, val_ids, to_head, head_ids, recipe) -> dict:
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    rng = random.Random(recipe.seed)
    lengths = [len(s.token_ids) for s in data]
    val = ([data[n] for n in val_ids], [feats[n] for n in val_ids])
    budget = recipe.train_minutes * 60
    t0 = last_eval = time.time()
    best = {"step": 0, "acceptance": round(chain_acceptance(model, *val, head_ids, recipe.k), 4)}
    best_state = model.folder_weights()
    history, step, epoch = [best], 0, 0
    log(f"train: initial validation {best}")
    while time.time() - t0 < budget:
        for rows in batches(train_ids, lengths, recipe.batch_tokens, rng):
            progress = (time.time() - t0) / budget
            warm = min(1.0, (step + 1) / 50)
            lr = recipe.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))
            for group in opt.param_groups:
                group["lr"] = lr
            batch = make_batch([data[n] for n in rows], [feats[n] for n in rows], to_head)
            loss, stats = losses(model, batch, recipe)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 20 == 0:
                log(f"step {step} (epoch {epoch}) lr {lr:.2e}: (loss, agreement) per depth {stats}")
            done = time.time() - t0 >= budget
            if done or time.time() - last_eval >= recipe.eval_every_seconds:
                last_eval = time.time()
                acceptance = chain_acceptance(model, *val, head_ids, recipe.k)
                result = {"step": step, "acceptance": round(acceptance, 4)}
                history.append(result)
                log(f"validation {result}")
                if result["acceptance"] > best["acceptance"]:
                    best, best_state = result, model.folder_weights()
            if done:
                break
        epoch += 1
    minutes = round((time.time() - t0) / 60, 1)
    return {"steps": step, "epochs": epoch, "minutes": minutes, "best": best,
            "history": history, "weights": best_state}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "feature_draft")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "runs" / "draft_data")
    parser.add_argument("--train-minutes", type=float, default=Recipe.train_minutes)
    parser.add_argument("--depth", type=int, default=Recipe.depth)
    parser.add_argument("--lr", type=float, default=Recipe.lr)
    parser.add_argument("--init-from", type=Path, default=None,
                        help="continue a feature draft saved in this folder")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    recipe = Recipe(train_minutes=args.train_minutes, depth=args.depth, lr=args.lr)
    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.seed)
    t_start = time.time()
    log(f"recipe: {asdict(recipe)}")
    data: list[TeacherSequence] = torch.load(args.data_dir / "teacher.pt", weights_only=False)
    feats = cached_features(args.data_dir / "features.pt", data)
    features_minutes = round((time.time() - t_start) / 60, 1)
    greedy = [n for n, s in enumerate(data) if not s.sampled]
    val_ids = greedy[:: recipe.val_every][: recipe.num_val_sequences]
    held = set(val_ids)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
    # Every set of conversations the teacher cache answers (``chat_requests_seed<N>.json``).
    chats = [chat for path in sorted(args.data_dir.glob("chat_requests*.json"))
             for chat in json.loads(path.read_text())]  # fmt: skip
    chat_prompts = {tuple(encode_chat(tokenizer, chat)) for chat in chats}
    is_chat = [tuple(s.token_ids[: s.prompt_len]) in chat_prompts for s in data]
    train_ids = [n for n in range(len(data)) if n not in held]
    train_ids += [n for n in train_ids if is_chat[n]] * (recipe.chat_repeat - 1)
    log(
        f"{len(data)} teacher sequences ({sum(is_chat)} written chats): {len(train_ids)} per "
        f"epoch, {len(val_ids)} held out"
    )

    target_config = json.loads((MODEL_DIR / "config.json").read_text())
    target = load_file(MODEL_DIR / "model.safetensors")
    previous = None
    if args.init_from:
        previous = json.loads((args.init_from / "train_log.json").read_text())
        config = json.loads((args.init_from / "config.json").read_text())
        head_ids = config["head_token_ids"]
        weights = load_file(args.init_from / "draft.safetensors")
    else:
        special = sorted({0, 1, 2, *tokenizer.all_special_ids})
        head_ids = head_token_ids([data[n] for n in train_ids], recipe.head_size, special)
        weights = initial_weights(MODEL_DIR)
        weights["lm_head.weight"] = target["model.embed_tokens.weight"][head_ids].float()
    head = torch.tensor(head_ids)
    to_head = torch.full((target_config["vocab_size"],), -1, dtype=torch.int64)
    to_head[head] = torch.arange(len(head))
    model = FeatureDraft(weights, target["model.embed_tokens.weight"], target_config)
    del target
    result = train(model, data, feats, train_ids, val_ids, to_head, head, recipe)
    # A continued draft keeps the speculative settings measured for it; a new one has none
    # until they are measured (the coordinator's defaults).
    settings = tuned_speculation(args.init_from) if args.init_from else {}
    save_folder(args.out, MODEL_DIR, result.pop("weights"), head_ids, speculation=settings)
    report = {
        **run_facts(recipe, ("torch", "safetensors")),
        "target": str(MODEL_DIR.relative_to(ROOT)),
        "num_teacher_sequences": len(data),
        "num_written_chats": sum(is_chat),
        "num_train_tokens_per_epoch": sum(len(data[n].token_ids) for n in train_ids),
        "num_sampled_answers": sum(s.sampled for s in data),
        "features_minutes": features_minutes,
        "continued_from": previous
        and {
            "recipe": previous["recipe"],
            "train": previous["train"],
            "earlier": previous.get("continued_from"),
        },  # fmt: skip
        "train": result,
        "total_minutes": round((time.time() - t_start) / 60, 1),
    }
    (args.out / "train_log.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"done in {report['total_minutes']} min: best {result['best']}")


if __name__ == "__main__":
    main()
