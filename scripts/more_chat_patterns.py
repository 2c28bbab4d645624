"""A second, wider set of chat patterns (``chat_requests``), drawn by the seeds from
``MORE_FROM_SEED`` on beside the first set.

The first set (103 patterns with short slot lists) was the limit of the chat runs: twice
its conversations lifted the draft's validation agreement by 0.018. This set adds kinds of
request the first lacks (opinions and comparisons, brainstorming, language and grammar,
general knowledge, editing a text the user pastes, planning, health, money, help with
software, jokes and games, relationships, classification), more patterns in the first
set's categories (word problems, algebra, code to debug, texts to rewrite), and longer slot
lists. It is written by hand from everyday experience of chat assistants, never from the
evaluation set (``bench/prompts``); a test checks that no request any seed composes is close
to one of its prompts. The seeds before ``MORE_FROM_SEED`` compose as they always did, so
the runs on record keep their conversations.
"""

from __future__ import annotations

import random

MORE_FROM_SEED = 3

FOODS = ("lentils", "tofu", "sweet potatoes", "salmon", "chickpeas", "mushrooms", "quinoa",
         "avocado", "oats", "chicken thighs", "broccoli", "eggplant", "yogurt", "leftover rice",
         "frozen peas", "canned tuna", "bananas", "apples", "pasta", "black beans")  # fmt: skip
HOBBIES = ("painting", "chess", "gardening", "photography", "knitting", "rock climbing",
           "playing the guitar", "bird watching", "baking bread", "woodworking", "yoga",
           "learning to draw", "cycling", "board games", "journaling", "pottery")  # fmt: skip
COUNTRIES = ("Japan", "Brazil", "Kenya", "Norway", "India", "Canada", "Peru", "Vietnam",
             "Morocco", "New Zealand", "Italy", "Iceland", "Mexico", "Egypt", "Portugal",
             "Thailand", "Chile", "Greece", "Turkey", "Scotland")  # fmt: skip
ANIMALS = ("octopuses", "crows", "elephants", "honeybees", "wolves", "dolphins", "tardigrades",
           "penguins", "cats", "axolotls", "ants", "owls", "sharks", "koalas", "bats")  # fmt: skip
JOBS = ("nurse", "software engineer", "electrician", "teacher", "accountant", "architect",
        "pilot", "pharmacist", "data analyst", "carpenter", "social worker", "chef",
        "graphic designer", "lawyer", "veterinarian", "firefighter")  # fmt: skip
APPS = ("Excel", "Google Sheets", "Word", "PowerPoint", "my iPhone", "my Android phone",
        "Windows", "my Mac", "Gmail", "Zoom", "Git", "VS Code", "Linux", "a Wi-Fi router",
        "Slack", "a Raspberry Pi")  # fmt: skip
APP_TASKS = ("take a screenshot", "free up storage", "back up my files", "make a chart",
             "remove duplicate rows", "share my screen", "undo the last change",
             "find large files", "set up two-factor authentication", "change the default "
             "font", "speed it up", "schedule a message", "recover a deleted file",
             "create a shortcut")  # fmt: skip
EVENTS = ("a birthday party for a seven-year-old", "a team offsite", "a baby shower",
          "a surprise anniversary dinner", "a book club meeting", "a neighbourhood clean-up",
          "a charity bake sale", "a family reunion", "a farewell party for a colleague",
          "a board game night", "a small outdoor wedding", "a school science fair")  # fmt: skip
