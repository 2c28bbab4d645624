"""Chat requests for distilling the draft, composed from hand-written patterns.

A request is a pattern of its category (the categories people ask a chat model about:
writing, roleplay, reasoning, math, coding, extraction, STEM, humanities, advice, everyday
life; from ``MORE_FROM_SEED`` on, also the wider set in ``more_chat_patterns``) with its
slots filled from hand-written lists, random numbers, names and dates, and
sometimes an opening or a closing phrase ("Can you ...", "... Keep it short."). Requests
with the same first eight words count as one. Every ``multi_turn_every``-th becomes a
two-turn conversation (the target's own answer, then a follow-up from a hand-written
list), and every ``system_every``-th gets a system prompt. Nothing is downloaded, and the
evaluation set (``bench/prompts``) is never read (a test checks that none of its prompts
is composed here).

The target writing the requests itself (self-instruct) was tried first: at 135M
parameters it mostly echoed its instruction or wrote statements rather than requests.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from more_chat_patterns import (
    MORE_FOLLOW_UPS,
    MORE_FROM_SEED,
    MORE_HUMANITIES,
    MORE_PATTERNS,
    MORE_PEOPLE,
    MORE_STEM,
    MORE_SYSTEM_PROMPTS,
    MORE_THINGS,
    more_slots,
)

CITIES = ("Lisbon", "Osaka", "Toronto", "Nairobi", "Lima", "Oslo", "Melbourne", "Prague",
          "Denver", "Chennai", "Cairo", "Dublin", "Seoul", "Mexico City", "Hamburg")  # fmt: skip
NAMES = ("Maria", "James", "Aisha", "Tom", "Yuki", "Carlos", "Priya", "Liam", "Fatima",
         "Noah", "Elena", "Omar", "Grace", "Lucas", "Mei", "Daniel", "Sofia", "Ravi", "Anna",
         "Ben")  # fmt: skip
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")  # fmt: skip
THINGS = (
    "the ocean", "a lighthouse", "an old bicycle", "the first snow", "a lost dog", "the city at "
    "night", "a grandmother's kitchen", "a robot that learns to paint", "a train journey",
    "a quiet library", "autumn leaves", "a summer storm", "a small bakery", "the moon", "a "
    "dragon who collects teapots", "friendship", "moving to a new country", "a garden",
    "a forgotten letter", "the last day of school", "a time machine", "a mountain village",
    "coffee", "a busy airport", "an astronaut", "a detective on holiday", "a haunted house",
    "a market in the morning", "a cat that talks", "a river", "learning to swim", "a storm at sea"
)  # fmt: skip
ROLES = (
    "a pirate captain", "a medieval knight", "a tour guide in Rome", "a grumpy wizard",
    "a detective in 1920s London", "a friendly robot", "a personal trainer", "a chef on a "
    "cooking show", "Sherlock Holmes", "a job interviewer", "a museum guide", "a ship's "
    "doctor", "an alien visiting Earth", "a librarian", "a football coach", "a travel agent",
    "a customer service agent", "a Shakespearean actor", "a tired barista", "a space station "
    "commander", "a village elder", "a news reporter", "a kindergarten teacher", "a poet"
)  # fmt: skip
STEM_TOPICS = (
    "photosynthesis", "black holes", "vaccines", "the water cycle", "plate tectonics", "DNA",
    "electricity", "magnetism", "gravity", "the immune system", "nuclear fusion", "solar "
    "panels", "batteries", "the greenhouse effect", "antibiotics", "the speed of light",
    "evolution", "rainbows", "earthquakes", "volcanoes", "the human heart", "neurons",
    "semiconductors", "GPS", "Wi-Fi", "the internet", "machine learning", "encryption",
    "rockets", "tides", "clouds", "sound waves", "chemical bonds", "enzymes", "climate change",
    "the periodic table", "quantum computers", "bridges", "jet engines", "3D printing"
)  # fmt: skip
STEM_PAIRS = (
    ("a virus", "a bacterium"), ("mass", "weight"), ("speed",
    "velocity"), ("an atom", "a molecule"), ("AC", "DC current"), ("RAM", "storage"),
    ("a comet", "an asteroid"), ("mitosis", "meiosis"), ("heat", "temperature"), ("fission",
    "fusion"), ("an element", "a compound"), ("a star", "a planet"), ("TCP", "UDP")
)  # fmt: skip
HUMANITIES_TOPICS = (
    "the Renaissance", "the Industrial Revolution", "ancient Egypt",
    "the Roman Empire", "the Cold War", "the Silk Road", "democracy in "
    "ancient Athens", "the Harlem Renaissance", "impressionism", "stoicism", "existentialism",
    "utilitarianism", "the Enlightenment", "the fall of the Berlin Wall", "the Ming dynasty",
    "the Aztec empire", "the abolition of slavery", "women's suffrage", "Greek mythology",
    "the Great Depression", "the Magna Carta", "Romantic poetry", "the Reformation", "Baroque "
    "music", "the Meiji Restoration", "colonialism in Africa", "the Olympic Games' history"
)  # fmt: skip
PEOPLE = ("Shakespeare", "Marie Curie", "Socrates", "Confucius", "Leonardo da Vinci",
          "Jane Austen", "Nelson Mandela", "Frida Kahlo", "Isaac Newton", "Mahatma Gandhi",
          "Simone de Beauvoir", "Beethoven", "Ada Lovelace", "Homer")  # fmt: skip
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "counts the vowels in a "
    "sentence", "finds the largest number in a list", "removes duplicates from a list",
    "computes the factorial of n", "merges two sorted lists", "counts how often each word appears "
    "in a text", "converts Celsius to Fahrenheit", "flattens a nested list", "validates an "
    "email address", "sorts a list of dictionaries by a key", "reads a CSV file and sums a "
    "column", "finds the second largest number in a list", "checks whether two words are "
    "anagrams", "computes the average of a list", "capitalizes every word in a sentence",
    "returns the common elements of two lists", "does a binary search", "groups a list of "
    "words by their first letter", "converts a number to binary", "generates a random password"
)  # fmt: skip
LANGUAGES = ("Python", "JavaScript", "Java", "C", "Go", "Rust", "TypeScript", "C++", "SQL",
             "Bash")  # fmt: skip
CODE_CONCEPTS = (
    "recursion", "a closure", "a hash map", "big-O notation", "a race condition", "an API",
    "object-oriented programming", "a linked list", "garbage collection", "a pointer",
    "async and await", "a REST endpoint", "unit tests", "a database index", "git rebase",
    "a stack and a queue", "dependency injection", "a deadlock", "a lambda function",
    "inheritance", "a generator", "version control", "a SQL join", "exceptions"
)  # fmt: skip
ADVICE = (
    "asking my boss for a raise", "preparing for a job interview", "studying for exams",
    "sleeping better", "saving money each month", "starting to run", "learning a new "
    "language", "dealing with a difficult coworker", "making friends in a new city",
    "staying focused when working from home", "planning a wedding on a budget", "giving a "
    "speech", "eating healthier", "choosing a laptop", "writing a resume", "negotiating "
    "rent", "keeping houseplants alive", "getting back into reading", "talking to my "
    "teenager", "organising a small team", "recovering from burnout", "buying a used car"
)  # fmt: skip
EVERYDAY = (
    "make fluffy pancakes", "get a red wine stain out of a carpet", "pack for a week-long "
    "trip", "cook rice without a rice cooker", "keep bread fresh", "clean a cast-iron pan",
    "fix a squeaky door", "plan a picnic", "keep my kitchen organised", "make cold brew "
    "coffee", "choose a good watermelon", "store fresh herbs", "unclog a sink", "save energy "
    "at home", "plan meals for a week", "make a simple tomato soup", "set up a home office",
    "get rid of fruit flies", "wash a wool sweater", "pick a gift for a ten-year-old"
)  # fmt: skip
PATTERNS = {
    "writing": (
        "Write a short story about {thing}.",
        "Write a poem about {thing}.",
        "Write a haiku about {thing}.",
        "Write a limerick about {thing}.",
        "Write an email to my manager asking for {n} days off in {month}.",
        "Write a thank-you note to {name} for helping me move house.",
        "Write a product description for a {adj} {noun}.",
        "Write the opening paragraph of a mystery novel set in {city}.",
        "Write a short speech for {name}'s retirement party.",
        "Write a blog post introduction about {thing}.",
        "Write a letter to a friend describing a trip to {city}.",
        "Write a motivational message for someone starting a new job.",
        "Write a dialogue between two friends arguing about {thing}.",
        "Write a children's bedtime story about {thing}.",
        "Write a short review of a restaurant in {city}.",
        "Write a cover letter for a junior designer position.",
        "Write a complaint email about a delayed delivery.",
        'Rewrite this sentence to sound more formal: "hey, can u send me the report by {weekday}?"',
        "Write a tweet announcing the opening of a bakery in {city}.",
    ),
    "roleplay": (
        "Pretend you are {role}. Introduce yourself.",
        "You are {role}. What is your day like?",
        "Act as {role} and give me advice about {advice}.",
        "Imagine you are {role}. Describe {thing} in your own words.",
        "Let's play a game: you are {role} and I am a visitor. Greet me.",
        "Stay in character as {role} and tell me about your greatest adventure.",
        "Respond as {role} would: why should I visit {city}?",
        "You are {role}. A customer asks you about {thing}. What do you say?",
        "Play the role of {role} explaining {stem} to a child.",
    ),
    "reasoning": (
        "A farmer has {k} sheep. All but {n} run away. How many are left?",
        "What comes next in the sequence {seq}? Explain your reasoning.",
        "{name} has twice as many books as {name2}. Together they have {k3} books. How many does "
        "each have?",
        "I am thinking of a number. If you double it and add {n}, you get {k}. What is it?",
        "There are three boxes: one has apples, one has oranges, one has both. All labels are "
        "wrong. How can you fix the labels by taking out one fruit?",
        "If today is {weekday}, what day will it be in {k} days?",
        "{name} leaves at {n}:00 and the trip takes {m} hours. At what time does {name} arrive?",
        "{name} is older than {name2}, and {name2} is {m} years old. What do we know about "
        "{name}'s age, and what don't we know?",
        "Every {noun} in the box is red or blue, and there are {k} of them. If {n} are red, how "
        "many are blue?",
        'Is this argument valid? "Every {noun} in the shop is on sale. This is a {noun}. So it '
        'is on sale."',
    ),
    "math": (
        "What is {k} times {m}?",
        "What is {k} plus {k2} minus {m}?",
        "What is {p}% of {k}?",
        "What is the area of a rectangle {n} m wide and {m} m long?",
        "Simplify the fraction {a}/{b}.",
        "What is the square root of {sq}?",
        "I buy {n} notebooks at ${m} each and pay with ${c}. How much change do I get?",
        "What is the perimeter of a square with sides of {m} cm?",
        "Convert {k} minutes to hours and minutes.",
        "A shirt costs ${k} and is {p}% off. What is the new price?",
        "What is the probability of rolling a sum of {dice} with two dice?",
        "Find the mean of {nums}.",
        "What is {n} to the power of {e}?",
        "What is the volume of a cube with edges of {n} cm?",
    ),
    "coding": (
        "Write a {lang} function that {task}.",
        "How do I write a function in {lang} that {task}?",
        "Explain {concept} with a simple example.",
        "What is {concept} in {lang}?",
        "Can you write {lang} code that {task}, with comments?",
        'Why does my Python code say "IndexError: list index out of range"?',
        "How do I read a text file line by line in {lang}?",
        "Explain what this code does: for i in range({n}): print(i * {m})",
        "What is the time complexity of a function that {task}?",
        "Write a SQL query that finds the {n} most expensive products in a table called products.",
        'How do I fix "TypeError: can only concatenate str (not "int") to str" in Python?',
        "Write unit tests for a function that {task}.",
    ),
    "extraction": (
        "Extract all the names and dates from this text: {passage}",
        "List the key points of this text: {passage}",
        "From the following note, which cities are mentioned? {passage}",
        "Summarize this in one sentence: {passage}",
        "What numbers appear in this text, and what do they refer to? {passage}",
        "Turn this text into a bulleted list of facts: {passage}",
        "Who is mentioned in this paragraph, and what did each person do? {passage}",
        "Return the people and places in this text as JSON: {passage}",
    ),
    "stem": (
        "Explain how {stem} works.",
        "What is the difference between {pair0} and {pair1}?",
        "Why is {stem} important?",
        "Explain {stem} to a ten-year-old.",
        "What are the main facts about {stem}?",
        "How do scientists study {stem}?",
        "What would happen if there were no {stem}?",
        "Give me three fun facts about {stem}.",
        "What are common misconceptions about {stem}?",
    ),
    "humanities": (
        "What were the main causes of {hist}?",
        "Why was {hist} important?",
        "Who was {person}, and why are they remembered?",
        "Summarize the ideas of {hist}.",
        "What can we learn today from {hist}?",
        "Compare {hist} and {hist2}.",
        "What did {person} contribute to their field?",
        "Explain {hist} in simple terms.",
        "What is the main argument of stoicism, and is it still useful?",
        "How did {hist} change everyday life?",
    ),
    "advice": (
        "Do you have any tips for {advice}?",
        "I need advice on {advice}.",
        "What should I keep in mind when {advice}?",
        "How do I get better at {advice}?",
        "What are common mistakes people make when {advice}?",
    ),
    "everyday": (
        "How do I {chore}?",
        "What is the easiest way to {chore}?",
        "Can you give me step-by-step instructions to {chore}?",
        "Give me a shopping list for a dinner for {n} people.",
        "What can I cook with eggs, spinach and cheese?",
        "What should I do on a rainy weekend in {city}?",
        "Plan a {n}-day trip to {city} for me.",
    ),
}
OPENINGS = ("", "", "", "", "Can you help me? ", "Please answer this: ", "Quick question: ",
            "Hi! ", "I have a question. ")  # fmt: skip
CLOSINGS = ("", "", "", "", " Keep it short.", " Explain step by step.",
            " Please be detailed.", " Use simple words.",
            " Answer in three sentences.")  # fmt: skip
FOLLOW_UPS = (
    "Can you make that shorter?",
    "Can you give me an example?",
    "Why is that?",
    "Can you explain that in simpler words?",
    "Thanks! What else should I know?",
    "Can you put that in a list?",
    "What would you change to make it better?",
    "Can you say more about the first point?",
    "Is there another way to do it?",
    "That's great. Can you make it more formal?",
    "How would you explain that to a child?",
    "What are the downsides?",
    "Can you summarise your answer in one sentence?",
)
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
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ADJECTIVES = ("handmade", "foldable", "solar-powered", "smart", "vintage", "kids'")
NOUNS = ("chair", "lamp", "book", "shirt", "kettle", "bicycle")

FIRST_ANSWER_TOKENS = 96  # the target's first answer in a two-turn conversation
# write(prompts, temperature, max_tokens) -> the target's replies, one per prompt
Writer = Callable[[list[str], float, int], list[str]]


def passage(rng: random.Random) -> str:
    """A short made-up note with people, places, dates and numbers to extract."""
    a, b, c = rng.sample(NAMES, 3)
    city, city2 = rng.sample(CITIES, 2)
    month, day, year = rng.choice(MONTHS), rng.randint(1, 28), rng.randint(1990, 2025)
    sentences = [
        f"On {month} {day}, {year}, {a} flew from {city} to {city2} to meet {b}.",
        f"{b} had booked {rng.randint(2, 9)} rooms at a hotel near the station.",
        f"The meeting about the new {rng.choice(THINGS)} project lasted {rng.randint(2, 6)} hours.",
        f"{c} joined by video and promised a budget of {rng.randint(5, 90)},000 dollars.",
        f"They agreed to meet again in {rng.choice(MONTHS)} in {rng.choice(CITIES)}.",
        f"{a} wrote the minutes and sent them to {rng.randint(3, 15)} colleagues.",
    ]
    return " ".join(sentences[: rng.randint(3, len(sentences))])


def slots(rng: random.Random) -> dict[str, object]:
    """One random filling for every slot a pattern may have."""
    names = rng.sample(NAMES, 2)
    pair = rng.choice(STEM_PAIRS)
    hist, hist2 = rng.sample(HUMANITIES_TOPICS, 2)
    n, m = rng.randint(2, 12), rng.randint(2, 20)
    start, step = rng.randint(1, 9), rng.randint(2, 5)
    seq = (
        [start + step * i for i in range(5)]
        if rng.random() < 0.5
        else [start * step**i for i in range(5)]
    )
    b = rng.randint(4, 60)
    return {
        "thing": rng.choice(THINGS), "role": rng.choice(ROLES), "stem": rng.choice(STEM_TOPICS),
        "pair0": pair[0], "pair1": pair[1], "hist": hist, "hist2": hist2,
        "person": rng.choice(PEOPLE), "task": rng.choice(CODE_TASKS),
        "lang": rng.choice(LANGUAGES), "concept": rng.choice(CODE_CONCEPTS),
        "advice": rng.choice(ADVICE), "chore": rng.choice(EVERYDAY), "city": rng.choice(CITIES),
        "name": names[0], "name2": names[1], "month": rng.choice(MONTHS),
        "weekday": rng.choice(WEEKDAYS), "adj": rng.choice(ADJECTIVES),
        "noun": rng.choice(NOUNS), "n": n, "m": m, "k": rng.randint(12, 999),
        "k2": rng.randint(100, 5000), "k3": 3 * rng.randint(5, 40),
        "p": rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 75)),
        "a": b * rng.randint(1, 5) // rng.randint(1, 3) or 1, "b": b, "sq": rng.randint(2, 30) ** 2,
        "c": n * m + rng.randint(1, 30), "e": rng.randint(2, 5), "dice": rng.randint(2, 12),
        "nums": ", ".join(str(rng.randint(1, 99)) for _ in range(rng.randint(4, 7))),
        "seq": ", ".join(map(str, seq[:4])), "passage": passage(rng),
    }  # fmt: skip


def wider_slots(rng: random.Random) -> dict[str, object]:
    """The slots of both sets, the first set's topic lists widened by the second's."""
    filled = slots(rng) | more_slots(rng)
    others = [name for name in NAMES if name not in (filled["name"], filled["name2"])]
    filled.update(
        thing=rng.choice(THINGS + MORE_THINGS),
        stem=rng.choice(STEM_TOPICS + MORE_STEM),
        hist=rng.choice(HUMANITIES_TOPICS + MORE_HUMANITIES),
        person=rng.choice(PEOPLE + MORE_PEOPLE),
        name3=rng.choice(others),
    )
    return filled


WIDER_PATTERNS = {
    category: PATTERNS.get(category, ()) + MORE_PATTERNS.get(category, ())
    for category in PATTERNS | MORE_PATTERNS
}


def compose(rng: random.Random, wider: bool = False) -> str:
    """One request: a category, one of its patterns filled in, maybe an opening or closing
    (``wider``: from both pattern sets)."""
    patterns = WIDER_PATTERNS if wider else PATTERNS
    pattern = rng.choice(patterns[rng.choice(list(patterns))])
    request = pattern.format(**(wider_slots(rng) if wider else slots(rng)))
    return rng.choice(OPENINGS) + request + rng.choice(CLOSINGS)


def near_copy_key(text: str) -> str:
    """Messages with the same first eight words (case and punctuation aside) count as one."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower())[:8])


