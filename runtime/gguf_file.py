"""A GGUF file as the runtime reads it: the model's config from the metadata, its tensors
under Hugging Face names, linears and the embedding kept in their GGUF block formats.

Read with ``gguf.GGUFReader`` (llama.cpp's own reader, memory-mapped). Llama and Qwen3
architectures. llama.cpp's converter interleaves a Llama q/k projection's rows per head
(it rotates adjacent pairs where Hugging Face rotates halves); whole rows are permuted back
here, which is exact for any block format. Every problem is a ``GGUFError`` naming the file
and, where it is about one, the tensor and its type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.kernels.gguf_ops import GGMLType, GGUFPart, GGUFWeight, UnsupportedGGMLType, row_bytes

# GGUF architecture -> the Hugging Face architecture the runtime builds.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Per-token tokenizer arrays: large, and read by the tokenizer converter only.
TOKENIZER_ARRAYS = {f"tokenizer.ggml.{n}" for n in ("tokens", "token_type", "merges", "scores")}
KV_SCALES_FILE = "kv_scales.json"  # beside the GGUF: the FP8 KV scales (KVScaleTable JSON)


class GGUFError(ValueError):
    """A GGUF file the runtime cannot serve, with what is wrong in it."""


def is_gguf(path: str | Path) -> bool:
    """A ``.gguf`` file, or a folder holding one and no safetensors checkpoint."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".gguf"
    return path.is_dir() and not any(path.glob("*.safetensors")) and any(path.glob("*.gguf"))


def gguf_path(path: str | Path) -> Path:
    """The GGUF file ``path`` names: itself, or the one ``.gguf`` in a folder."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        raise GGUFError(f"{path}: expected one .gguf file in the folder, found {len(found)}")
    return found[0]


def hf_tensor_name(name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; GGUFError for
    a tensor outside the Llama / Qwen3 set."""
    if match := BLOCK_TENSOR.match(name):
        layer, part, kind = match.groups()
        if part in BLOCK_TENSORS:
            return f"model.layers.{layer}.{BLOCK_TENSORS[part]}.{kind}"
    else:
        stem, _, kind = name.rpartition(".")
        if stem in GLOBAL_TENSORS:
            return f"{GLOBAL_TENSORS[stem]}.{kind}"
    raise GGUFError(f"tensor {name!r} has no Llama / Qwen3 counterpart")


def unpermute_rotary_rows(rows: Any, num_heads: int) -> Any:
    """Undo llama.cpp's per-head interleave of a Llama q/k projection's output rows (its
    ``convert_hf_to_gguf.py`` ``permute``; as transformers' ``LlamaTensorProcessor``):
    ``rows`` is ``[out, ...]`` in any format whose rows are whole."""
    half = rows.shape[0] // num_heads // 2
    grouped = rows.reshape(num_heads, half, 2, *rows.shape[1:])
    return grouped.swapaxes(1, 2).reshape(rows.shape)


def as_float32_decimal(value: float) -> float:
    """The shortest decimal that reads back as the same float32: ``1e-05``, not
    ``9.999999747378752e-06``."""
    return float(str(np.float32(value)))


@dataclass
class GGUFTensor:
    name: str  # Hugging Face name
    ggml_type: int
    shape: tuple[int, ...]  # [out, in] (rows first, as torch); [n] for vectors
    data: np.ndarray  # the reader's memory-mapped view: [rows, row bytes] for block types