PRODUCT_PAIRS = (
    ("an electric car", "a hybrid"), ("renting", "buying a home"), ("a laptop", "a tablet"),
    ("an e-reader", "paper books"), ("a gym membership", "working out at home"),
    ("a cat", "a dog"), ("coffee", "tea"), ("a Kindle", "an iPad"), ("the train", "flying"),
    ("a credit card", "a debit card"), ("public school", "private school"),
    ("city life", "country life"), ("an air fryer", "an oven"),
    ("learning piano", "learning guitar"),
    ("a standing desk", "a normal desk"), ("freelancing", "a full-time job")
)  # fmt: skip
CONFUSED_WORDS = (
    ("affect", "effect"), ("fewer", "less"), ("its", "it's"), ("who", "whom"),
    ("lay", "lie"), ("then", "than"), ("complement", "compliment"), ("principal", "principle"),
    ("ensure", "insure"), ("farther", "further"), ("i.e.", "e.g."), ("discreet", "discrete"),
    ("may", "might"), ("historic", "historical")
)  # fmt: skip
PHRASES = ("Where is the nearest train station?", "I would like to book a table for two.",
           "Thank you for your help yesterday.", "How much does this cost?", "I am allergic "
           "to nuts.", "Could you speak more slowly, please?", "Happy birthday, my friend!",
           "The meeting has been moved to Friday.", "I lost my passport.", "What time does "
           "the museum open?", "Nice to meet you.", "See you tomorrow morning.")  # fmt: skip
TARGET_LANGUAGES = ("Spanish", "French", "German", "Italian", "Portuguese", "Japanese",
                    "Dutch", "Swedish")  # fmt: skip
TOPICS = ("social media", "remote work", "homework", "electric scooters", "four-day work "
          "weeks", "self-driving cars", "zoos", "nuclear power", "school uniforms", "fast "
          "fashion", "video games", "space tourism", "tipping", "smartphones for children",
          "online dating", "AI art", "daylight saving time", "city bike lanes", "standardised "
          "tests", "working at night")  # fmt: skip
SKILLS = ("public speaking", "touch typing", "cooking without recipes", "time management",
          "mental arithmetic", "drawing faces", "writing clearly", "negotiating", "listening",
          "remembering names", "swimming", "budgeting", "sketching", "meditation")  # fmt: skip
SYMPTOMS = ("a mild headache after work", "trouble falling asleep", "sore muscles after a "
            "run", "a stiff neck from my desk", "feeling tired in the afternoon", "dry eyes "
            "from screens", "a cold that won't go away", "back pain when I sit",
            "heartburn after dinner", "seasonal allergies")  # fmt: skip
MORE_THINGS = ("a broken umbrella", "an empty stadium", "the smell of rain", "a message in a "
               "bottle", "a village without electricity", "the last bookshop in town",
               "a clock that runs backwards", "two rival bakers", "a night shift nurse",
               "an abandoned amusement park", "a letter from the future", "a stray kitten",
               "a lighthouse keeper's diary", "winter in the mountains", "a first day at "
               "university", "a very old tree", "a jazz club", "a missing painting")  # fmt: skip
MORE_STEM = ("photosynthesis in the deep sea", "the placebo effect", "CRISPR", "dark matter",
             "the Doppler effect", "entropy", "ocean currents", "the ozone layer", "lightning",
             "fermentation", "insulin", "carbon dating", "superconductors", "LED lights",
             "hurricanes", "the nitrogen cycle", "lasers", "the microbiome", "blood types",
             "radio waves", "compound interest", "solar eclipses", "hydrogen fuel")  # fmt: skip
MORE_HUMANITIES = ("the Hanseatic League", "the Ottoman Empire",
                   "the Byzantine Empire", "the civil rights movement", "the Cuban missile "
                   "crisis", "Buddhism", "the Mughal Empire", "Norse mythology", "cubism",
                   "the Inca road system", "the invention of writing", "the Marshall Plan",
                   "Gothic architecture", "the Scientific Revolution", "haiku poetry",
                   "the Columbian exchange", "the Hundred Years' War")  # fmt: skip
MORE_PEOPLE = ("Charles Darwin", "Cleopatra", "Galileo", "Toni Morrison", "Napoleon",
               "Rosalind Franklin", "Mozart", "Alan Turing", "Harriet Tubman", "Plato",
               "Vincent van Gogh", "Ibn Battuta", "Albert Einstein", "Virginia Woolf")  # fmt: skip
