"""`specdec bench --prompts`: a prompt file's chats, categories taking turns."""

from __future__ import annotations

import json

from specdec.bench import chat_prompts
from specdec.config import GENERAL_CHAT


def test_categories_take_turns_so_the_first_prompts_cover_them_all(tmp_path):
    path = tmp_path / "prompts.json"
    entries = [
        {"category": "math", "content": "m1"},
        {"category": "math", "content": "m2"},
        {"category": "coding", "content": "c1"},
        {"category": "writing", "content": "w1"},
    ]
    path.write_text(json.dumps({"prompts": entries}))
    chats = chat_prompts(str(path))
    assert [c[0]["content"] for c in chats] == ["m1", "c1", "w1", "m2"]
    assert all(c == [{"role": "user", "content": c[0]["content"]}] for c in chats)


def test_the_committed_general_chat_set_has_ten_prompts_in_each_of_eight_categories():
    prompts = json.loads(GENERAL_CHAT.read_text())["prompts"]
    categories = {p["category"] for p in prompts}
    assert len(categories) == 8
    assert all(sum(p["category"] == c for p in prompts) == 10 for c in categories)
    assert len({p["content"] for p in prompts}) == 80
    first = chat_prompts(str(GENERAL_CHAT))[:8]
    assert (
        len(
            {next(p["category"] for p in prompts if p["content"] == c[0]["content"]) for c in first}
        )
        == 8
    )