class GGUFCheckpoint:
    """One GGUF file, opened: ``metadata``, ``hf_config`` and ``tensors`` (HF names)."""

    def __init__(self, path: str | Path) -> None:
        from gguf import GGUFReader

        self.path = gguf_path(path)
        try:
            reader = GGUFReader(self.path)
        except Exception as error:  # the reader raises several types for a bad file
            raise GGUFError(f"{self.path}: not a readable GGUF file ({error})") from None
        self.metadata: dict[str, Any] = {
            key: field.contents()
            for key, field in reader.fields.items()
            if key not in TOKENIZER_ARRAYS
        }
        self.tensors: dict[str, GGUFTensor] = {}
        for t in reader.tensors:
            try:
                name = hf_tensor_name(t.name)
            except GGUFError as error:
                raise GGUFError(f"{self.path}: {error}") from None
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))
            self.tensors[name] = GGUFTensor(name, int(t.tensor_type), shape, t.data)
        self.hf_config = self._hf_config()
        self._check_tensors()

    def _meta(self, key: str, default: Any = None) -> Any:
        arch = self.metadata.get("general.architecture")
        value = self.metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{self.path}: metadata has no {arch}.{key}")
        return value

    def _hf_config(self) -> dict[str, Any]:
        """A ``config.json``-style dict from the metadata (what ``ModelConfig.from_dict``
        and transformers read)."""
        arch = self.metadata.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise GGUFError(
                f"{self.path}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES)})"
            )
        if any(key.startswith(f"{arch}.rope.scaling.") for key in self.metadata):
            raise GGUFError(f"{self.path}: GGUF RoPE scaling is not supported")
        hidden = int(self._meta("embedding_length"))
        num_heads = int(self._meta("attention.head_count"))
        head_dim = int(self._meta("attention.key_length", hidden // num_heads))
        if int(self._meta("rope.dimension_count", head_dim)) != head_dim:
            raise GGUFError(f"{self.path}: partial rotary embeddings are not supported")
        meta = self.metadata
        eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
        embedding = self.tensors.get("model.embed_tokens.weight")
        vocab = self.metadata.get(f"{arch}.vocab_size") or (embedding and embedding.shape[0])
        return {
            "architectures": [ARCHITECTURES[arch]],
            "model_type": arch,
            "vocab_size": int(self._meta("vocab_size", vocab)),
            "hidden_size": hidden,
            "intermediate_size": int(self._meta("feed_forward_length")),
            "num_hidden_layers": int(self._meta("block_count")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(self._meta("attention.head_count_kv", num_heads)),
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": int(self._meta("context_length")),
            "rms_norm_eps": as_float32_decimal(self._meta("attention.layer_norm_rms_epsilon")),
            "rope_theta": as_float32_decimal(self._meta("rope.freq_base", 10000.0)),
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": True,  # set from the tensors below
            "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": list(dict.fromkeys(int(e) for e in eos if e is not None)),
            "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        }

    def _check_tensors(self) -> None:
        """Every tensor's type is one the kernels read and its shape is what the metadata
        says; the config learns whether the head is tied and whether q/k/v have biases."""
        c = self.hf_config
        names = set(self.tensors)
        c["tie_word_embeddings"] = "lm_head.weight" not in names
        c["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in names
        hidden, inter, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
        q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
        expected = {
            "model.embed_tokens.weight": (c["vocab_size"], hidden),
            "model.norm.weight": (hidden,),
        }
        if not c["tie_word_embeddings"]:
            expected["lm_head.weight"] = (c["vocab_size"], hidden)
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            expected |= {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q, hidden),
                p + "self_attn.k_proj.weight": (kv, hidden),
                p + "self_attn.v_proj.weight": (kv, hidden),
                p + "self_attn.o_proj.weight": (hidden, q),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
            }
            if c["model_type"] == "qwen3":
                expected[p + "self_attn.q_norm.weight"] = (d,)
                expected[p + "self_attn.k_norm.weight"] = (d,)
        missing = sorted(set(expected) - names)
        if missing:
            raise GGUFError(f"{self.path}: the metadata's model needs tensor {missing[0]!r}")
        for name, tensor in self.tensors.items():
            want = expected.get(name)
            if want is None and not name.endswith(".bias"):
                raise GGUFError(f"{self.path}: tensor {name!r} is not part of the model")
            if want is not None and tensor.shape != want:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} has shape {list(tensor.shape)}, the "
                    f"metadata says {list(want)}"
                )
            try:
                nbytes = row_bytes(tensor.ggml_type, tensor.shape[-1])
            except ValueError as error:
                raise GGUFError(f"{self.path}: tensor {name!r}: {error}") from None
            rows = int(np.prod(tensor.shape[:-1], dtype=np.int64))
            if tensor.data.nbytes != rows * nbytes:
                raise GGUFError(
                    f"{self.path}: tensor {name!r} ({GGMLType(tensor.ggml_type).name}) holds "
                    f"{tensor.data.nbytes} bytes, its shape needs {rows * nbytes} (truncated?)"
                )

    def _rows(self, name: str) -> np.ndarray:
        """The tensor's rows as bytes ``[out, row bytes]``, q/k rows in HF order."""
        t = self.tensors[name]
        rows = t.data.view(np.uint8).reshape(t.shape[0], -1)
        match = re.search(r"self_attn\.([qk])_proj\.weight$", name)
        if match and self.hf_config["model_type"] == "llama":
            c = self.hf_config
            heads = c["num_attention_heads"] if match[1] == "q" else c["num_key_value_heads"]
            rows = unpermute_rotary_rows(rows, heads)
        return rows

    def gguf_weight(self, names: list[str]) -> GGUFWeight:
        """The tensors ``names`` stacked along the output rows, in their block formats."""
        parts = [
            GGUFPart(GGMLType(self.tensors[n].ggml_type), torch.from_numpy(np.array(self._rows(n))))
            for n in names
        ]
        return GGUFWeight(self.tensors[names[0]].shape[-1], parts)

    def float_tensor(self, name: str) -> torch.Tensor:
        """The tensor dequantised to float32 (``gguf.quants.dequantize``), in its shape."""
        from gguf.quants import dequantize

        t = self.tensors[name]
        rows = self._rows(name) if len(t.shape) == 2 else t.data
        array = dequantize(np.ascontiguousarray(rows), t.ggml_type)
        return torch.from_numpy(np.array(array, np.float32).reshape(t.shape))


def reference_dequantize(weight: GGUFWeight) -> torch.Tensor:
    """``weight`` as float32 ``[out, in]`` by ``gguf.quants.dequantize`` (no C kernels)."""
    from gguf.quants import dequantize

    parts = []
    for part in weight.parts:
        array = dequantize(part.data.numpy(), int(part.ggml_type))
        parts.append(torch.from_numpy(np.array(array, np.float32)))
    return torch.cat(parts).reshape(weight.out_features, weight.in_features)


__all__ = ["GGUFCheckpoint", "GGUFError", "UnsupportedGGMLType", "is_gguf", "gguf_path"]
