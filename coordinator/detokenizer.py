"""Text for the tokenizer-backed API: encoding prompts and incremental output text."""

from __future__ import annotations

import os

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"


def load_tokenizer(path: str) -> Tokenizer:
    """Loads `path/tokenizer.json` (or `path` itself when it is the file)."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {path!r}")
    return Tokenizer.from_file(file)


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas.

    Each update decodes the whole output and emits the suffix not yet sent. An incomplete
    UTF-8 sequence decodes to U+FFFD at the end of the text; that tail is held back until
    the next token completes it, or flushed when the request ends.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""  # sent so far

    def update(self, new_token_ids: list[int], final: bool = False) -> str:
        self.token_ids.extend(new_token_ids)
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if not final:
            full = full.rstrip(_REPLACEMENT)
        if not full.startswith(self.text):
            # A later token changed earlier text (rare cleanup rules); sent text stands.
            common = os.path.commonprefix([full, self.text])
            delta = full[len(common) :] if len(full) > len(self.text) else ""
            self.text = self.text + delta
            return delta
        delta = full[len(self.text) :]
        self.text = full
        return delta
