"""Structured output's constraints compiled to llguidance grammars: what the coordinator
checks when a request arrives and the model services build their matchers from (no torch
here, so the coordinator can import it)."""

from __future__ import annotations

import json
from functools import lru_cache

import llguidance

from specdec.v1 import common_pb2

JSON_OBJECT_SCHEMA = '{"type": "object"}'
# JSON is laid out as Python's json.dumps lays it out (", " and ": ", no other whitespace):
# free whitespace lets a small model run on in blank lines until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A constraint that does not compile; its message says why."""


def grammar_of(msg: common_pb2.StructuredOutput) -> str | None:
    """The llguidance grammar of a ``StructuredOutput`` (None when it sets nothing), or
    GrammarError naming the problem."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_object":
        source, text = "json_schema", JSON_OBJECT_SCHEMA
    elif kind == "choice":
        if not msg.choice.choices:
            raise GrammarError("structured output choice: give at least one choice")
        source, text = "choice", json.dumps(list(msg.choice.choices))
    else:
        source, text = kind, getattr(msg, kind)
    return _compiled(source, text)


@lru_cache(maxsize=1024)  # the services look a request's grammar up at every step
def _compiled(source: str, text: str) -> str:
    try:
        if source == "json_schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        else:
            grammar = llguidance.grammar_from(source, text)
    except (ValueError, TypeError) as e:  # unparsable JSON, a bad GBNF grammar
        raise GrammarError(f"structured output {source}: {e}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"structured output {source}: {error}")
    return grammar
