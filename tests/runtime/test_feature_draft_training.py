"""The training forward of a feature-reading draft (``train_feature_draft.FeatureDraft``,
unrolled over depths) computes what the served draft computes in a chain of proposals:
depth d at position p is the runtime's output after the target-fed prefix up to
p - d + 1 and d - 1 proposals that read the draft's own hidden states."""

from __future__ import annotations

import json

import torch
from feature_draft import initial_weights, save_folder
from safetensors.torch import load_file
from train_feature_draft import FeatureDraft, reads

from specdec.runtime.model_runner import ModelRunner
from specdec.runtime.sequence import SequenceChunk

TOKENS = [5, 17, 99, 3, 250, 61, 7, 42, 42, 8, 1, 77, 13, 200]
DEPTH = 3


def test_unrolled_depths_equal_the_served_chain(llama_path, tmp_path):
    weights = initial_weights(llama_path)
    torch.manual_seed(1)
    weights["model.fc.weight"] += 0.1 * torch.randn_like(weights["model.fc.weight"])
    folder = save_folder(tmp_path / "draft", llama_path, weights, dtype=torch.float32)
    config = json.loads((llama_path / "config.json").read_text())
    embedding = load_file(llama_path / "model.safetensors")["model.embed_tokens.weight"]
    own = load_file(folder / "draft.safetensors")
    model = FeatureDraft(own, embedding, config)
    features = torch.randn(len(TOKENS), config["hidden_size"])  # the target's, per position
    outs = model.depths(torch.tensor([TOKENS]), reads(features)[None], DEPTH)
    runner = ModelRunner.from_pretrained(folder, attention_backend="reference")
    for start in (3, 7):  # the target fed tokens [0, start]; the chain runs from there
        runner.open("c")
        fed = SequenceChunk("c", TOKENS[: start + 1], 1, 1, reads(features)[: start + 1])
        hidden = runner.forward_chunks([fed])[0].hidden
        torch.testing.assert_close(hidden[0], outs[0][0, start], atol=1e-4, rtol=1e-4)
        for d in range(2, DEPTH + 1):
            p = start + d - 1
            chunk = SequenceChunk("c", [TOKENS[p]], 1, 1, hidden)
            hidden = runner.forward_chunks([chunk])[0].hidden
            torch.testing.assert_close(hidden[0], outs[d - 1][0, p], atol=1e-4, rtol=1e-4)
        runner.release("c")
