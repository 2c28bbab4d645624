"""The architecture facts the runtime needs, read from a checkpoint's ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Architecture name -> whether it has per-head q_norm / k_norm (Qwen3 = Llama + qk-norm).
SUPPORTED_ARCHITECTURES: dict[str, bool] = {
    "LlamaForCausalLM": False,
    "Qwen3ForCausalLM": True,
}


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters; ``rope_type`` is ``default`` or ``llama3``."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> RopeConfig:
        # transformers >= 5 writes `rope_parameters` (theta inside); older checkpoints write
        # `rope_theta` beside an optional `rope_scaling`.
        params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            return cls(theta=float(theta))
        if rope_type == "llama3":
            return cls(
                theta=float(theta),
                rope_type="llama3",
                factor=float(params["factor"]),
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            )
        raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, llama3)")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: the fields the forward and the loader read."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = field(default=())
    # A frequency-ranked output head (FR-Spec): the vocabulary ids its rows score, in row
    # order. Empty = the head covers the whole vocabulary. The model scores the other ids
    # -inf, so a draft never proposes them and gives them probability exactly 0.
    head_token_ids: tuple[int, ...] = field(default=())
    # A feature-reading draft (EAGLE-style): each position's input is its token's embedding
    # and the target's final hidden state at the position before, joined by ``model.fc``
    # (``runtime.model.DecoderModel``); the target's hidden size is this model's.
    reads_target_features: bool = False

    def __post_init__(self) -> None:
        ids = self.head_token_ids
        if ids and (len(set(ids)) != len(ids) or not 0 <= min(ids) <= max(ids) < self.vocab_size):
            raise ValueError(
                f"head_token_ids must be distinct ids in [0, {self.vocab_size}) (vocab_size)"
            )

    @property
    def head_size(self) -> int:
        """Rows of the output head: ``len(head_token_ids)``, or the vocabulary."""
        return len(self.head_token_ids) or self.vocab_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if raw.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r} (only silu)")
        num_heads = int(raw["num_attention_heads"])
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rope=RopeConfig.from_hf(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=SUPPORTED_ARCHITECTURES[arch],
            eos_token_ids=_as_ids(raw.get("eos_token_id")),
            head_token_ids=_as_ids(raw.get("head_token_ids")),
            reads_target_features=bool(raw.get("reads_target_features", False)),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and ``generation_config.json``'s EOS ids) from a local folder,
        or the metadata of a GGUF file (or of the one in a folder)."""
        from specdec.runtime.gguf_file import GGUFCheckpoint, is_gguf

        if is_gguf(path):
            return cls.from_dict(GGUFCheckpoint(path).hf_config)
        folder = Path(path)
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"no checkpoint at {str(folder)!r}: expected a Hugging Face model folder "
                f"with config.json and *.safetensors"
            )
        raw = json.loads(config_file.read_text())
        gen_file = folder / "generation_config.json"
        if gen_file.is_file():
            gen_eos = _as_ids(json.loads(gen_file.read_text()).get("eos_token_id"))
            raw_eos = _as_ids(raw.get("eos_token_id"))
            raw["eos_token_id"] = list(dict.fromkeys(raw_eos + gen_eos))
        return cls.from_dict(raw)


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
