"""Serving a GGUF file: its weights kept in their block formats compute the model of their
dequantised values; the config comes from the metadata; a file the runtime cannot serve is
refused at load with the file, the tensor and the type named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_files import MIXED_TYPES, write_gguf
from runtime_helpers import prefill

from specdec.runtime import ModelRunner, SequenceChunk
from specdec.runtime.gguf_file import GGUFError
from specdec.runtime.model_config import ModelConfig

TINY_TARGET = Path(__file__).resolve().parents[2] / "models" / "target"
PROMPT = [5, 17, 99, 3, 250, 1024, 7, 7, 311, 42, 8, 4000, 12]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """The bundled tiny target (Qwen3) with linears in Q8_0 / Q4_1 / Q4_0 and a Q8_0
    embedding that is also the head."""
    folder = tmp_path_factory.mktemp("tiny_gguf")
    return write_gguf(TINY_TARGET, folder / "tiny-target.gguf", MIXED_TYPES)


def test_config_comes_from_the_metadata(tiny_gguf):
    from_file = ModelConfig.from_pretrained(tiny_gguf)
    assert from_file == ModelConfig.from_pretrained(tiny_gguf.parent)  # a folder holding it
    hf = ModelConfig.from_pretrained(TINY_TARGET)
    assert from_file.architecture == "Qwen3ForCausalLM" and from_file.qk_norm
    fields = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"]
    fields += ["num_kv_heads", "head_dim", "rope", "tie_word_embeddings", "eos_token_ids"]
    for field in fields:
        assert getattr(from_file, field) == getattr(hf, field), field


def test_block_weights_compute_the_model_of_their_dequantised_values(tiny_gguf):
    """The GGUF kernels against PyTorch over ``gguf.quants``' dequantised weights (the
    reference attention backend runs everything in PyTorch)."""
    kernels = ModelRunner.from_pretrained(tiny_gguf, num_pages=16)
    reference = ModelRunner.from_pretrained(tiny_gguf, num_pages=16, attention_backend="reference")
    assert kernels.model.holds_gguf and not reference.model.holds_gguf
    ours, theirs = prefill(kernels, "a", PROMPT), prefill(reference, "a", PROMPT)
    assert (ours - theirs).abs().max().item() < 1e-4
    # 16 greedy tokens from the C loop equal the reference's argmax, token by token.
    picks = kernels.decode_greedy(["a"], [int(ours[-1].argmax())], 16)[0]
    token, expected = int(theirs[-1].argmax()), []
    for _ in range(16):
        expected.append(token)
        token = int(reference.extend([SequenceChunk("a", [token])])[0][-1].argmax())
    assert [int(ours[-1].argmax()), *picks[:-1]] == expected


def test_a_llama_gguf_has_its_rotary_rows_restored(tiny_checkpoint, tmp_path):
    """llama.cpp interleaves a Llama q/k projection's rows; the runtime permutes them back,
    so the F32 GGUF computes what the Hugging Face folder does."""
    hf = tiny_checkpoint(tmp_path / "llama", arch="llama")
    gguf_folder = tmp_path / "gguf"
    gguf_folder.mkdir()
    gguf = write_gguf(hf, gguf_folder / "llama.gguf")
    prompt = [5, 17, 99, 3, 250, 100, 7, 7]  # the tiny vocabulary: 256 ids
    ours = prefill(ModelRunner.from_pretrained(gguf, num_pages=16), "a", prompt)
    theirs = prefill(ModelRunner.from_pretrained(hf, num_pages=16), "a", prompt)
    assert (ours - theirs).abs().max().item() < 1e-5


def bad_gguf(tmp_path: Path, **kwargs) -> Path:
    return write_gguf(TINY_TARGET, tmp_path / "bad.gguf", MIXED_TYPES, **kwargs)


def load(path: Path) -> None:
    ModelRunner.from_pretrained(path, num_pages=4)


def test_an_unknown_architecture_is_refused(tmp_path):
    path = bad_gguf(tmp_path, arch="gpt2")
    with pytest.raises(GGUFError, match=rf"{path}: architecture 'gpt2' is not supported"):
        load(path)


def test_a_tensor_type_the_kernels_do_not_read_is_refused(tmp_path):
    path = write_gguf(
        TINY_TARGET, tmp_path / "q5_0.gguf", {**MIXED_TYPES, "ffn_up": GGMLQuantizationType.Q5_0}
    )
    message = r"tensor 'model.layers.0.mlp.up_proj.weight': GGML type 6 is not supported"
    with pytest.raises(GGUFError, match=rf"{path}: {message}"):
        load(path)


def test_a_truncated_file_is_refused(tmp_path):
    path = bad_gguf(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100_000])
    with pytest.raises(GGUFError, match=rf"{path}: "):
        load(path)
    path.write_bytes(data[:1000])  # cut inside the metadata
    with pytest.raises(GGUFError, match=rf"{path}: not a readable GGUF file"):
        load(path)


def test_metadata_that_contradicts_the_tensors_is_refused(tmp_path):
    path = bad_gguf(tmp_path, metadata={"attention.head_count": 2})
    # Two heads of 64: q is [128, 256] and o [256, 128] by the metadata; the file's are not.
    message = r"tensor 'model\.layers\.0\.self_attn\.[qo]_proj\.weight' has shape \[256, 256\], "
    message += r"the metadata says \[(128, 256|256, 128)\]"
    with pytest.raises(GGUFError, match=message):
        load(path)


def test_a_folder_with_two_ggufs_is_ambiguous(tiny_gguf, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(tiny_gguf.read_bytes())
    with pytest.raises(GGUFError, match="expected one .gguf file in the folder, found 2"):
        load(tmp_path)


def test_kv_scales_beside_the_file_are_read(tiny_gguf, tmp_path):
    folder = tmp_path / "with_scales"
    folder.mkdir()
    (folder / tiny_gguf.name).symlink_to(tiny_gguf)
    num_layers = ModelConfig.from_pretrained(tiny_gguf).num_layers
    scales = {"version": 1, "dtype": "fp8", "k_scale": [0.5] * num_layers,
              "v_scale": [0.25] * num_layers}  # fmt: skip
    (folder / "kv_scales.json").write_text(json.dumps(scales))
    runner = ModelRunner.from_pretrained(folder, kv_cache_dtype="fp8", num_pages=4)
    assert runner.kv_scales.k_scale == (0.5,) * num_layers
    assert runner.kv_scales.v_scale == (0.25,) * num_layers
    torch.testing.assert_close(
        prefill(runner, "a", PROMPT[:4]).isfinite().all(), torch.tensor(True)
    )
