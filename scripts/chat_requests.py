"""Chat requests for distilling the draft, written by the target itself (self-instruct).

The target is asked, through its own chat template, for one message a user might send a
chat assistant: a kind of request (the categories people ask a chat model about: writing,
roleplay, reasoning, math, coding, extraction, STEM, humanities, advice, everyday life)
on a topic from a hand-written list, sampled at ``REQUEST_TEMPERATURE``. A message is
kept when it reads like a request (its length, no echo of the instruction) and is not a
near-copy of one kept before. Every ``multi_turn_every``-th becomes a two-turn
conversation (the target's answer, then a follow-up the target writes), and every
``system_every``-th gets a system prompt from a hand-written list. Nothing is downloaded,
and the evaluation set (``bench/prompts``) is never read.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

# What each kind of request looks like, for the instruction the target gets (a 135M model
# writes better requests after a few examples than from a description alone).
KINDS = {
    "writing": "asks for a piece of writing: a short story, a poem, an email or a note",
    "roleplay": "asks the assistant to play a character or a role and answer in character",
    "reasoning": "asks a logic question, a riddle or a question that needs careful thinking",
    "math": "asks to solve a math or arithmetic problem and show the steps",
    "coding": "asks for help with code: write a function, explain an error or a concept",
    "extraction": "gives a short text and asks to pull out names, dates, numbers or key points",
    "stem": "asks a science, technology or engineering question",
    "humanities": "asks about history, philosophy, literature, art or society",
    "advice": "asks for practical advice about a personal or work situation",
    "everyday": "asks an everyday question about cooking, travel, shopping or the home",
}
TOPICS = (
    "baking bread", "saving money", "learning a language", "a job interview", "houseplants",
    "a road trip", "climate", "the moon", "volcanoes", "ancient Egypt", "the Roman Empire",
    "chess", "football", "running", "sleep", "coffee", "tea", "dogs", "cats", "birds",
    "the ocean", "rainforests", "electric cars", "bicycles", "trains", "airports", "a wedding",
    "a birthday party", "moving house", "a new neighbour", "a broken laptop", "passwords",
    "spreadsheets", "Python lists", "JavaScript promises", "SQL joins", "recursion",
    "sorting algorithms", "web servers", "the internet", "batteries", "magnets", "light",
    "sound", "gravity", "photosynthesis", "the human heart", "vaccines", "bacteria", "DNA",
    "fractions", "percentages", "probability", "geometry", "interest rates", "taxes",
    "a small business", "marketing", "a team meeting", "a difficult boss", "time management",
    "public speaking", "a first date", "friendship", "grandparents", "a school project",
    "homework", "exams", "a museum visit", "painting", "music lessons", "the piano", "jazz",
    "poetry", "Shakespeare", "mythology", "democracy", "elections", "the printing press",
    "the industrial revolution", "world maps", "mountains", "rivers", "deserts", "winter",
    "a rainy day", "gardening", "composting", "recycling", "a picnic", "camping", "fishing",
    "a lost wallet", "a train delay", "a hotel booking", "a restaurant review", "pizza",
    "soup", "vegetarian meals", "a cake", "a dinner party", "a job offer", "a resume",
    "a thank-you letter", "a complaint", "a robot", "space travel", "dinosaurs", "a castle",
    "a detective", "a pirate ship", "a dragon", "a time machine", "a haunted house"
)  # fmt: skip
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a friendly assistant. Keep your answers short and clear.",
    "You are a patient teacher who explains things step by step.",
    "You are a concise assistant: answer in a few sentences.",
    "You are a creative writing assistant.",
    "You are an expert programmer who writes clean, commented code.",
    "You are a careful assistant who thinks before answering.",
    "You are a cheerful assistant for children; use simple words.",
    "You are a professional assistant for office work.",
    "You are a knowledgeable guide to history and culture.",
    "Answer as briefly as you can.",
    "You help people plan their day and stay organised.",
)
REQUEST_TEMPERATURE = 0.7
MIN_CHARS, MAX_CHARS = 16, 400
# Phrases of the instruction that a message repeating it back would contain.
ECHOES = ("might send", "chat assistant", "a message that", "messages like", "topic:")

# write(instructions, temperature, max_tokens) -> the target's replies, one per instruction
Writer = Callable[[list[str], float, int], list[str]]


# A few messages of the kind wanted, shown to the target; a reply that repeats one is dropped.
EXAMPLES = (
    "Can you give me three ideas for a quick weeknight dinner?",
    "Why do leaves change colour in autumn?",
    "Write a short poem about a lighthouse.",
)


def request_instruction(kind: str, topic: str) -> str:
    shown = "".join(f"{i}. {example}\n" for i, example in enumerate(EXAMPLES, 1))
    return (
        f"Here are messages people sent to a chat assistant:\n{shown}"
        f"Write one more message like these. It {KINDS[kind]}, about {topic}. Write only "
        "the message."
    )


def follow_up_instruction(request: str, answer: str) -> str:
    return (
        "Here is a conversation between a person and a chat assistant.\n\n"
        f"Person: {request}\n\nAssistant: {answer}\n\n"
        "Write the person's next message: a short follow-up question or request. Write only "
        "the message itself."
    )


def cleaned(text: str) -> str | None:
    """The reply as a user message, or None when it does not read like one."""
    text = text.strip().split("\n")[0].strip().strip('"').strip()  # its first line
    text = re.sub(r"^(\d+\.|message|person|user|request)\s*:?\s*", "", text, flags=re.I)
    if not MIN_CHARS <= len(text) <= MAX_CHARS:
        return None
    if any(echo in text.lower() for echo in ECHOES) or any(e in text for e in EXAMPLES):
        return None
    if sum(c.isalpha() or c.isspace() for c in text) < 0.7 * len(text):
        return None
    return text


def near_copy_key(text: str) -> str:
    """Messages with the same first eight words (case and punctuation aside) count as one."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower())[:8])


