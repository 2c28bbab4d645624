"""Structured output's masks: a sequence's grammar state follows the output it is asked
about (rolling back, consuming), refuses what the grammar refuses, and survives ids the
tokenizer does not know."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from specdec.config import TINY_TARGET
from specdec.runtime.grammar import GrammarTokenizer
from specdec.runtime.structured_output import GrammarError, grammar_of
from specdec.v1 import common_pb2

VOCAB = 4096  # the tiny target's
EOS = 0
SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY_TARGET / "tokenizer.json"))


@pytest.fixture
def state():
    grammar = grammar_of(common_pb2.StructuredOutput(json_schema=SCHEMA))
    return GrammarTokenizer(str(TINY_TARGET), VOCAB, [EOS]).state(grammar)


def test_rows_follow_the_chain_and_the_state_rolls_back(state, tokenizer):
    ids = tokenizer.encode('{"a": 12}').ids
    masks = state.masks([], ids, len(ids) + 1)
    assert all(bool(masks[r, t]) for r, t in enumerate(ids))  # each token allowed in turn
    assert masks[0].sum() < VOCAB // 10  # the first row allows little: "{" and the like
    assert masks[-1].tolist() == [t == EOS for t in range(VOCAB)]  # complete: EOS only
    # A rejected tail is rolled back: the state answers for the shorter output.
    again = state.masks(ids[:2], [], 1)
    assert again[0].tolist() == masks[2].tolist()


def test_a_refused_or_unknown_token_ends_the_rows_and_breaks_nothing(state, tokenizer):
    good = tokenizer.encode('{"a": 1').ids
    bad = tokenizer.encode('{"b"').ids
    refused = state.masks([], bad, len(bad) + 1)
    assert bool(refused[:2].all(-1).logical_not().all())  # the rows up to "b" are masked
    assert bool(refused[-1].all())  # after the refused token nothing can be kept: all open
    beyond = state.masks(good[:1], [VOCAB + 5], 3)  # an id past the tokenizer's
    assert bool(beyond[1:].all())
    follow = state.masks(good, [], 1)[0]  # still answers for a good output afterwards
    assert not bool(follow.all()) and bool(follow.any()) and not bool(follow[EOS])


def test_constraints_that_do_not_compile_name_the_problem():
    with pytest.raises(GrammarError, match="json_schema"):
        grammar_of(common_pb2.StructuredOutput(json_schema='{"type": "objec'))
    with pytest.raises(GrammarError, match="regex"):
        grammar_of(common_pb2.StructuredOutput(regex="a(("))
    with pytest.raises(GrammarError, match="at least one choice"):
        grammar_of(common_pb2.StructuredOutput(choice=common_pb2.ChoiceList()))
    assert grammar_of(common_pb2.StructuredOutput()) is None
    missing = GrammarTokenizer("/nonexistent/model", VOCAB, [EOS])
    with pytest.raises(GrammarError, match="tokenizer.json"):
        missing.state(grammar_of(common_pb2.StructuredOutput(json_object=True)))
