"""A draft that reads the target's features (EAGLE-style), as a folder the runtime serves.

One decoder layer of the target's shape. Each position's input joins its token's embedding
and the target's final hidden state at the position before (``model.fc`` over the two,
each RMS-normalised first: ``model.embed_norm``, ``model.feature_norm``); the layer's
output, after ``model.norm``, is the draft's guess of the target's next hidden state: the
head scores it, and the draft's next proposal reads it as its feature. ``config.json``
says ``reads_target_features: true`` (``runtime.model_config.ModelConfig``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from fetch_models import complete_draft
from safetensors.torch import load_file, save_file

from specdec.config import SPECULATORS_CONFIG
from specdec.runtime.loader import iterate_checkpoint


def feature_draft_config(
    target_dir: Path, head_ids: list[int] | None = None, speculation: dict | None = None
) -> dict:
    """The target's ``config.json`` with one layer that reads the target's features; with
    ``head_ids``, an untied head over those ids (FR-Spec); with ``speculation``, the
    speculative settings measured best for the draft (``speculators_config``)."""
    config = json.loads((Path(target_dir) / "config.json").read_text())
    config.update(num_hidden_layers=1, reads_target_features=True, torch_dtype="bfloat16")
    config.pop("layer_types", None)
    if head_ids is not None:
        config.update(tie_word_embeddings=False, head_token_ids=[int(i) for i in head_ids])
    if speculation:
        config[SPECULATORS_CONFIG] = speculation
    return config


def initial_weights(target_dir: Path, layer: int = -1) -> dict[str, torch.Tensor]:
    """The draft's tensors before training: the target's ``layer`` (the last by default),
    its final norm, unit input norms, and ``fc`` the sum of the two normalised inputs."""
    target = dict(iterate_checkpoint(target_dir))
    num_layers = 1 + max(int(n.split(".")[2]) for n in target if n.startswith("model.layers."))
    source = f"model.layers.{layer % num_layers}."
    hidden = target["model.norm.weight"].shape[0]
    weights = {
        "model.layers.0." + name.removeprefix(source): tensor.float().clone()
        for name, tensor in target.items()
        if name.startswith(source) and not name.endswith(("k_scale", "v_scale"))
    }
    eye = torch.eye(hidden)
    weights.update(
        {
            "model.norm.weight": target["model.norm.weight"].float().clone(),
            "model.embed_norm.weight": torch.ones(hidden),
            "model.feature_norm.weight": torch.ones(hidden),
            "model.fc.weight": torch.cat([eye, eye], 1),
        }
    )
    return weights


def save_folder(
    out: Path,
    target_dir: Path,
    weights: dict[str, torch.Tensor],
    head_ids: list[int] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    speculation: dict | None = None,
) -> Path:
    """A servable folder: the config, ``generation_config.json``, the draft's own tensors
    (``draft.safetensors``; the target's head where the draft has none of its own and the
    target's is untied), then what it shares with the target (``complete_draft``)."""
    out.mkdir(parents=True, exist_ok=True)
    config = feature_draft_config(target_dir, head_ids, speculation)
    (out / "config.json").write_text(json.dumps(config) + "\n")
    own = dict(weights)
    if not config.get("tie_word_embeddings") and "lm_head.weight" not in own:
        own["lm_head.weight"] = load_file(str(Path(target_dir) / "model.safetensors"))[
            "lm_head.weight"
        ]
    own = {name: t.to(dtype).contiguous() for name, t in own.items()}
    save_file(own, str(out / "draft.safetensors"), metadata={"format": "pt"})
    if (Path(target_dir) / "generation_config.json").is_file():
        shutil.copyfile(Path(target_dir) / "generation_config.json", out / "generation_config.json")
    complete_draft(out, Path(target_dir))
    return out
