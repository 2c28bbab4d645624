"""GGUF files for tests, written with llama.cpp's ``gguf`` package from a Hugging Face folder,
as ``convert_hf_to_gguf.py`` lays them out (a Llama q/k projection's rows interleaved)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.numpy import load_file

from specdec.runtime.gguf_file import BLOCK_TENSORS, GLOBAL_TENSORS

HF_TO_GGUF = {v: k for k, v in {**GLOBAL_TENSORS, **BLOCK_TENSORS}.items()}
# A mix as quantised files have: q/k/v in three parts of two types, gate/up in two.
MIXED_TYPES = {
    "token_embd": GGMLQuantizationType.Q8_0,
    "attn_q": GGMLQuantizationType.Q4_1,
    "attn_k": GGMLQuantizationType.Q4_1,
    "attn_v": GGMLQuantizationType.Q8_0,
    "attn_output": GGMLQuantizationType.Q8_0,
    "ffn_gate": GGMLQuantizationType.Q4_0,
    "ffn_up": GGMLQuantizationType.Q8_0,
    "ffn_down": GGMLQuantizationType.Q8_0,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def gguf_name(hf_name: str) -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem.startswith("model.layers."):
        _, _, layer, module = stem.split(".", 3)
        return f"blk.{layer}.{HF_TO_GGUF[module]}.{kind}"
    return f"{HF_TO_GGUF[stem]}.{kind}"


def interleave_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``permute`` of a Llama q/k projection (what the runtime undoes)."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, 2, half, -1).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    hf_folder: Path,
    path: Path,
    types: dict[str, GGMLQuantizationType] | None = None,
    arch: str | None = None,
    metadata: dict[str, int] | None = None,
) -> Path:
    """``hf_folder``'s model as a GGUF at ``path``: tensors named by their GGUF stem in
    ``types`` are stored in that type, the rest in F32; ``arch`` and ``metadata`` (key
    suffix -> int, e.g. ``{"attention.head_count": 3}``) override what the folder says. Its
    tokenizer files are copied beside it."""
    config = json.loads((hf_folder / "config.json").read_text())
    model_type = config["model_type"]
    arch = arch or model_type
    writer = GGUFWriter(str(path), arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    ints = {
        "block_count": config["num_hidden_layers"],
        "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": heads,
        "attention.head_count_kv": kv_heads,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "vocab_size": config["vocab_size"],
        **(metadata or {}),
    }
    for key, value in ints.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", float(theta))
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    writer.add_eos_token_id(int(config["eos_token_id"]))
    writer.add_bos_token_id(int(config.get("bos_token_id") or 0))
    tensors = load_file(str(hf_folder / "model.safetensors"))
    for name, array in tensors.items():
        tied_head = name == "lm_head.weight" and config.get("tie_word_embeddings")
        if tied_head or name.endswith("_scale"):  # FP8 KV scales go beside a GGUF
            continue
        array = array.astype(np.float32)
        if model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            array = interleave_rotary_rows(array, heads if "q_proj" in name else kv_heads)
        target = gguf_name(name)
        qtype = (types or {}).get(target.split(".")[-2], GGMLQuantizationType.F32)
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(target, array)
        else:
            writer.add_tensor(target, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for name in TOKENIZER_FILES:
        if (hf_folder / name).is_file():
            shutil.copyfile(hf_folder / name, path.parent / name)
    return path