def write_requests(write: Writer, rng: random.Random, count: int, batch: int) -> list[str]:
    """``count`` distinct user messages (fewer if the target keeps repeating itself: it
    gets ten times ``count`` instructions at most)."""
    kept: dict[str, str] = {}
    for _ in range(0, 10 * count, batch):
        if len(kept) >= count:
            break
        instructions = [
            request_instruction(rng.choice(list(KINDS)), rng.choice(TOPICS)) for _ in range(batch)
        ]
        for reply in write(instructions, REQUEST_TEMPERATURE, 80):
            message = cleaned(reply)
            if message is not None:
                kept.setdefault(near_copy_key(message), message)
    return list(kept.values())[:count]


def build_chats(
    write: Writer,
    seed: int,
    count: int,
    batch: int = 64,
    multi_turn_every: int = 4,
    system_every: int = 5,
) -> list[list[dict[str, str]]]:
    """``count`` conversations (or fewer, see `write_requests`) ending in a user turn."""
    rng = random.Random(seed)
    requests = write_requests(write, rng, count, batch)
    chats = [[{"role": "user", "content": r}] for r in requests]
    multi = [c for i, c in enumerate(chats) if i % multi_turn_every == multi_turn_every - 1]
    for start in range(0, len(multi), batch):
        group = multi[start : start + batch]
        answers = write([c[0]["content"] for c in group], 0.0, 120)
        pairs = zip(group, answers, strict=True)
        follow_ups = write(
            [follow_up_instruction(c[0]["content"], a) for c, a in pairs], REQUEST_TEMPERATURE, 60
        )
        for chat, answer, follow_up in zip(group, answers, follow_ups, strict=True):
            message = cleaned(follow_up)
            if message is not None and answer.strip():
                chat += [
                    {"role": "assistant", "content": answer.strip()},
                    {"role": "user", "content": message},
                ]
    for i, chat in enumerate(chats):
        if i % system_every == system_every - 1:
            chat.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return chats
