"""A synthetic chat corpus for the built-in model: tool calls, tool results, answers, small talk.

    python3 tools/train/chat_data.py   # -> data/chat_train.jsonl, data/chat_copy.jsonl, chat_heldout.jsonl

Every conversation is a list of OpenAI chat messages (`system`/`user`/`assistant`/`tool`, an
assistant's calls as `tool_calls` with `arguments` a JSON string), plus the names of the tools
offered (their definitions are `tools.json`'s; `null`: none) and, for evaluation, what the last
assistant turn should do (`expect`: the tool, its arguments and result, or `"tool": null`). The assistant's calls are
compact JSON with the arguments in the order of the tool's parameters, exactly what the
engine's tool-call grammar lets it write.

Held out: a fifth of the phrasings of every kind, a fifth of the cities, a sixth of the
books, and every argument value drawn for the held-out split is one that the training split
never contains (numbers, expressions and verse references are drawn from one stream and
assigned to a side first come, first served). `chat_heldout.jsonl` (committed, next to this
script) is the evaluation set.

`data/chat_copy.jsonl` holds requests to say a text back (a span of the corpus, a made-up
name, a number with a unit, an expression, a verse reference), answered with the text in
quotes: the copying that tool arguments need, taught on its own (after 400 steps of tool
conversations alone the model named the right tool 94% of the time but copied no argument).

`--broad` (run 11 on) adds training-only phrasings, the Apocrypha's book names and made-up
cities and books (`BROAD`, `BROAD_BOOKS`) to the training side after the split: the held-out file
is the same bytes with or without it, and none of the additions is a held-out phrasing or book.
`--made-up CITIES BOOKS` sets the shares of its made-up names (default 0.25 and 0.2; run 17
tried 0.5 and 0.45).

Seeded (`--seed`, default 20261201): the same command writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_tools  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CITIES = """Paris London Berlin Madrid Rome Lisbon Dublin Amsterdam Brussels Vienna Prague Warsaw
Budapest Athens Oslo Stockholm Helsinki Copenhagen Reykjavik Zurich Geneva Milan Naples Venice Florence
Barcelona Seville Valencia Porto Lyon Marseille Nice Bordeaux Toulouse Munich Hamburg Cologne Frankfurt
Stuttgart Dresden Leipzig Krakow Gdansk Riga Tallinn Vilnius Minsk Kyiv Odessa Bucharest Sofia Belgrade
Zagreb Ljubljana Sarajevo Skopje Tirana Istanbul Ankara Izmir Moscow Kazan Tbilisi Yerevan Baku Tehran
Baghdad Damascus Beirut Amman Jerusalem Cairo Alexandria Tunis Algiers Casablanca Marrakesh Rabat Tripoli
Khartoum Nairobi Mombasa Kampala Kigali Dodoma Lusaka Harare Maputo Johannesburg Durban Pretoria Gaborone
Windhoek Luanda Kinshasa Brazzaville Lagos Abuja Accra Dakar Bamako Niamey Ouagadougou Freetown Monrovia
Conakry Addis Mogadishu Djibouti Asmara Riyadh Jeddah Mecca Medina Doha Dubai Muscat Kuwait Manama Sanaa
Karachi Lahore Islamabad Delhi Mumbai Kolkata Chennai Bangalore Hyderabad Pune Jaipur Lucknow Kathmandu
Dhaka Colombo Thimphu Yangon Bangkok Hanoi Saigon Phnom Vientiane Kuala Singapore Jakarta Surabaya Bandung
Manila Cebu Davao Taipei Kaohsiung Hong Seoul Busan Incheon Tokyo Osaka Kyoto Nagoya Sapporo Fukuoka Kobe
Yokohama Beijing Shanghai Guangzhou Shenzhen Chengdu Wuhan Xian Nanjing Tianjin Harbin Lhasa Urumqi
Ulaanbaatar Almaty Tashkent Bishkek Dushanbe Ashgabat Kabul Sydney Melbourne Brisbane Perth Adelaide
Darwin Hobart Canberra Auckland Wellington Christchurch Suva Apia Honolulu Anchorage Juneau Seattle Portland
Vancouver Victoria Calgary Edmonton Winnipeg Toronto Ottawa Montreal Quebec Halifax Boston Chicago Detroit
Cleveland Pittsburgh Philadelphia Baltimore Washington Richmond Atlanta Miami Orlando Tampa Nashville Memphis
Dallas Houston Austin Denver Phoenix Tucson Albuquerque Omaha Minneapolis Milwaukee Indianapolis Columbus
Cincinnati Louisville Charlotte Raleigh Boise Reno Sacramento Oakland Fresno Tijuana Monterrey Guadalajara
Puebla Oaxaca Merida Cancun Havana Kingston Nassau Panama Bogota Medellin Cali Quito Guayaquil Lima Cusco
Arequipa Santiago Valparaiso Mendoza Cordoba Rosario Montevideo Asuncion Caracas Maracaibo Georgetown
Paramaribo Cayenne Recife Salvador Fortaleza Manaus Belem Brasilia Curitiba Rio Sao Campinas Oxford
Cambridge Bath York Leeds Manchester Liverpool Bristol Cardiff Swansea Belfast Glasgow Edinburgh Aberdeen
Inverness Dundee Norwich Brighton Plymouth Exeter Cork Galway Limerick Bergen Trondheim Gothenburg Malmo
Uppsala Aarhus Odense Tampere Turku Antwerp Ghent Bruges Rotterdam Utrecht Eindhoven Basel Bern Lausanne
Salzburg Innsbruck Graz Bratislava Kosice Brno Ostrava Wroclaw Poznan Lodz Debrecen Szeged Cluj Iasi
Varna Plovdiv Thessaloniki Patras Heraklion Nicosia Valletta Palermo Catania Bari Genoa Turin Bologna
Verona Trieste Bilbao Malaga Granada Zaragoza Toledo Salamanca Coimbra Faro Funchal Ajaccio Strasbourg
Lille Nantes Rennes Montpellier Grenoble Dijon""".split()
MULTI_WORD_CITIES = ["New York", "Los Angeles", "San Francisco", "San Diego", "Las Vegas", "New Orleans",
                     "Salt Lake City", "Kansas City", "St Louis", "Mexico City", "Buenos Aires", "La Paz",
                     "Cape Town", "Tel Aviv", "Abu Dhabi", "Kuala Lumpur", "Ho Chi Minh City", "Hong Kong",
                     "Rio de Janeiro", "Sao Paulo", "Addis Ababa", "Dar es Salaam", "Port Moresby",
                     "Santo Domingo", "San Juan", "Buenos Aires", "Quebec City", "St Petersburg",
                     "Nizhny Novgorod", "Novi Sad", "Le Havre", "The Hague", "Frankfurt am Main"]

BOOKS = """Genesis Exodus Leviticus Numbers Deuteronomy Joshua Judges Ruth 1_Samuel 2_Samuel 1_Kings 2_Kings
1_Chronicles 2_Chronicles Ezra Nehemiah Esther Job Psalms Proverbs Ecclesiastes Song_of_Solomon Isaiah
Jeremiah Lamentations Ezekiel Daniel Hosea Joel Amos Obadiah Jonah Micah Nahum Habakkuk Zephaniah Haggai
Zechariah Malachi Matthew Mark Luke John Acts Romans 1_Corinthians 2_Corinthians Galatians Ephesians
Philippians Colossians 1_Thessalonians 2_Thessalonians 1_Timothy 2_Timothy Titus Philemon Hebrews James
1_Peter 2_Peter 1_John 2_John 3_John Jude Revelation""".replace("_", "~").split()
BOOKS = [b.replace("~", " ") for b in BOOKS]

UNIT_PAIRS = {
    "length": ["km", "kilometers", "miles", "meters", "feet", "inches", "cm", "centimeters", "yards", "mm"],
    "mass": ["kg", "kilograms", "pounds", "lb", "grams", "ounces", "oz", "tons", "stone"],
    "temperature": ["celsius", "fahrenheit", "kelvin"],
    "volume": ["liters", "litres", "gallons", "ml", "milliliters", "cups", "pints", "quarts"],
}

WEATHER = [
    "What's the weather in {city}?", "What is the weather like in {city} today?", "{city} weather",
    "weather in {city} please", "Is it raining in {city} right now?", "Tell me the weather for {city}.",
    "How hot is it in {city}?", "{city}: what's the temperature?", "Could you check the weather in {city} for me?",
    "I'm travelling to {city} tomorrow. What is the weather like there?", "Give me the current conditions in {city}",
    "how cold is it in {city}", "Do I need an umbrella in {city} today?", "weather {city}",
    "Hey, what's it like outside in {city}?", "current weather, {city}", "Check the weather in {city}.",
    "Please tell me how the weather is in {city}.", "What's the temperature in {city} right now?",
    "Any idea what the weather is doing in {city}?", "In {city}, is it sunny or cloudy?",
    "Weather report for {city}, please.", "I wonder what the weather is in {city}.",
    "Can you look up the weather in {city}?", "forecast for {city}?", "is it cold in {city}",
    "How warm is {city} at the moment?", "{city} - what is the weather?", "What are conditions like in {city}?",
    "Would you tell me the weather in {city}, please?",
]
WEATHER_UNIT = [
    "What's the weather in {city} in {unit}?", "{city} weather in {unit} please", "Temperature in {city} in {unit}?",
    "Give me the weather for {city}, in {unit}.", "In {unit}, how warm is it in {city}?",
    "How hot is it in {city}? Answer in {unit}.", "weather {city} {unit}", "Check {city}'s weather in {unit}.",
    "Could you tell me the temperature in {city} in {unit}?", "Using {unit}, what's the weather in {city}?",
]
UNIT_WORDS = {"celsius": ["celsius", "Celsius", "degrees celsius", "C"],
              "fahrenheit": ["fahrenheit", "Fahrenheit", "degrees fahrenheit", "F"]}
CONVERT = [
    "Convert {v} {a} to {b}", "How many {b} is {v} {a}?", "{v} {a} in {b}?", "what is {v} {a} in {b}",
    "{v} {a} to {b}", "I have {v} {a}. How much is that in {b}?", "change {v} {a} into {b}",
    "Please convert {v} {a} into {b}.", "How much is {v} {a} in {b}?", "{a} to {b}: {v}",
    "Can you convert {v} {a} to {b} for me?", "convert {v} {a} -> {b}", "What do {v} {a} come to in {b}?",
    "In {b}, how much is {v} {a}?", "I need {v} {a} expressed in {b}.", "{v} {a} equals how many {b}?",
    "Could you turn {v} {a} into {b}?", "how many {b} are in {v} {a}", "Express {v} {a} in {b}, please.",
    "Quick one: {v} {a} in {b}", "My recipe says {v} {a}. What is that in {b}?", "Translate {v} {a} to {b}.",
    "What's {v} {a} in {b}?", "Convert from {a} to {b}: {v}", "{v} {a} is how much in {b}?",
]
CALC = [
    "What is {e}?", "calculate {e}", "{e} = ?", "Compute {e} please.", "what's {e}", "Can you work out {e}?",
    "Solve {e}", "I need the result of {e}.", "{e}?", "Please calculate {e}.", "How much is {e}?",
    "Evaluate {e}", "quick math: {e}", "What does {e} come to?", "Work out {e} for me.", "{e} equals what?",
    "Could you tell me what {e} is?", "Help me with {e}", "Give me the answer to {e}.", "result of {e}",
    "Do the sum {e}", "What do you get for {e}?", "Tell me {e}.", "math question: what is {e}?",
    "I'm stuck on {e}, what is it?",
]
VERSE = [
    "Look up {ref}", "What does {ref} say?", "Read me {ref}.", "{ref} please", "Show me the verse {ref}.",
    "Quote {ref}", "I'd like to read {ref}.", "Can you find {ref} for me?", "What is the text of {ref}?",
    "{ref}?", "Please look up the verse {ref}.", "Give me {ref}.", "Recite {ref}", "find verse {ref}",
    "What's written in {ref}?", "Bible verse {ref}", "Could you quote {ref} for me?", "Tell me what {ref} says.",
    "I want the words of {ref}.", "Open the Bible at {ref}.", "Verse lookup: {ref}", "Fetch {ref}, please.",
    "What do we read in {ref}?", "show {ref}", "Which words are in {ref}?",
]
REF_FORMS = ["{book} {c}:{v}", "{book} {c}:{v}", "{book} chapter {c} verse {v}", "chapter {c}, verse {v} of {book}",
             "{book} {c} verse {v}", "verse {v} of {book} chapter {c}"]

GREETINGS = [
    ("Hi", "Hello! How can I help you?"), ("hello", "Hello! What can I do for you?"),
    ("Hey there", "Hi! What would you like to know?"), ("Good morning", "Good morning! How can I help?"),
    ("Good evening!", "Good evening! What can I do for you?"), ("How are you?", "I am well, thank you. How can I help you?"),
    ("Thanks", "You're welcome!"), ("Thank you!", "You're welcome. Anything else?"), ("thanks a lot", "Glad to help!"),
    ("Who are you?", "I am cqlm, a small assistant. I can check the weather, convert units, calculate and look up Bible verses."),
    ("What can you do?", "I can check the weather, convert units, do arithmetic and look up Bible verses. I also know a little about Austen, Shakespeare and Milton."),
    ("bye", "Goodbye!"), ("Goodbye", "Goodbye, and take care!"), ("ok", "Is there anything else I can do?"),
    ("Nice to meet you", "Nice to meet you too! How can I help?"), ("yo", "Hello! What can I do for you?"),
    ("Tell me about yourself", "I am cqlm, a tiny language model that runs on your computer. I can call a few tools."),
    ("Are you a robot?", "I am a small language model, not a person."),
    ("Can you help me?", "Of course. What do you need?"), ("good night", "Good night!"),
    ("Hello, how is it going?", "Very well, thank you! How can I help?"), ("cheers", "You're welcome!"),
    ("What is your name?", "My name is cqlm."), ("Good afternoon", "Good afternoon! What can I do for you?"),
    ("I'm bored", "Ask me about the weather somewhere, or for a verse to read."),
]
FACTS = [
    ("Pride and Prejudice", "Jane Austen"), ("Emma", "Jane Austen"), ("Sense and Sensibility", "Jane Austen"),
    ("Mansfield Park", "Jane Austen"), ("Persuasion", "Jane Austen"), ("Northanger Abbey", "Jane Austen"),
    ("Hamlet", "William Shakespeare"), ("Macbeth", "William Shakespeare"), ("King Lear", "William Shakespeare"),
    ("Othello", "William Shakespeare"), ("Romeo and Juliet", "William Shakespeare"), ("The Tempest", "William Shakespeare"),
    ("Twelfth Night", "William Shakespeare"), ("Julius Caesar", "William Shakespeare"),
    ("A Midsummer Night's Dream", "William Shakespeare"), ("The Merchant of Venice", "William Shakespeare"),
    ("Much Ado About Nothing", "William Shakespeare"), ("Richard III", "William Shakespeare"),
    ("Paradise Lost", "John Milton"), ("Paradise Regained", "John Milton"), ("Areopagitica", "John Milton"),
    ("Comus", "John Milton"), ("The Treasury of David", "Charles Spurgeon"),
]
CHARACTERS = [
    ("Elizabeth Bennet", "the heroine of Pride and Prejudice by Jane Austen"),
    ("Mr. Darcy", "the proud hero of Pride and Prejudice by Jane Austen"),
    ("Emma Woodhouse", "the heroine of Emma by Jane Austen"), ("Mr. Knightley", "Emma's friend and neighbour in Emma"),
    ("Anne Elliot", "the heroine of Persuasion by Jane Austen"), ("Fanny Price", "the heroine of Mansfield Park"),
    ("Catherine Morland", "the heroine of Northanger Abbey"), ("Elinor Dashwood", "the elder sister in Sense and Sensibility"),
    ("Marianne Dashwood", "the younger sister in Sense and Sensibility"), ("Hamlet", "the Prince of Denmark in Shakespeare's play"),
    ("Macbeth", "a Scottish general who becomes king in Shakespeare's play"), ("Prospero", "the magician of The Tempest"),
    ("Othello", "the Moor of Venice in Shakespeare's tragedy"), ("Juliet", "the young Capulet who loves Romeo"),
    ("King Lear", "the old king who divides his kingdom among his daughters"),
    ("Satan", "the fallen angel of Milton's Paradise Lost"), ("David", "the king of Israel to whom many psalms are ascribed"),
    ("Moses", "the prophet who led Israel out of Egypt"), ("Ruth", "the Moabite woman of the Book of Ruth"),
]
AUTHOR_Q = ["Who wrote {t}?", "who is the author of {t}", "{t}: who wrote it?", "Tell me who wrote {t}.",
            "Who was the author of {t}?", "I forget who wrote {t}.", "Do you know who wrote {t}?",
            "{t} was written by whom?", "Which writer gave us {t}?", "Name the author of {t}."]
CHAR_Q = ["Who is {c}?", "Tell me about {c}.", "who was {c}", "What do you know about {c}?", "{c}: who is that?",
          "Remind me who {c} is.", "Do you know {c}?", "Which book has {c} in it?", "Explain who {c} was.",
          "Who's {c}?"]
STYLE_Q = ["Write a sentence like Jane Austen.", "Give me a line in the style of Austen.", "Say something the way Austen would.",
           "Write me some Austen.", "Quote something from the old books.", "Tell me a sentence from a novel.",
           "Could you write a line of old English prose?", "Compose a sentence in Austen's manner."]
ANSWERS = {
    "get_weather": ["It is {temperature} degrees {unit} and {condition} in {city}.",
                    "In {city} it is {condition}, {temperature} degrees {unit}.",
                    "The weather in {city}: {condition}, {temperature} degrees {unit}.",
                    "{city} is {condition} right now, at {temperature} degrees {unit}.",
                    "Right now {city} has {condition} weather and {temperature} degrees {unit}."],
    "convert_units": ["{v} {a} is {value} {unit}.", "That is {value} {unit}.", "{v} {a} equals {value} {unit}.",
                      "It comes to {value} {unit}.", "{v} {a} is about {value} {unit}."],
    "calculate": ["{e} = {result}.", "The answer is {result}.", "{e} is {result}.", "It comes to {result}.",
                  "That gives {result}."],
    "lookup_verse": ["{reference} says: \"{text}\"", "Here is {reference}: \"{text}\"", "\"{text}\" ({reference})",
                     "{reference}: \"{text}\""],
}
ERROR_ANSWERS = ["Sorry, the tool said: {error}.", "I could not do that: {error}."]
POLITE_PRE = ["", "", "", "", "Please, ", "Hi! ", "Hey, ", "Quick question: ", "Excuse me, ", "Hello. "]
POLITE_POST = ["", "", "", "", " Thanks!", " Thank you.", " please", " thx", " :)", " Cheers."]
# `--broad` (run 11 on): training-only additions, joined to the training side after the split, so
# the held-out split (its phrasings, values and conversations) is byte for byte what it was. They
# widen what the held-out failures of run 10 showed too narrow: the order of a conversion's units,
# temperature words without a unit, reference forms, terse requests, and names never seen before
# (made-up cities and books of several words, for the copying of unseen names). None repeats a
# held-out phrasing; the phrasings that differed from a held-out one by a word or two were left out.
BROAD = {
    "weather": [
        "Is it hot in {city} right now?", "How's the weather in {city} today?", "Tell me the temperature in {city}.",
        "Should I take a coat in {city}?", "What's it like in {city} at the moment?", "Will it rain in {city} today?",
        "How cold does it feel in {city}?", "Is the sun out in {city}?", "Need the weather in {city}.",
        "Weather check: {city}", "tell me about the weather in {city}", "Is it warm enough in {city} for a walk?",
    ],
    "weather_unit": [
        "Tell me the weather in {city} using {unit}.", "{city}, {unit} please: how warm is it?",
        "I want {city}'s temperature in {unit}.", "Weather for {city} (in {unit})", "What is it like in {city}? Use {unit}.",
        "{unit} please: weather in {city}",
    ],
    "convert": [
        "How many {b} do {v} {a} make?", "{b}, please: {v} {a}", "Turn {v} {a} into {b} for me.",
        "What would {v} {a} be in {b}?", "{v} {a} -> {b}", "Need {v} {a} as {b}.", "I'd like {v} {a} in {b}, please.",
        "In {b}: {v} {a}?", "How many {b} would I get from {v} {a}?", "Work out {v} {a} in {b}.", "{v} {a} into {b}",
        "Want {b}. I have {v} {a}.", "Give me {b} for {v} {a}.", "What's the {b} figure for {v} {a}?",
    ],
    "calc": ["Figure out {e}.", "{e}, please", "How much do you get from {e}?", "Answer this: {e}"],
    "verse": ["Find me {ref}.", "Look {ref} up, please.", "I need {ref}.", "Read {ref} to me.", "What is {ref}?",
              "Bring up {ref}."],
    "ref": ["{book} ch {c} v {v}", "{book} {c} v. {v}", "{book} chapter {c}:{v}", "the book of {book}, {c}:{v}"],
}
# Books outside the 66 (the Apocrypha of the KJV, several of them names of three or more words).
BROAD_BOOKS = ["Wisdom of Solomon", "Prayer of Manasseh", "Bel and the Dragon", "Letter of Jeremiah", "Tobit",
               "Judith", "Sirach", "Baruch", "1 Maccabees", "2 Maccabees", "1 Esdras", "2 Esdras",
               "Acts of the Apostles", "Rest of Esther", "Epistle of Jude"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are cqlm, a small assistant.", "Answer briefly.",
                  "Be concise and friendly."]


def split(items: list, every: int, rng: random.Random) -> tuple[list, list]:
    """A seeded split: one item in `every` held out (at least one)."""
    order = list(items)
    rng.shuffle(order)
    k = max(1, len(order) // every)
    return order[k:], order[:k]


def typo(text: str, rng: random.Random, protect: list[str]) -> str:
    """One typo in a word that is not (part of) an argument value."""
    words = text.split(" ")
    cand = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha() and not any(w in p or p in w for p in protect)]
    if not cand:
        return text
    i = rng.choice(cand)
    w = words[i]
    j = rng.randrange(1, len(w) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        w = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    elif kind == 1:
        w = w[:j] + w[j + 1:]
    else:
        w = w[:j] + w[j] + w[j:]
    words[i] = w
    return " ".join(words)


class Values:
    """Argument values with a held-out side: a value drawn once belongs to that side forever."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.owner: dict[str, str] = {}

    def draw(self, side: str, make) -> object:
        for _ in range(1000):
            v = make(self.rng)
            key = json.dumps(v, sort_keys=True)
            if self.owner.setdefault(key, side) == side:
                return v
        raise RuntimeError("value space exhausted")


