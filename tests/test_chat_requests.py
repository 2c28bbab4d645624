"""The draft's self-instruct conversations (``scripts/chat_requests.py``), with a scripted
writer in place of the target."""

from __future__ import annotations

import itertools

from chat_requests import KINDS, build_chats, cleaned, near_copy_key


class ScriptedWriter:
    """Replies in turn: a good request, an echo of the instruction, a near-copy of the
    request before, then a fresh one; answers (temperature 0) and follow-ups as asked."""

    def __init__(self) -> None:
        self.counter = itertools.count()
        self.calls: list[tuple[int, float, int]] = []

    def __call__(self, instructions: list[str], temperature: float, max_tokens: int):
        self.calls.append((len(instructions), temperature, max_tokens))
        replies = []
        for instruction in instructions:
            n = next(self.counter)
            if temperature == 0:
                replies.append(f"Here is an answer number {n}.")
            elif instruction.startswith("Here is a conversation"):
                replies.append(f"Thanks! Could you say more about point {n}?")
            else:
                replies.append(
                    [
                        f'"How do I plan trip number {n} on a budget?"',
                        "Write one message that a person might send to a chat assistant.",
                        f"How do I plan trip number {n - 2} on a budget, please?",
                        "x = [1, 2, 3]; print(x[5]) # ???????????",
                    ][n % 4]
                )
        return replies


def test_conversations_are_distinct_requests_some_two_turn_some_with_a_system_prompt():
    writer = ScriptedWriter()
    chats = build_chats(writer, seed=0, count=40, batch=16)
    assert len(chats) == 40
    firsts = [c[1]["content"] if c[0]["role"] == "system" else c[0]["content"] for c in chats]
    assert len({near_copy_key(f) for f in firsts}) == 40  # no near-copies
    assert not any("chat assistant" in f or f.startswith('"') for f in firsts)
    assert all(c[-1]["role"] == "user" for c in chats)
    for i, chat in enumerate(chats):
        roles = [m["role"] for m in chat]
        turns = ["user", "assistant", "user"] if i % 4 == 3 else ["user"]
        assert roles == (["system"] if i % 5 == 4 else []) + turns, (i, roles)
    assert (10, 0.0, 120) in writer.calls  # the ten first answers, greedy


def test_a_reply_must_read_like_a_message():
    assert cleaned('  "User: What is a good name for a cat?"  ') == "What is a good name for a cat?"
    assert cleaned("ok") is None
    assert cleaned("Here is the topic: dogs, as a user might send it") is None
    assert cleaned("{[(1, 2), (3, 4)]} == {[(5, 6)]} + 7 * 8 / 9") is None
    assert cleaned("2. Why do leaves change colour in autumn?") is None  # a shown example
    assert cleaned("How do I fix a flat tyre?\n2. And a chain?") == "How do I fix a flat tyre?"
    assert len(KINDS) == 10
