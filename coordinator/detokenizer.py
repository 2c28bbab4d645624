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

    Only a window is decoded: the tokens since the text was last complete, behind one
    token of context (decoders such as Metaspace treat a sequence's first token apart), so
    a delta costs the window, not the whole output. An incomplete UTF-8 sequence decodes
    to U+FFFD at the end of the text; that tail is held back until the next token
    completes it, or flushed when the request ends.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._start = 0  # first token of the window (the context token, once there is one)
        self._sent = ""  # text of the window already sent (or the context token's text)

    def update(self, new_token_ids: list[int], final: bool = False) -> str:
        self.token_ids.extend(new_token_ids)
        full = self.tokenizer.decode(self.token_ids[self._start :], skip_special_tokens=True)
        text = full if final else full.rstrip(_REPLACEMENT)
        if text.startswith(self._sent):
            delta = text[len(self._sent) :]
        else:
            # A later token changed earlier text (rare cleanup rules); sent text stands.
            common = os.path.commonprefix([text, self._sent])
            delta = text[len(common) :] if len(text) > len(self._sent) else ""
        self._sent += delta
        if text == full and self.token_ids:
            # The text is whole: the next window starts at the last token, as context.
            self._start = len(self.token_ids) - 1
            self._sent = self.tokenizer.decode(
                self.token_ids[self._start :], skip_special_tokens=True
            )
        return delta
