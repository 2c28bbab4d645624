"""Text for the tokenizer-backed API: encoding prompts and incremental output text."""

from __future__ import annotations

import os

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


def load_tokenizer(path: str) -> Tokenizer:
    """Loads `path/tokenizer.json` (or `path` itself when it is the file)."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no tokenizer.json at {path!r}")
    return Tokenizer.from_file(file)


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas, with tokenizers' own
    ``DecodeStream`` (which holds back a token that does not yet complete a character, and
    decodes a window, not the whole output). ``final`` flushes what it still holds, an
    incomplete character as U+FFFD."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._stream = DecodeStream(skip_special_tokens=True)
        self._held: list[int] = []  # tokens fed since the stream last gave text

    def update(self, new_token_ids: list[int], final: bool = False) -> str:
        self.token_ids.extend(new_token_ids)
        delta = []
        for token in new_token_ids:
            text = self._stream.step(self.tokenizer, token)
            if text is None:
                self._held.append(token)
            else:
                self._held.clear()
                delta.append(text)
        if final and self._held:
            delta.append(self.tokenizer.decode(self._held, skip_special_tokens=True))
            self._held.clear()
        return "".join(delta)
