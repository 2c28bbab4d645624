"""Prompt text to token ids for the public APIs: refused by size before any work, then
rendered and tokenised off the event loop, so a huge prompt never stalls running streams."""

from __future__ import annotations

import asyncio

from tokenizers import Tokenizer

from specdec.coordinator.api.chat import ChatTemplate
from specdec.coordinator.engine.errors import InvalidRequest


class PromptEncoder:
    """Encodes text and chat prompts for a model of ``max_model_len`` tokens.

    No token is longer than the longest entry of the vocabulary, so a text longer than
    that many characters times ``max_model_len`` cannot fit and is refused at once.
    ``Tokenizer.encode_batch`` releases the GIL (``encode`` does not), so it runs in a
    worker thread while the loop keeps streaming.
    """

    def __init__(
        self, tokenizer: Tokenizer, chat_template: ChatTemplate | None, max_model_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1)
        self.max_chars = max(longest, 1) * max_model_len
        self.max_model_len = max_model_len

    def _check_size(self, num_chars: int, what: str) -> None:
        if num_chars > self.max_chars:
            raise InvalidRequest(
                f"{what} has {num_chars} characters, more than {self.max_model_len} tokens "
                f"(max_model_len) can hold; shorten it"
            )

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; InvalidRequest when it is too long to be a prompt."""
        self._check_size(len(text), "the prompt")
        encodings = await asyncio.to_thread(
            self.tokenizer.encode_batch, [text], add_special_tokens=add_special_tokens
        )
        return encodings[0].ids

    async def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the chat template rendered for ``messages``."""
        if self.chat_template is None:
            raise InvalidRequest(
                "messages need a chat template, and the tokenizer folder's "
                "tokenizer_config.json has none: send text or token_ids"
            )
        self._check_size(sum(len(m["content"]) for m in messages), "messages")
        try:
            text = await asyncio.to_thread(self.chat_template.render, messages)
        except ValueError as e:
            raise InvalidRequest(f"messages: {e}") from None
        # The template writes the special tokens itself.
        return await self.encode(text, add_special_tokens=False)