def rand_number(rng: random.Random, dim: str) -> str:
    """A value written as JSON writes it (`3.5`, never `3.50`), so the call copies it as it is."""
    if dim == "temperature":
        return str(rng.randint(-40, 120)) if rng.random() < 0.7 else str(round(rng.uniform(-40, 120), 1))
    r = rng.random()
    if r < 0.45:
        return str(rng.randint(1, 500))
    if r < 0.8:
        return str(round(rng.uniform(0.1, 200), 1))
    if r < 0.9:
        return str(round(rng.uniform(0.01, 50), 2))
    return str(rng.randint(500, 20000))


def rand_expr(rng: random.Random) -> str:
    def n():
        return str(rng.randint(1, 99)) if rng.random() < 0.8 else str(rng.randint(100, 9999))
    forms = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "({a} + {b}) * {c}", "{a} * {b} + {c}",
             "{a} - {b} * {c}", "({a} - {b}) / {c}", "{a} + {b} + {c}", "{a}*{b}", "{a}+{b}", "{a} ^ 2",
             "{a} * ({b} - {c})", "{a} / {b} + {c}"]
    e = rng.choice(forms).format(a=n(), b=n(), c=str(rng.randint(1, 20)))
    return e


class Generator:
    def __init__(self, seed: int, verse_texts: list[str], broad: bool = False,
                 made_up: tuple[float, float] = (0.25, 0.2)):
        self.rng = random.Random(seed)
        r = random.Random(seed + 1)
        self.phr = {}
        for name, lst in [("weather", WEATHER), ("weather_unit", WEATHER_UNIT), ("convert", CONVERT), ("calc", CALC),
                          ("verse", VERSE), ("ref", REF_FORMS[2:]), ("author", AUTHOR_Q), ("char", CHAR_Q),
                          ("style", STYLE_Q), ("greet", GREETINGS)]:
            self.phr[name] = split(lst, 5, r)
        self.phr["ref"] = ([REF_FORMS[0]] * 3 + self.phr["ref"][0], self.phr["ref"][1])
        self.cities = split(CITIES + MULTI_WORD_CITIES, 5, r)
        self.books = split(BOOKS, 6, r)
        self.broad = broad
        self.made_up_cities, self.made_up_books = made_up
        if broad:
            for name, extra in BROAD.items():
                assert not set(extra) & set(self.phr[name][1]), f"a --broad {name} phrasing is a held-out one"
                self.phr[name] = (self.phr[name][0] + extra, self.phr[name][1])
            assert not set(BROAD_BOOKS) & set(self.books[1]), "a --broad book is a held-out one"
            self.books = (self.books[0] + BROAD_BOOKS, self.books[1])
        self.values = Values(random.Random(seed + 2))
        self.verse_texts = verse_texts
        self.verses: dict = {}
        self.tools = demo_tools.tools()
        self.names = [t["function"]["name"] for t in self.tools]

    def pick(self, kind: str, side: str):
        return self.rng.choice(self.phr[kind][side == "heldout"])

    def style(self, text: str, side: str, protect: list[str]) -> str:
        rng = self.rng
        text = rng.choice(POLITE_PRE) + text + rng.choice(POLITE_POST)
        if rng.random() < 0.15:
            text = typo(text, rng, protect)
        if rng.random() < 0.15:
            # lower-case everything but the argument values
            parts = re.split("(" + "|".join(re.escape(p) for p in protect) + ")", text) if protect else [text]
            text = "".join(p if p in protect else p.lower() for p in parts)
        return text

    # ---------------------------------------------------------------- one request each

    def made_up(self, side: str, every: float) -> bool:
        """With `--broad`, true for a share `every` of training requests (never drawn for held-out ones)."""
        return side == "train" and self.broad and self.rng.random() < every

    def made_up_name(self, words: int) -> str:
        return " ".join(rand_word(self.rng).capitalize() for _ in range(words))

    def weather(self, side: str):
        if self.made_up(side, self.made_up_cities):
            city = self.made_up_name(self.rng.choice([1, 1, 1, 2, 2, 3]))
        else:
            city = self.rng.choice(self.cities[side == "heldout"])
        args = {"city": city}
        if self.rng.random() < 0.3:
            unit = self.rng.choice(["celsius", "fahrenheit"])
            word = self.rng.choice(UNIT_WORDS[unit])
            text = self.pick("weather_unit", side).format(city=city, unit=word)
            args["unit"] = unit
            protect = [city, word]
        else:
            text = self.pick("weather", side).format(city=city)
            protect = [city]
        return self.style(text, side, protect), "get_weather", args, {}

    def convert(self, side: str):
        dim = self.rng.choice(list(UNIT_PAIRS))
        a, b = self.rng.sample(UNIT_PAIRS[dim], 2)
        v = self.values.draw(side, lambda r: rand_number(r, dim))
        text = self.pick("convert", side).format(v=v, a=a, b=b)
        num = float(v)
        args = {"value": int(v) if re.fullmatch(r"-?\d+", v) else num, "from_unit": a, "to_unit": b}
        return self.style(text, side, [v, a, b]), "convert_units", args, {"v": v, "a": a}

    def calc(self, side: str):
        e = self.values.draw(side, rand_expr)
        text = self.pick("calc", side).format(e=e)
        return self.style(text, side, [e]), "calculate", {"expression": e}, {"e": e}

    def verse(self, side: str):
        if self.made_up(side, self.made_up_books):
            book = self.rng.choice(["{} of {}", "{} {}", "{} of the {}", "1 {}", "2 {}", "{}"]).format(
                self.made_up_name(1), self.made_up_name(1))
        else:
            book = self.rng.choice(self.books[side == "heldout"])
        c, v = self.values.draw(side, lambda r: (r.randint(1, 50), r.randint(1, 40)) if r.random() < 0.9
                                else (r.randint(51, 150), r.randint(1, 60)))
        key = (book.lower(), c, v)
        self.verses.setdefault(key, self.rng.choice(self.verse_texts))
        ref = self.pick("ref", side).format(book=book, c=c, v=v)
        text = self.pick("verse", side).format(ref=ref)
        return self.style(text, side, [book, str(c), str(v), ref]), "lookup_verse", {"book": book, "chapter": c, "verse": v}, {}

    def tool_exchange(self, side: str, call_id: str) -> tuple[list[dict], dict]:
        kind = self.rng.choice([self.weather, self.convert, self.calc, self.verse])
        text, name, args, extra = kind(side)
        result = demo_tools.run(name, args, self.verses)
        if "error" in result:
            answer = self.rng.choice(ERROR_ANSWERS).format(**result)
        else:
            answer = self.rng.choice(ANSWERS[name]).format(**result, **extra)
        arguments = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
        msgs = [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": demo_tools.result_json(result)},
            {"role": "assistant", "content": answer},
        ]
        expect = {"tool": name, "arguments": args, "result": result}
        return msgs, expect

    def text_exchange(self, side: str) -> tuple[list[dict], dict]:
        r = self.rng.random()
        if r < 0.35:
            q, a = self.pick("greet", side)
            q = self.style(q, side, [])
        elif r < 0.6:
            t, who = self.rng.choice(FACTS)
            q = self.style(self.pick("author", side).format(t=t), side, [t])
            a = self.rng.choice([f"{t} was written by {who}.", f"{who} wrote {t}.", f"It was written by {who}."])
        elif r < 0.85:
            c, what = self.rng.choice(CHARACTERS)
            q = self.style(self.pick("char", side).format(c=c), side, [c])
            a = self.rng.choice([f"{c} is {what}.", f"{c}: {what}."])
        else:
            q = self.style(self.pick("style", side), side, [])
            a = self.rng.choice(self.prose)
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}], {"tool": None}

    def conversation(self, side: str) -> dict:
        rng = self.rng
        tools = self.tools
        no_tools = side == "train" and rng.random() < 0.08
        turns = 1 if rng.random() < 0.75 else 2
        msgs: list[dict] = []
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        expect = None
        for t in range(turns):
            if no_tools or rng.random() < 0.25:
                m, expect = self.text_exchange(side)
            else:
                m, expect = self.tool_exchange(side, f"call_{t + 1}")
            msgs += m
        if side == "train" and not no_tools and rng.random() < 0.2:
            tools = rng.sample(tools, len(tools))  # the order of the offered tools varies in training
        names = None if no_tools else [t["function"]["name"] for t in tools]
        return {"messages": msgs, "tools": names, "expect": expect}