TEXTS_TO_EDIT = (
    "hi team, just wanted to say the deadline is moved to next week cause the client didnt "
    "send the files yet, so dont worry about it for now, thanks",
    "Our company are committed to provide the best service for all of our customer's and we "
    "always tries to answer emails within one days.",
    "The new park is great. It has trees. It has a pond. It has a playground. Kids like it. "
    "Parents like it too.",
    "i think we should maybe consider possibly looking into the option of perhaps changing "
    "the supplier at some point in the future if that is ok",
    "Dear sir, I am writing to you because I want to complain. The product broke. I want my "
    "money. It was bad.",
    "The results of the survey shows that most people prefers to work from home two or three "
    "days a week, however some people wants to be in the office every day.",
    "me and my friend went to the concert last night and it was so good, the band played for "
    "like three hours and everyone was singing",
    "Due to the fact that the weather was bad, the event was cancelled, and in spite of the "
    "fact that we tried, we could not find another date.",
    "Climate change is a big problem. Many scientists agree. We need to act. Governments and "
    "people can help by using less energy.",
    "The app is slow and it crashes sometimes and the buttons are too small and I cant find "
    "the settings and the colors hurt my eyes.",
)  # fmt: skip
BUGGY_CODE = (
    "def average(nums):\n    return sum(nums) / len(nums) + 1",
    "for i in range(1, 10):\n    if i % 2 = 0:\n        print(i)",
    "def is_even(n):\n    if n % 2 == 1:\n        return True\n    return False",
    "names = ['a', 'b', 'c']\nfor i in range(len(names) + 1):\n    print(names[i])",
    "function add(a, b) {\n  return a + b\n}\nconsole.log(add('2', 3))",
    "total = 0\nfor x in [1, 2, 3]:\n    total = x\nprint(total)",
    "def greet(name):\n    print('Hello ' + name)\n\nmsg = greet('Ana')\nprint(msg.upper())",
    "SELECT name, COUNT(*) FROM orders WHERE COUNT(*) > 5 GROUP BY name;",
    "items = {}\nitems.append('apple')",
    "def fib(n):\n    return fib(n - 1) + fib(n - 2)",
)  # fmt: skip
WIDER_CODE_TASKS = (  # the wider seeds' list, in place of the first set's
    "reverses the words in a sentence", "tells whether a number is prime", "counts the vowels "
    "in a string", "returns the largest and smallest number in a list", "removes duplicates "
    "from a list but keeps the order", "computes n factorial", "merges two sorted lists",
    "counts word frequencies in a text file", "converts Fahrenheit to Celsius", "flattens a "
    "nested list", "parses a date string", "tells whether a list is sorted", "rotates a list "
    "by k positions", "counts the lines in a file", "finds the longest word in a sentence",
    "converts a Roman numeral to an integer", "splits a list into chunks of size n",
    "computes the GCD of two numbers", "tells whether brackets are balanced", "transposes a "
    "matrix", "retries a function call up to three times", "caches the results of a slow "
    "function", "validates a phone number", "reads a JSON file and prints one field", "sorts "
    "people by age, then by name", "generates the first n Fibonacci numbers", "shuffles a "
    "deck of cards", "finds pairs in a list that add up to a target"
)  # fmt: skip
CATEGORIES_TO_SORT = (
    ("fruit or vegetable", "tomato, carrot, apple, cucumber, banana, pumpkin"),
    ("mammal, bird or reptile", "bat, penguin, crocodile, whale, ostrich, gecko"),
    ("renewable or not", "coal, wind, solar, natural gas, hydro, oil"),
    ("positive, negative or neutral", "'I love it', 'It arrived on Tuesday', 'Never again'"),
    ("noun, verb or adjective", "run, happy, table, quickly, blue, jump"),
    ("planet or moon", "Titan, Mars, Europa, Venus, Io, Neptune"),
)  # fmt: skip
MORE_FOLLOW_UPS = ("Can you give me a different example?", "What if I only had half the time?",
                   "Could you add a short title?", "Which of those would you pick, and why?",
                   "Can you make it funnier?", "How sure are you about that?", "Can you "
                   "turn that into a table?", "Great, now translate it into French.",
                   "Can you check your answer?", "What's a common mistake here?",
                   "Make it suitable for a ten-year-old.", "Give me two more ideas.")  # fmt: skip
