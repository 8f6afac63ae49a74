"""User requests of the synthetic benchmark: templates x entities x phrasings, split by template.

Three classes of request:
    exact   names one tool's job and carries every argument value ("Is it raining in Oslo?"):
            the tool is clear from the text and the call's values can be copied from it
    vague   asks for a family's kind of help without saying which tool or which values ("Look
            something up for me."): the ground truth is one of the listed tools of that family with
            values drawn at random, so a model can only guess the tool name and the values
    answer  greetings, chit-chat, small facts: no tool

Every template has an id (``weather_lookup:e3``, ``search:v1``, ``answer:7``). Every third
template of each list (index % 3 == 2) belongs to the test split, the rest to training, so the
held-out prompts are new sentences, not new draws from the training sentences. A phrasing wrapper
(prefix / suffix, shared by both splits and all classes) multiplies the variety without saying
anything about the class.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["REQUEST_CLASSES", "Request", "make_request", "request_class", "template_ids"]

REQUEST_CLASSES = ("exact", "vague", "answer")
SPLITS = ("train", "test")
_R = random.Random

_CITIES = [
    "Paris",
    "Tokyo",
    "Oslo",
    "Cairo",
    "Lima",
    "Berlin",
    "Madrid",
    "Toronto",
    "Sydney",
    "Nairobi",
    "Seoul",
    "Dublin",
    "Chicago",
    "Mumbai",
    "Lisbon",
    "Prague",
    "Denver",
    "Vienna",
    "Bangkok",
    "Boston",
    "Rome",
    "Athens",
    "Lagos",
    "Quito",
    "Hanoi",
    "Zurich",
    "Miami",
    "Dallas",
    "Perth",
    "Accra",
    "Tunis",
    "Bogota",
]
_TOPICS = [
    "electric cars", "the stock market", "space exploration", "climate policy", "the Olympics",
    "artificial intelligence", "housing prices", "renewable energy", "the World Cup", "vaccines",
    "cryptocurrency", "video games", "the film festival", "public transport", "solar panels",
    "ocean plastic", "wildfires", "the elections", "coffee prices", "robotics",
]  # fmt: skip
_SYMBOLS = [
    "AAPL",
    "MSFT",
    "TSLA",
    "AMZN",
    "NVDA",
    "GOOG",
    "META",
    "IBM",
    "INTC",
    "NFLX",
    "ORCL",
    "SAP",
    "ADBE",
    "UBER",
    "SHOP",
    "AMD",
]
_TITLES = [
    "Photosynthesis", "The Roman Empire", "Marie Curie", "Black holes", "The Great Wall",
    "Plate tectonics", "Jazz", "The printing press", "Volcanoes", "Ada Lovelace", "The Amazon River",
    "Quantum computing", "Ancient Egypt", "The Moon landing", "Honeybees", "Glaciers", "The Silk Road",
    "Mount Everest", "Coral reefs", "The Renaissance",
]  # fmt: skip
_QUERIES = [
    "best hiking trails near {city}", "cheap flights to {city}", "vegan restaurants in {city}",
    "museums in {city}", "how to learn {lang}", "{lang} tutorial for beginners", "used bikes in {city}",
    "{lang} books", "jobs in {city}", "hotels in {city}",
]  # fmt: skip
_LANGS = ["Python", "Spanish", "guitar", "chess", "Rust", "painting", "French", "SQL", "piano", "yoga"]
_UNITS = [
    ("km", "miles"), ("miles", "km"), ("kg", "pounds"), ("pounds", "kg"), ("celsius", "fahrenheit"),
    ("meters", "feet"), ("liters", "gallons"), ("inches", "cm"), ("feet", "meters"), ("grams", "ounces"),
]  # fmt: skip
_CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CAD", "CHF", "AUD", "INR"]
_NAMES = ["Alex", "Sam", "Maria", "Ken", "Priya", "Omar", "Lena", "Tom", "Yuki", "Ana", "Ben", "Zoe"]
_ANIMALS = ["cats", "dogs", "penguins", "owls", "frogs", "horses", "bees", "whales"]
_THINGS = ["autumn", "the", "sea", "coffee", "mountains", "friendship", "rain", "music", "the", "city"]
_WORDS = ["happy", "fast", "bright", "quiet", "cold", "tall", "early", "soft"]

# exact templates per tool: {q} is the search tool's one argument, copied verbatim into the call
_SEARCH_TEMPLATES = {
    "web_search": [
        "Search the web for {q}.", "Can you search online for {q}?", "Find web results about {q}.",
        "Google {q} for me.", "Look up {q} on the internet.", "Run a web search on {q}.",
    ],
    "news_lookup": [
        "What is the latest news about {q}?", "Get me recent headlines on {q}.", "Any news on {q} today?",
        "What are the papers saying about {q}?", "Show me news stories on {q}.", "Catch me up on {q} news.",
    ],
    "weather_lookup": [
        "What's the weather in {q} right now?", "Is it raining in {q} today?", "Check the weather in {q}.",
        "How warm is it in {q}?", "Do I need an umbrella in {q}?", "Give me the forecast for {q}.",
    ],
    "stock_quote": [
        "What is the current stock price of {q}?", "Get me a quote for {q} shares.", "How is {q} trading now?",
        "What does one {q} share cost today?", "Show the ticker {q} price.", "Is {q} stock up or down?",
    ],
    "wiki_lookup": [
        "Look up {q} on Wikipedia.", "Find the encyclopedia article on {q}.", "Get the wiki summary of {q}.",
        "What does Wikipedia say about {q}?", "Pull up the article about {q}.", "Summarise the wiki page on {q}.",
    ],
}  # fmt: skip
_CALC_TEMPLATES = {
    "calculator": [
        "What is {e}?", "Calculate {e}.", "Compute {e} for me.", "Evaluate {e}.", "Work out {e}.",
        "Solve {e} please.",
    ],
    "unit_converter": [
        "Convert {v} {a} to {b}.", "How many {b} is {v} {a}?", "What is {v} {a} in {b}?",
        "Turn {v} {a} into {b}.", "Express {v} {a} in {b}.", "{v} {a} equals how many {b}?",
    ],
    "currency_converter": [
        "Convert {v} {a} to {b}.", "How much is {v} {a} in {b}?", "Change {v} {a} into {b}.",
        "Exchange {v} {a} for {b}.", "What are {v} {a} worth in {b}?", "I have {v} {a}; how many {b} is that?",
    ],
    "percentage": [
        "What is {p}% of {n}?", "Calculate {p} percent of {n}.", "Find {p}% of {n}.",
        "Take {p} percent of {n}.", "How much is {p}% of {n}?", "Work out {p} percent of {n}.",
    ],
    "loan_payment": [
        "What is the monthly payment on a {x} loan at {r}% for {y} years?",
        "Compute the monthly payment for borrowing {x} at {r}% over {y} years.",
        "Monthly cost of a {x} mortgage at {r}% for {y} years?",
        "If I borrow {x} at {r}% for {y} years, what do I pay each month?",
        "Loan of {x}, {r}% interest, {y} years: what is the monthly payment?",
        "Estimate monthly repayments on {x} at {r}% across {y} years.",
    ],
}  # fmt: skip
# Vague and answer templates are intents x phrasings, three phrasings per intent laid out in a row,
# so the held-out third (index % 3 == 2) is a new phrasing of every intent: held-out prompts are new
# sentences that a router must read by meaning ("joke", "math", a name), not new intents no
# training prompt ever had (a 0.69 M model cannot know that "rhymes" means chit-chat from nothing).
# vague templates per family: the family's kind of help, no tool, no values
_VAGUE_TEMPLATES = {
    "search": [
        "Look something up for me.", "Can you look a thing up?", "Please look something up online.",
        "Search for something for me.", "Do a quick search.", "Run a quick search for me.",
        "Find me some information online.", "Get me the latest info online.", "Find some details online.",
    ],
    "calculate": [
        "Do some math for me.", "Can you do a bit of math?", "Help me with some math.",
        "Calculate something for me.", "Run a calculation for me.", "I need a quick calculation.",
        "Crunch some numbers for me.", "Work out a number for me.", "Figure out some numbers for me.",
    ],
}  # fmt: skip
# (request, response) templates that need no tool: 12 intents x 3 phrasings
_ANSWER_TEMPLATES = [
    ("Hi, I'm {name}!", "Hello {name}! How can I help you today?"),
    ("Hello there, my name is {name}.", "Hello {name}! How can I help you today?"),
    ("Hey, {name} here, nice to meet you.", "Hello {name}! How can I help you today?"),
    ("Good morning, this is {name}.", "Good morning, {name}! What can I do for you?"),
    ("Morning! It's {name} again.", "Good morning, {name}! What can I do for you?"),
    ("Good evening, {name} speaking.", "Good evening, {name}! What can I do for you?"),
    ("Thanks for your help, said {name}.", "You're welcome! Let me know if you need anything else."),
    ("Thank you so much, from {name}.", "You're welcome! Let me know if you need anything else."),
    ("Many thanks, {name} says.", "You're welcome! Let me know if you need anything else."),
    ("Tell me a joke about {animal}.", "Why are {animal} so calm? They never rush a punchline."),
    ("Do you know a funny joke about {animal}?", "Why are {animal} so calm? They never rush a punchline."),
    ("Make me laugh with a joke about {animal}.", "Why are {animal} so calm? They never rush a punchline."),
    ("Write a short poem about {thing}.", "Here is a short poem about {thing}: it stays with me."),
    ("Compose a little poem on {thing}.", "Here is a short poem about {thing}: it stays with me."),
    ("I'd love a poem about {thing}.", "Here is a short poem about {thing}: it stays with me."),
    ("What is the opposite of {word}?", "The opposite of {word} is its antonym; happy to explain."),
    ("Give me the opposite of {word}.", "The opposite of {word} is its antonym; happy to explain."),
    ("Which word is the opposite of {word}?", "The opposite of {word} is its antonym; happy to explain."),
    ("Give me a fun fact about {animal}.", "A fun fact: {animal} are more curious than they look."),
    ("Share a fun fact on {animal}.", "A fun fact: {animal} are more curious than they look."),
    ("Tell me a fun fact about {animal}.", "A fun fact: {animal} are more curious than they look."),
    ("Say something kind to {name}.", "{name}, you are doing great. Keep it up!"),
    ("Please say a kind word to {name}.", "{name}, you are doing great. Keep it up!"),
    ("Send {name} something kind.", "{name}, you are doing great. Keep it up!"),
    ("What rhymes with {word}?", "Several words rhyme with {word}; try a rhyming list."),
    ("Give me a rhyme for {word}.", "Several words rhyme with {word}; try a rhyming list."),
    ("Which words rhyme with {word}?", "Several words rhyme with {word}; try a rhyming list."),
    ("Describe {thing} in one sentence.", "In one sentence: {thing} is calm, bright and full of life."),
    ("Sum up {thing} in one sentence.", "In one sentence: {thing} is calm, bright and full of life."),
    ("Describe {thing} briefly.", "In one sentence: {thing} is calm, bright and full of life."),
    ("I feel {word} today.", "Thanks for sharing that you feel {word}. Want to talk about it?"),
    ("Today I am feeling {word}.", "Thanks for sharing that you feel {word}. Want to talk about it?"),
    ("I'm feeling so {word} today.", "Thanks for sharing that you feel {word}. Want to talk about it?"),
    ("Do you like {animal}?", "I think {animal} are wonderful creatures."),
    ("Are you a fan of {animal}?", "I think {animal} are wonderful creatures."),
    ("What do you think of {animal}?", "I think {animal} are wonderful creatures."),
]  # fmt: skip
_PREFIXES = ("", "Please, ", "Quick question: ", "Hey, ", "If you can, ", "Hi! ")
_SUFFIXES = ("", " Thanks!", " Please.", " Right now if possible.", " Cheers.")


def _num(rng: _R, lo: int, hi: int) -> int | float:
    """An integer, or a number with one decimal a quarter of the time (copied as-is into the call)."""
    if rng.random() < 0.25:
        return round(rng.uniform(lo, hi), 1)
    return rng.randint(lo, hi)


def _search_value(tool: str, rng: _R) -> str:
    if tool == "web_search":
        return rng.choice(_QUERIES).format(city=rng.choice(_CITIES), lang=rng.choice(_LANGS))
    pools = {
        "news_lookup": _TOPICS,
        "weather_lookup": _CITIES,
        "stock_quote": _SYMBOLS,
        "wiki_lookup": _TITLES,
    }
    return rng.choice(pools[tool])


_SEARCH_PARAM = {
    "web_search": "query",
    "news_lookup": "topic",
    "weather_lookup": "city",
    "stock_quote": "symbol",
    "wiki_lookup": "title",
}


def _calc_call(tool: str, rng: _R) -> tuple[dict[str, Any], dict[str, Any]]:
    """(template fields, call parameters) of one calculate request; the values appear in both."""
    if tool == "calculator":
        expr = str(rng.randint(2, 999))
        for _ in range(rng.choice([1, 1, 2])):
            expr += rng.choice(["+", "-", "*", "/"]) + str(rng.randint(2, 99))
        return {"e": expr}, {"expression": expr}
    if tool == "unit_converter":
        v, (a, b) = _num(rng, 1, 500), rng.choice(_UNITS)
        return {"v": v, "a": a, "b": b}, {"value": v, "from": a, "to": b}
    if tool == "currency_converter":
        v, (a, b) = _num(rng, 5, 5000), rng.sample(_CURRENCIES, 2)
        return {"v": v, "a": a, "b": b}, {"amount": v, "from": a, "to": b}
    if tool == "percentage":
        p, n = rng.randint(1, 99), _num(rng, 10, 10000)
        return {"p": p, "n": n}, {"percent": p, "number": n}
    if tool == "loan_payment":
        x, r, y = rng.randrange(1000, 500001, 500), round(rng.uniform(1, 12), 1), rng.randint(1, 30)
        return {"x": x, "r": r, "y": y}, {"principal": x, "rate": r, "years": y}
    raise KeyError(f"no request maker for tool {tool!r}")


def tool_call_values(tool: str, rng: _R) -> tuple[dict[str, Any], dict[str, Any]]:
    """(template fields, call parameters) for ``tool``, values drawn from its entity pools."""
    if tool in _SEARCH_PARAM:
        q = _search_value(tool, rng)
        return {"q": q}, {_SEARCH_PARAM[tool]: q}
    return _calc_call(tool, rng)


def _templates(kind: str, key: str) -> list:
    if kind == "exact":
        return {**_SEARCH_TEMPLATES, **_CALC_TEMPLATES}[key]
    if kind == "vague":
        return _VAGUE_TEMPLATES[key]
    return _ANSWER_TEMPLATES


def _split_indices(n: int, split: str) -> list[int]:
    """Template indices of ``split``: every third (i % 3 == 2) is held out for test."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [i for i in range(n) if (i % 3 == 2) == (split == "test")]