COPY_ASK = ["Repeat after me: {x}", "Say exactly this: {x}", "Echo: {x}", "Copy this text: {x}", "{x} - say it back.",
            "Please repeat {x}", "Type back exactly: {x}", "Quote me: {x}", "Write {x}", "Say {x}"]


def rand_word(rng: random.Random) -> str:
    """A made-up name (so that copying it cannot be recall)."""
    cons, vow = "bcdfghjklmnprstvwxz", "aeiou"
    w = "".join(rng.choice(cons) + rng.choice(vow) + (rng.choice(cons) if rng.random() < 0.4 else "")
                for _ in range(rng.randint(1, 4)))
    return w.capitalize() if rng.random() < 0.7 else w


def copy_conversation(rng: random.Random, gen: "Generator", max_words: int = 20, max_names: int = 6) -> dict:
    """A request to say something back, answered with it in quotes: the copying that tool
    arguments need (a span of the user's text, written after a quote), taught directly."""
    r = rng.random()
    if r < 0.3:
        words = rng.choice(gen.prose).split()
        i = rng.randrange(len(words))
        x = " ".join(words[i:i + rng.randint(2 if max_words > 8 else 1, max_words)])
    elif r < 0.55:
        x = " ".join(rand_word(rng) for _ in range(rng.randint(1, max_names)))
    # Values of the kinds the tools take come from the training side only.
    elif r < 0.7:
        x = gen.values.draw("train", rand_expr)
    elif r < 0.8:
        x = gen.values.draw("train", lambda q: rand_number(q, "length")) + " " + rng.choice(sum(UNIT_PAIRS.values(), []))
    elif r < 0.9:
        x = rng.choice(gen.cities[0]) if rng.random() < 0.5 else rand_word(rng) + " " + rand_word(rng)
    else:
        c, v = gen.values.draw("train", lambda q: (q.randint(1, 50), q.randint(1, 40)))
        x = f"{rng.choice(gen.books[0])} {c}:{v}"
    x = x.strip(" \"")
    msgs = [{"role": "user", "content": rng.choice(COPY_ASK).format(x=x)}, {"role": "assistant", "content": f'"{x}"'}]
    names = [t["function"]["name"] for t in gen.tools] if rng.random() < 0.5 else None
    return {"messages": msgs, "tools": names, "expect": {"tool": None}}