def compose_requests(rng: random.Random, count: int, wider: bool = False) -> list[str]:
    """``count`` distinct requests (fewer if the patterns run out: 50 tries each at most)."""
    kept: dict[str, str] = {}
    for _ in range(50 * count):
        if len(kept) >= count:
            break
        request = compose(rng, wider)
        kept.setdefault(near_copy_key(request), request)
    return list(kept.values())


def build_chats(
    write: Writer,
    seed: int,
    count: int,
    batch: int = 64,
    multi_turn_every: int = 4,
    system_every: int = 5,
) -> list[list[dict[str, str]]]:
    """``count`` conversations (or fewer, see `compose_requests`) ending in a user turn; the
    target answers the first turn of the two-turn ones (greedy). Seeds from
    ``MORE_FROM_SEED`` on draw from both pattern sets and their follow-ups and system
    prompts."""
    rng = random.Random(seed)
    wider = seed >= MORE_FROM_SEED
    follow_ups = FOLLOW_UPS + MORE_FOLLOW_UPS if wider else FOLLOW_UPS
    system_prompts = SYSTEM_PROMPTS + MORE_SYSTEM_PROMPTS if wider else SYSTEM_PROMPTS
    chats = [[{"role": "user", "content": r}] for r in compose_requests(rng, count, wider)]
    multi = [c for i, c in enumerate(chats) if i % multi_turn_every == multi_turn_every - 1]
    for start in range(0, len(multi), batch):
        group = multi[start : start + batch]
        answers = write([c[0]["content"] for c in group], 0.0, FIRST_ANSWER_TOKENS)
        for chat, answer in zip(group, answers, strict=True):
            if answer.strip():
                chat += [
                    {"role": "assistant", "content": answer.strip()},
                    {"role": "user", "content": rng.choice(follow_ups)},
                ]
    for i, chat in enumerate(chats):
        if i % system_every == system_every - 1:
            chat.insert(0, {"role": "system", "content": rng.choice(system_prompts)})
    return chats