def template_ids(split: str) -> set[str]:
    """Every template id of ``split`` (``tool:eN``, ``family:vN``, ``answer:N``)."""
    ids = {f"answer:{i}" for i in _split_indices(len(_ANSWER_TEMPLATES), split)}
    for tool, ts in {**_SEARCH_TEMPLATES, **_CALC_TEMPLATES}.items():
        ids |= {f"{tool}:e{i}" for i in _split_indices(len(ts), split)}
    for family, ts in _VAGUE_TEMPLATES.items():
        ids |= {f"{family}:v{i}" for i in _split_indices(len(ts), split)}
    return ids


def _wrap(rng: _R, text: str) -> str:
    prefix = rng.choice(_PREFIXES)
    if prefix:
        text = text[0].lower() + text[1:] if not text[:2].isupper() else text
    return prefix + text + rng.choice(_SUFFIXES)


Request = tuple[str, Any, str]  # (user text, call parameters or the answer's response, template id)


def make_request(rng: _R, kind: str, key: str, split: str, tool: str | None = None) -> Request:
    """One request of class ``kind`` (exact: ``key`` = tool; vague: ``key`` = family, ``tool`` = the
    ground-truth tool whose values are drawn; answer: ``key`` ignored) from ``split``'s templates.

    Returns (user text, call parameters | response text, template id).
    """
    if kind not in REQUEST_CLASSES:
        raise ValueError(f"request class must be one of {REQUEST_CLASSES}, got {kind!r}")
    templates = _templates(kind, key)
    i = rng.choice(_split_indices(len(templates), split))
    if kind == "answer":
        fields = {"name": rng.choice(_NAMES), "animal": rng.choice(_ANIMALS)}
        fields |= {"thing": rng.choice(_THINGS), "word": rng.choice(_WORDS)}
        request, response = templates[i]
        return _wrap(rng, request.format(**fields)), response.format(**fields), f"answer:{i}"
    if kind == "vague":
        if tool is None:
            raise ValueError("a vague request needs the ground-truth tool")
        _, params = tool_call_values(tool, rng)
        return _wrap(rng, templates[i]), params, f"{key}:v{i}"
    fields, params = tool_call_values(key, rng)
    return _wrap(rng, templates[i].format(**fields)), params, f"{key}:e{i}"


def _vague_cores() -> list[str]:
    return [t for ts in _VAGUE_TEMPLATES.values() for t in ts]


def request_class(user_text: str) -> str:
    """ "vague" if ``user_text`` (a request or a whole user turn) holds a vague template, else
    "answer" if it holds an answer template's fixed words, else "exact"."""
    low = user_text.lower()
    if any(core[:-1].lower() in low for core in _vague_cores()):
        return "vague"
    for request, _ in _ANSWER_TEMPLATES:
        head = request.split("{")[0].strip().lower()
        tail = request.split("}")[-1].strip().lower()
        if head and head in low and (not tail or tail in low):
            return "answer"
    return "exact"