def verse_texts(train_txt: str | None, rng: random.Random) -> list[str]:
    """Short sentences of the World English Bible part of the corpus (stand-ins for verse texts)."""
    out = []
    if train_txt and os.path.exists(train_txt):
        with open(train_txt, encoding="utf-8") as f:
            text = f.read()
        for s in re.split(r"(?<=[.;!?])\s+", text):
            s = " ".join(s.split())
            n = len(s.split())
            if 4 <= n <= 12 and ("Yahweh" in s or "God" in s or "Israel" in s) and '"' not in s:
                out.append(s)
    if not out:
        out = sorted(set(demo_tools.KNOWN_VERSES.values()))
    out = sorted(set(out))
    rng.shuffle(out)
    return out[:4000]


def prose(train_txt: str | None, rng: random.Random) -> list[str]:
    out = []
    if train_txt and os.path.exists(train_txt):
        with open(train_txt, encoding="utf-8") as f:
            head = f.read(4_000_000)  # the Austen novels come first
        for s in re.split(r"(?<=[.!?])\s+", head):
            s = " ".join(s.split())
            if 8 <= len(s.split()) <= 25 and '"' not in s and "CHAPTER" not in s:
                out.append(s)
    out = sorted(set(out)) or ["It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife."]
    rng.shuffle(out)
    return out[:3000]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--train", type=int, default=40000, help="training conversations")
    ap.add_argument("--heldout", type=int, default=400, help="held-out conversations")
    ap.add_argument("--copies", type=int, default=40000, help="say-it-back conversations (data/chat_copy.jsonl)")
    ap.add_argument("--copy-max-words", type=int, default=20, help="longest span of corpus text to say back")
    ap.add_argument("--copy-max-names", type=int, default=6, help="most made-up words to say back")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--broad", action="store_true", help="add the training-only phrasings, books and made-up "
                    "names of BROAD (run 11 on); the held-out split stays the same")
    ap.add_argument("--made-up", type=float, nargs=2, default=[0.25, 0.2], metavar=("CITIES", "BOOKS"),
                    help="with --broad, the shares of training weather and verse requests for a made-up name")
    args = ap.parse_args()
    if args.made_up != [0.25, 0.2] and not args.broad:
        ap.error("--made-up sets --broad's made-up names: give --broad too")
    rng = random.Random(args.seed + 3)
    train_txt = os.path.join(args.data, "train.txt")
    gen = Generator(args.seed, verse_texts(train_txt, rng), args.broad, tuple(args.made_up))
    gen.prose = prose(train_txt, rng)
    # Held-out values are drawn first, so the training side can never take them.
    held = [gen.conversation("heldout") for _ in range(args.heldout)]
    train = [gen.conversation("train") for _ in range(args.train)]
    copy_rng = random.Random(args.seed + 4)
    copies = [copy_conversation(copy_rng, gen, args.copy_max_words, args.copy_max_names) for _ in range(args.copies)]
    os.makedirs(args.data, exist_ok=True)
    for path, rows in [(os.path.join(args.data, "chat_train.jsonl"), train), (os.path.join(HERE, "chat_heldout.jsonl"), held),
                       (os.path.join(args.data, "chat_copy.jsonl"), copies)]:
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    kinds: dict = {}
    for r in held:
        k = r["expect"]["tool"] or "none"
        kinds[k] = kinds.get(k, 0) + 1
    print(f"train {len(train)} conversations, held out {len(held)} {kinds}; {len(gen.verses)} verses", flush=True)


if __name__ == "__main__":
    main()