MORE_SYSTEM_PROMPTS = (
    "You are a support agent for an online shop. Be polite and brief.",
    "You are a fitness coach. Give practical advice, not medical diagnoses.",
    "You are a tutor for high-school maths. Show your working.",
    "You are an editor. Improve the user's writing and explain the main changes.",
    "You are a travel assistant who knows about local food and customs.",
    "Always answer in a numbered list.",
    "You are a witty assistant who likes a good pun.",
    "You are a senior engineer doing code review.",
)
MORE_PATTERNS = {
    "writing": (
        "Write a short poem about {thing} in the style of a nursery rhyme.",
        "Write a wedding toast for my friends {name} and {name2}.",
        "Write a LinkedIn post announcing that I started a new job as a {job}.",
        "Write a short horror story that starts in {city}.",
        "Write song lyrics about {thing}.",
        "Write an apology email to a customer whose order arrived late.",
        "Write a persuasive paragraph about {topic}.",
        "Write a six-word story about {thing}.",
        "Write an invitation for {event}.",
        "Write a short fable with animals that teaches a lesson about patience.",
        "Give me a catchy slogan for a {adj} {noun} company.",
        "Write a scene where {name} finds {thing}.",
    ),
    "roleplay": (
        "You are {role}, and I just arrived late. React.",
        "Let's practise a job interview for a {job} position. You are the interviewer.",
        "Be my Spanish waiter: I want to order dinner, and correct my mistakes.",
        "Pretend to be {person} and answer: what are you most proud of?",
        "Roleplay a customer who wants to return a {noun}. I'm the shop assistant.",
        "You are a tour guide in {country}. What should I see first?",
    ),
    "reasoning": (
        "{name} is taller than {name2}, and {name2} is taller than {name3}. Who is shortest?",
        "A train leaves at {n}:15 and travels {speed} km/h. How far has it gone by {n2}:45?",
        "Is it a good idea to {choice}? Think through the pros and cons.",
        "There are {n} people in a room and everyone shakes hands once with everyone else. "
        "How many handshakes are there?",
        "If all {animal} can swim and {name}'s pet is one of them, what follows?",
    ),
    "math": (
        "What value of x makes {linear} true?",
        "Solve the equation {quadratic}.",
        "If I invest ${k2} at {r}% interest a year, how much will I have after {n} years?",
        "What is {frac1} plus {frac2}?",
        "How many seconds are there in {n} days?",
        "What is the least common multiple of {n} and {m}?",
        "A recipe for {n} people needs {m}00 g of flour. How much do I need for {n2} people?",
        "Round {decimal} to two decimal places.",
        "What is the slope of the line through ({n}, {m}) and ({n2}, {k3})?",
        "Is {k} a prime number?",
        "Convert {k} kilometres to miles.",
    ),
    "coding": (
        "What's wrong with this code?\n{code}",
        "This code doesn't work as expected. Can you fix it?\n{code}",
        "What is the difference between {concept_a} and {concept_b}?",
        "How do I install a package in {lang}?",
        "Write a regular expression that matches {regex}.",
        "Give me a Bash one-liner to {shell}.",
        "Refactor this to be more readable:\n{code}",
        "Write a Python class for a {noun} with a few useful methods.",
    ),
    "extraction": (
        "Fix the grammar in this text: {draft}",
        "What is the tone of this message? {draft}",
        "Pull out the action items from this message: {draft}",
        "Classify each of these as {sort0}: {sort1}",
        "How many sentences are in this text, and what is the main one? {draft}",
    ),
    "stem": (
        "Explain {stem} in simple terms.",
        "How does {stem} affect everyday life?",
        "What is the history of {stem}?",
        "Why do {animal} behave the way they do?",
        "What are the biggest open questions about {stem}?",
        "How would you explain {stem} with an analogy?",
    ),
    "humanities": (
        "What was life like for ordinary people during {hist}?",
        "What is {person} best known for?",
        "What is the legacy of {hist}?",
        "Give me a timeline of {hist}.",
        "What would {person} think about {topic}?",
        "What are the main themes of {genre} novels?",
    ),
    "opinion": (
        "What are the pros and cons of {topic}?",
        "Which is better, {prod0} or {prod1}?",
        "Should I choose {prod0} or {prod1}? I have a small budget.",
        "What do people argue about when it comes to {topic}?",
        "Give me arguments for and against {topic}.",
        "Is {topic} good or bad for society?",
    ),
    "brainstorm": (
        "Give me {n} ideas for {event}.",
        "Suggest {n} names for a {adj} {noun} shop.",
        "What are some fun things to do in {country}?",
        "Give me ideas for a weekend hobby like {hobby}.",
        "Suggest {n} gift ideas for someone who loves {hobby}.",
        "List {n} blog post ideas about {hobby}.",
        "What could I cook with {food} and {food2}?",
    ),
    "language": (
        "What is the difference between {word0} and {word1}?",
        'Translate into {target_lang}: "{phrase}"',
        'How do you say "{phrase}" in {target_lang}?',
        "Give me {n} synonyms for the word 'happy'.",
        "What does the idiom 'break the ice' mean?",
        "Explain when to use a semicolon.",
        "Is this sentence correct? {draft}",
    ),
    "knowledge": (
        "What is the capital of {country}, and what is it known for?",
        "Tell me some interesting facts about {animal}.",
        "How long do {animal} live?",
        "What language do people speak in {country}?",
        "What does a {job} do all day?",
        "What is the history of {food} as a food?",
        "Why is {country} famous for its food?",
    ),
    "editing": (
        "Make this sound more professional: {draft}",
        "Shorten this to one sentence: {draft}",
        "Rewrite this so it is friendlier: {draft}",
        "Proofread this and list what you changed: {draft}",
        "Make this easier to read: {draft}",
    ),
    "planning": (
        "Make me a {n}-week plan to get better at {skill}.",
        "Plan my Saturday: I want to do {hobby}, see friends and rest.",
        "Help me plan {event}.",
        "Create a weekly budget for someone earning ${k2} a month.",
        "Make a study schedule for an exam in {n} weeks.",
        "Plan a {n}-day itinerary for {country} on a budget.",
    ),
    "health": (
        "What can I do about {symptom}?",
        "Is it healthy to eat {food} every day?",
        "Give me a {n}-minute workout I can do at home.",
        "How much water should I drink in a day?",
        "What are good habits for {symptom}?",
        "What are some healthy breakfasts with {food}?",
    ),
    "money": (
        "How do I start saving for retirement at {age}?",
        "Explain compound interest with an example of ${k2}.",
        "What is a good way to pay off ${k2} of credit card debt?",
        "How does a mortgage work?",
        "Should I keep an emergency fund, and how big?",
        "What is the difference between stocks and bonds?",
    ),
    "tech_help": (
        "How do I {app_task} in {app}?",
        "{app} is really slow. What can I try?",
        "What is the fastest way to {app_task} on {app}?",
        "My Wi-Fi keeps disconnecting. What should I check?",
        "How do I make a pivot table in Excel?",
        "Explain what a VPN does and whether I need one.",
    ),
    "fun": (
        "Tell me a joke about {animal}.",
        "Give me a riddle and don't tell me the answer yet.",
        "Let's play twenty questions. I'm thinking of an animal.",
        "Tell me a pun about {food}.",
        "Write a funny review of {thing}.",
        "Make up a tongue twister about {animal}.",
    ),
    "relationships": (
        "My friend {name} forgot my birthday. How should I bring it up?",
        "How do I tell my roommate to clean up without starting a fight?",
        "My coworker keeps taking credit for my work. What should I do?",
        "How can I support a friend who is going through a hard time?",
        "How do I say no to extra work politely?",
        "What is a kind way to end a friendship that isn't working?",
    ),
}
REGEXES = ("a US zip code", "an email address", "a date like 2024-05-17", "a hex colour like "
           "#a1b2c3", "a time like 09:45", "words that start with a capital letter")  # fmt: skip
