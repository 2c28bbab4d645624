"""Chat prompts: the target's chat template (``tokenizer_config.json``) rendered as
transformers' ``apply_chat_template(..., add_generation_prompt=True)`` does, without torch."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant")


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as the template reads them

    @classmethod
    def from_pretrained(cls, path: str) -> ChatTemplate | None:
        """The template of the folder's ``tokenizer_config.json``; None when it has none."""
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        config_file = os.path.join(folder, "tokenizer_config.json")
        if not os.path.isfile(config_file):
            return None
        with open(config_file) as f:
            config = json.load(f)
        source = config.get("chat_template")
        if not isinstance(source, str):
            return None
        special = {
            name: value["content"] if isinstance(value, dict) else value
            for name, value in config.items()
            if name.endswith("_token") and isinstance(value, str | dict)
        }
        return cls(source, special)

    @cached_property
    def _compiled(self) -> jinja2.Template:
        """Compiled once, on first use: requests only render."""
        # What transformers gives a template beside Jinja's own: {% break %} / {% continue %},
        # a JSON filter that keeps non-ASCII text, raise_exception and strftime_now (the date
        # some templates write into their system turn).
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        return env.from_string(self.source)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages``, ending where the assistant's answer starts.

        Raises ValueError (a message naming the entry) for an empty list, an unknown role,
        or a template that refuses the conversation.
        """
        if not messages:
            raise ValueError("messages is empty")
        for i, m in enumerate(messages):
            if m["role"] not in ROLES:
                raise ValueError(f"messages[{i}].role is {m['role']!r}; expected one of {ROLES}")
        try:
            return self._compiled.render(
                messages=messages, add_generation_prompt=True, **self.special_tokens
            )
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template refused the messages: {e}") from None