SHELL_TASKS = ("count the files in a folder", "find all .txt files modified today", "replace "
               "a word in every file", "show the ten largest files", "print the last 20 lines "
               "of a log", "kill the process on port 8080")  # fmt: skip
CHOICES = ("quit my job to travel for a year", "adopt a second cat", "move to a smaller flat "
           "to save money", "learn to code at forty", "buy a house with a friend",
           "take a gap year before university")  # fmt: skip
GENRES = ("dystopian", "detective", "romance", "science fiction", "fantasy", "historical",
          "coming-of-age", "gothic")  # fmt: skip
CONCEPTS = ("a set", "a dictionary", "a class", "a function", "a thread", "a process", "SQL",
            "NoSQL", "compiling", "interpreting", "a library", "a framework", "HTTP",
            "HTTPS", "a stack", "a heap")  # fmt: skip


def more_slots(rng: random.Random) -> dict[str, object]:
    """The slots only ``MORE_PATTERNS`` fill, and its own ``task`` list (``chat_requests.
    wider_slots`` adds the first set's slots, widened)."""
    n2 = rng.randint(13, 23)  # above the first set's n
    x, a = rng.randint(-9, 15), rng.randint(2, 9)
    b = rng.randint(-20, 30)
    r1, r2 = rng.randint(-6, 8), rng.randint(-6, 8)
    words, prod = rng.choice(CONFUSED_WORDS), rng.choice(PRODUCT_PAIRS)
    sort = rng.choice(CATEGORIES_TO_SORT)
    concept, concept2 = rng.sample(CONCEPTS, 2)
    food, food2 = rng.sample(FOODS, 2)
    return {
        "food": food, "food2": food2, "hobby": rng.choice(HOBBIES),
        "country": rng.choice(COUNTRIES), "animal": rng.choice(ANIMALS), "job": rng.choice(JOBS),
        "app": rng.choice(APPS), "app_task": rng.choice(APP_TASKS), "event": rng.choice(EVENTS),
        "prod0": prod[0], "prod1": prod[1], "word0": words[0], "word1": words[1],
        "phrase": rng.choice(PHRASES), "target_lang": rng.choice(TARGET_LANGUAGES),
        "topic": rng.choice(TOPICS), "skill": rng.choice(SKILLS),
        "symptom": rng.choice(SYMPTOMS), "draft": rng.choice(TEXTS_TO_EDIT),
        "code": rng.choice(BUGGY_CODE), "task": rng.choice(WIDER_CODE_TASKS),
        "concept_a": concept, "concept_b": concept2, "regex": rng.choice(REGEXES),
        "shell": rng.choice(SHELL_TASKS), "choice": rng.choice(CHOICES),
        "genre": rng.choice(GENRES), "sort0": sort[0], "sort1": sort[1], "n2": n2,
        "speed": 10 * rng.randint(3, 12), "r": rng.choice((2, 3, 4, 5, 6, 8)),
        "linear": f"{a}x + {b} = {a * x + b}".replace("+ -", "- "),
        "quadratic": f"x^2 + {-(r1 + r2)}x + {r1 * r2} = 0".replace("+ -", "- "),
        "frac1": f"{rng.randint(1, 4)}/{rng.randint(5, 9)}",
        "frac2": f"{rng.randint(1, 4)}/{rng.randint(5, 9)}",
        "decimal": f"{rng.uniform(0, 100):.5f}", "age": rng.choice((22, 25, 30, 35, 40, 45, 50)),
    }  # fmt: skip
