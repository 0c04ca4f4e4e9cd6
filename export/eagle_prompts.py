"""Training prompts for drafter heads (EAGLE, Medusa): written here, never taken from a benchmark.

Three kinds, so the head sees what the target really writes:
  code completion  raw text: a signature + docstring of a Python standard-library function (read
                   from this machine's own stdlib with `inspect`), which the target continues
  code chat        chat messages: "write a function that <first docstring line>" and other
                   programming requests built from the same stdlib docstrings and from topic lists
  general chat     chat messages: instruction templates x topics (explain, list, compare, email...)
  everyday chat    chat messages: first-person requests about daily life (a situation + what the
                   user wants: advice, a plan, a message to write, an explanation, ideas)
  tasks            chat messages over a broad instruction taxonomy (how-to, why, differences,
                   creative writing, brainstorming, rewriting and summarising given text,
                   classification, arithmetic word problems, recommendations, plans, word meanings,
                   decisions, role play), each kind with its own slot lists written here
  self-instruct    chat messages the target itself wrote when asked for a user's question about a
                   topic (`eagle_data.self_instruct`): phrasing no template of ours has
No HumanEval, MBPP, MT-Bench or other evaluation set is read; tests check that no HumanEval prompt
text appears in the set.
"""

from __future__ import annotations

import importlib
import inspect
import random
import textwrap

STDLIB_MODULES = (
    "string textwrap difflib re json csv base64 binascii hashlib hmac heapq bisect collections "
    "functools itertools operator statistics fractions decimal math random datetime calendar "
    "shlex fnmatch glob posixpath ntpath pathlib urllib.parse html email.utils ipaddress uuid "
    "zlib gzip tarfile zipfile configparser argparse getopt copy pprint reprlib enum dataclasses "
    "graphlib textwrap colorsys locale gettext unicodedata quopri mimetypes plistlib tomllib "
    "wave sched queue secrets ast tokenize keyword inspect dis traceback warnings contextlib abc "
    "numbers typing logging optparse platform sysconfig filecmp shutil tempfile codecs struct "
    "array weakref types string http.cookies http.client urllib.request xml.dom.minidom "
    "xml.etree.ElementTree smtplib imaplib ftplib poplib socketserver"
).split()

TOPICS = (
    "photosynthesis, black holes, the French Revolution, machine learning, climate change, the water "
    "cycle, compound interest, the immune system, volcanoes, the stock market, plate tectonics, "
    "renewable energy, the Roman Empire, DNA replication, neural networks, inflation, the moon "
    "landing, quantum computing, blockchain, vaccines, the Renaissance, electric cars, sleep, "
    "meditation, time management, public speaking, learning a language, healthy eating, running a "
    "marathon, starting a small business, remote work, job interviews, saving money, budgeting, "
    "gardening, baking bread, coffee brewing, chess openings, photography, painting with "
    "watercolors, playing guitar, writing a novel, poetry, the Olympic Games, football, basketball "
    "tactics, dinosaurs, the solar system, Mars exploration, ocean currents, coral reefs, bees, "
    "migratory birds, rainforests, deserts, glaciers, earthquakes, hurricanes, the printing press, "
    "the industrial revolution, ancient Egypt, the Silk Road, democracy, human rights, the United "
    "Nations, recycling, plastic pollution, solar panels, wind turbines, nuclear power, batteries, "
    "the internet, email etiquette, social media, video games, virtual reality, 3D printing, "
    "robots, self-driving cars, smartphones, cybersecurity, passwords, cloud computing, databases, "
    "open source software, version control with git, the Linux command line, spreadsheets, "
    "statistics, probability, algebra, geometry, calculus, prime numbers, the Pythagorean theorem, "
    "gravity, electricity, magnetism, light, sound waves, the periodic table, chemical reactions, "
    "acids and bases, the human heart, the brain, nutrition, vitamins, exercise, stress, "
    "friendship, teamwork, leadership, negotiation, customer service, marketing, product design, "
    "user interviews, a job application, a birthday party, a wedding speech, a road trip, camping, "
    "travelling to Japan, visiting Paris, learning to swim, adopting a dog, caring for a cat, "
    "house plants, moving to a new city, a first day at school, studying for exams, reading habits, "
    "the history of jazz, classical music, film making, architecture, bridges, trains, airplanes, "
    "rockets, satellites, weather forecasting, maps, languages of the world, writing systems, "
    "philosophy, ethics, logic puzzles, board games, cooking pasta, making soup, pizza, chocolate, "
    "tea, farming, food waste, water conservation, city planning, public transport, bicycles"
).split(", ")

GENERAL = (
    "Explain {t} to a ten-year-old.", "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.", "What are the pros and cons of {t}?",
    "Summarize the key ideas of {t} in five bullet points.", "Write a haiku about {t}.",
    "What is the most common misconception about {t}?", "How would you teach {t} to a beginner?",
    "Write a short story that involves {t}.", "Give me a step-by-step guide related to {t}.",
    "Write a friendly email to a colleague about {t}.", "What questions should I ask an expert on {t}?",
    "Compare {t} with {u}.", "Write a tweet about {t}.", "Create a quiz with three questions about {t}.",
    "Describe the history of {t} briefly.", "What are some tips for {t}?",
    "Write a product description inspired by {t}.", "Why does {t} matter today?",
    "List five words related to {t} and define each.",
)

CODE_TASKS = (
    "reverse a linked list", "check whether a string is a palindrome", "count the vowels in a string",
    "merge two sorted lists", "find the maximum subarray sum", "compute the factorial of n",
    "return the n-th Fibonacci number", "flatten a nested list", "remove duplicates from a list while "
    "keeping order", "parse a CSV line into fields", "convert Celsius to Fahrenheit", "validate an email "
    "address with a regular expression", "find the most common word in a text", "implement binary search",
    "implement bubble sort", "implement quicksort", "implement a stack class", "implement a queue with two "
    "stacks", "compute the greatest common divisor", "check if a number is prime", "generate all "
    "permutations of a list", "transpose a matrix", "multiply two matrices", "read a JSON file and print "
    "its keys", "count lines in a file", "group words by their first letter", "rotate a list by k "
    "positions", "find the intersection of two lists", "convert a Roman numeral to an integer", "convert an "
    "integer to binary", "compute the running average of a stream", "implement an LRU cache", "check "
    "balanced parentheses", "compute the edit distance between two strings", "find all anagrams in a "
    "word list", "split a list into chunks of size n", "compute the dot product of two vectors", "sort a "
    "dictionary by value", "format a number with thousands separators", "compute the median of a list",
    "simulate rolling two dice", "find the longest common prefix", "capitalize every word in a sentence",
    "implement a binary tree insert", "do a breadth-first search on a graph", "detect a cycle in a "
    "directed graph", "compute prime factors", "encode a string with a Caesar cipher", "count characters "
    "with a dictionary", "find the second largest number", "merge two dictionaries", "implement a simple "
    "tokenizer", "compute the area of a polygon", "check if two strings are rotations", "print a "
    "multiplication table", "parse a date string", "measure how long a function takes", "retry a function "
    "call with exponential backoff", "download nothing but build a URL with query parameters",
)

CODE = (
    "Write a Python function to {c}.", "Write a Python function that will {c}. Include a docstring.",
    "How do I {c} in Python?", "Show me Python code to {c}, with a short explanation.",
    "Write a function to {c} and add a few test cases.", "Write JavaScript code to {c}.",
    "Explain, then write Python code to {c}.", "What is an efficient way to {c}? Show code.",
)


EVERYDAY_SITUATIONS = (
    "I just moved into a small flat with no balcony", "my neighbour plays loud music late at night",
    "I start a new job as a nurse next week", "my teenage son spends all day on his phone",
    "I want to run my first 10k race in two months", "our team missed a project deadline",
    "I keep forgetting to drink water during the day", "my car makes a squeaking noise when I brake",
    "I have twenty minutes to cook dinner for two", "my grandmother is turning ninety",
    "I am nervous about a dentist appointment", "my laptop has become very slow",
    "I want to learn to draw but have never tried", "our kitchen sink smells bad",
    "I have a presentation to my whole department on Friday", "my cat scratches the sofa",
    "I am saving for a trip to Portugal", "I cannot fall asleep before two in the morning",
    "my friend forgot my birthday", "I got a parking ticket I think is unfair",
    "I want to reduce how much plastic our family uses", "my sourdough never rises properly",
    "I have a small garden that gets little sun", "I need to buy a second-hand bicycle",
    "my manager gives feedback only by email", "I want to ask for a raise",
    "our family is adopting a rescue dog", "I have exams in three weeks and have not started",
    "my houseplants keep dying", "I am hosting six friends for a board game night",
    "I moved to a country where I do not speak the language", "my child is afraid of the dark",
    "I want to start journaling", "my back hurts after working at a desk all day",
    "I am planning a picnic for a school class", "I want to volunteer on weekends",
    "my bike tyre keeps going flat", "I received a job offer from two companies",
    "I am learning to play the piano at forty", "my roommate never washes the dishes",
    "the heating bill doubled this winter", "I want to write a letter to my younger self",
    "my phone battery drains before lunch", "I have leftover rice and some vegetables",
    "I need a gift for a colleague who is retiring", "I want to go camping for the first time",
    "our town is organising a clean-up day", "I am giving a toast at my sister's wedding",
    "I feel unmotivated on Monday mornings", "I want to teach my parents to use video calls",
)

EVERYDAY = (
    "{s}. What should I do?", "{s}. Can you give me some advice?", "{s}. Any tips?",
    "{s}. Can you help me make a plan for this?", "{s}. What are my options?",
    "{s}. Could you write a short message I could send about it?", "{s}. Where do I start?",
    "{s}. What mistakes should I avoid?", "{s}. Please suggest a few ideas.",
    "{s}. How do other people usually handle this?", "{s}. Is this normal?",
    "{s}. Can you explain what might be going on?", "{s}. Make me a simple checklist.",
    "{s}, and I only have a small budget. What would you suggest?", "{s}. How can I make it fun?",
    "Hi! {s}. What would you recommend?", "Quick question: {s}. What is the first step?",
    "{s}. Write a short to-do list for this week.", "{s}. What should I say?",
    "{s}. Give me the pros and cons of the options I have.",
)

ASKS = (
    "How does {t} work?", "Why is {t} important?", "What is {t}, in simple words?",
    "Can you tell me about {t}?", "What should a beginner know about {t}?",
    "What is the best way to get started with {t}?", "I'm curious about {t}. Where should I begin?",
    "Is it true that {t} is hard to understand?", "What are common mistakes people make with {t}?",
    "How has {t} changed over the last hundred years?",
)


HOWTO = (
    "change a flat bicycle tyre", "tie a tie", "write a cover letter", "remove a coffee stain from a shirt",
    "set up a home wifi network", "make cold brew coffee", "back up the photos on my phone", "start composting",
    "learn touch typing", "clean a cast iron pan", "negotiate a lower rent", "keep a sourdough starter alive",
    "make a budget spreadsheet", "paint a room", "iron a shirt", "care for a succulent", "unclog a drain",
    "prepare for a long flight", "sharpen a kitchen knife", "fold a fitted sheet",
    "make homemade pizza dough", "start a vegetable garden on a balcony", "build a birdhouse", "clean my keyboard",
    "write a haiku", "learn a song by ear", "take better photos with my phone", "organise my email inbox",
    "make a simple website", "study with flashcards", "brew green tea properly", "hang a picture straight",
    "jump-start a car", "make friends in a new city", "stop procrastinating", "keep a conversation going",
    "give constructive feedback", "write a short bio for a conference", "plan a surprise party",
    "pack a suitcase efficiently", "make a smoothie without a blender", "reduce my electricity bill",
    "teach a dog to sit", "grow herbs indoors", "cook rice without a rice cooker", "meditate for five minutes",
    "write a résumé with no work experience", "read a nutrition label", "choose a good watermelon",
    "make a paper airplane that flies far", "set goals for the new year", "calm down before an exam",
    "use a semicolon correctly", "memorise a speech", "sort my wardrobe", "start a book club",
    "install Python on Windows", "create a virtual environment in Python", "undo the last git commit",
    "find large files on Linux", "write a unit test in Python", "format a date in JavaScript",
)

WHY = (
    "the ocean is salty", "leaves change colour in autumn", "we have leap years", "bread goes stale",
    "onions make us cry", "planes leave white trails in the sky", "sleep helps memory", "we get hiccups",
    "ice floats on water", "prices tend to rise over time", "the moon has phases", "we yawn", "metal feels cold",
    "rainbows are curved", "some people are left-handed", "bees make honey", "the Earth has seasons",
    "our voices sound different on recordings", "soap removes grease", "popcorn pops", "birds fly in a V shape",
    "the Dead Sea is so salty", "some numbers are called irrational", "computers use binary", "stars twinkle",
    "dogs wag their tails", "we need vitamin D", "rust forms on iron", "music can change our mood",
    "a boomerang comes back", "the Leaning Tower of Pisa leans", "zebras have stripes", "we dream",
    "batteries lose charge in the cold", "the Roman Empire fell", "coffee keeps people awake",
)

DIFFERENCES = (
    ("weather", "climate"), ("a CPU", "a GPU"), ("stocks", "bonds"), ("an alligator", "a crocodile"),
    ("RAM", "storage"), ("mitosis", "meiosis"), ("speed", "velocity"), ("a list", "a tuple in Python"),
    ("affect", "effect"), ("baking soda", "baking powder"), ("a comet", "an asteroid"), ("HTTP", "HTTPS"),
    ("a simile", "a metaphor"), ("empathy", "sympathy"), ("a debit card", "a credit card"), ("TCP", "UDP"),
    ("a lake", "a pond"), ("a hurricane", "a tornado"), ("an app", "a website"), ("a latte", "a cappuccino"),
    ("a democracy", "a republic"), ("a frog", "a toad"), ("a psychologist", "a psychiatrist"),
    ("a compiler", "an interpreter"), ("weight", "mass"), ("a loan", "a grant"), ("a poem", "a song"),
    ("an LLC", "a sole proprietorship"), ("an ethernet cable", "wifi"), ("a rabbit", "a hare"),
    ("SQL", "NoSQL databases"), ("a median", "a mean"), ("a novel", "a novella"), ("jam", "jelly"),
)

FORMS = (
    "a short poem", "a limerick", "a two-paragraph story", "a fable with a moral", "a diary entry",
    "a dialogue between two friends", "an opening paragraph for a novel", "the chorus of a song",
    "a short motivational speech", "a bedtime story for a five-year-old", "a funny short scene",
    "a postcard", "a letter from the future", "a short mystery", "a news report from the year 2100",
)

SUBJECTS = (
    "a lighthouse keeper", "a lost umbrella", "the first snow of winter", "a robot learning to cook",
    "a city at night", "an old library", "a dragon who is afraid of heights", "a long train journey",
    "a forgotten key", "a dog finding its way home", "a talking tree", "the last day of summer",
    "a tiny village by the sea", "a scientist who shrinks", "an astronaut's first morning on Mars",
    "a grandfather's watch", "a rainy Monday", "a friendship between a cat and a crow", "a broken clock",
    "a market in the early morning", "a kite that would not fly", "a mountain climber", "a secret garden",
)

BRAINSTORM = (
    "a rainy weekend with kids", "a science fair project", "a team-building activity", "a personal finance blog",
    "a themed dinner party", "a short film", "a mobile app that helps students", "reducing screen time",
    "a gift under 20 dollars", "a podcast episode", "names for a hiking club", "names for a pet hamster",
    "slogans for a recycling campaign", "a school fundraiser", "a first date", "a YouTube channel",
    "using leftover bread", "making a small bedroom feel bigger", "a neighbourhood festival",
    "a company newsletter", "staying active in winter", "a side business", "an escape room puzzle",
    "a book club meeting", "a garden on a budget", "breaking the ice at a meeting",
)

SENTENCES = (
    "me and him goes to the store yesterday and buyed apples",
    "The meeting has been moved to Thursday because several people could not attend on Tuesday.",
    "i think this product is really good but the price is kind of too high for most people",
    "Please be advised that the parking lot will be closed for repairs during the whole of next week.",
    "The results of the experiment were not what the team had expected at the start.",
    "we was very tired after the long walk so we sitted down",
    "Our new app lets you track your spending, set savings goals and share budgets with family.",
    "The museum is open every day except Monday, and entry is free for children under twelve.",
    "He don't know nothing about cars but he want to buy one",
    "Due to unforeseen circumstances, the concert scheduled for this evening has been postponed.",
    "The river flooded the lower part of the town after three days of heavy rain.",
    "Can you send me the report by tomorrow, I need it for the presentation.",
)

PROSE = tuple(x for x in SENTENCES if x[0].isupper())  # the well-formed ones, for summaries

REVIEWS = (
    "The food arrived cold and the waiter ignored us for twenty minutes.",
    "Absolutely loved this book, I could not put it down.",
    "The hotel was fine, nothing special, but the location was convenient.",
    "This blender broke after two uses. Waste of money.",
    "Friendly staff, fast delivery and the shoes fit perfectly.",
    "The film had great music but the story dragged in the middle.",
)

WORDS = (
    "serendipity", "ubiquitous", "ephemeral", "pragmatic", "resilient", "meticulous", "ambiguous", "candid",
    "benevolent", "frugal", "nostalgia", "procrastinate", "eloquent", "tenacious", "obsolete", "mundane",
    "paradox", "catalyst", "empathy", "hypothesis", "itinerary", "jargon", "leverage", "milestone",
)

THINGS = ("books", "board games", "houseplants", "podcasts", "exercises", "hobbies", "weekend trips",
          "healthy snacks", "films", "apps for learning", "card games", "easy recipes")

WHO = ("a beginner", "a busy parent", "a retired teacher", "a college student", "someone who loves history",
       "a person living in a small apartment", "a ten-year-old", "a night-shift worker", "a new programmer")

GOALS = ("learn basic Spanish", "get better at chess", "declutter my home", "prepare for a job fair",
         "start running", "read more books", "learn to cook five dishes", "improve my handwriting",
         "build a simple website", "save for a holiday", "get up earlier", "learn to juggle",
         "write a short story", "learn the basics of SQL", "eat more vegetables")

CHOICES = (("rent", "buy a flat"), ("learn Python", "learn JavaScript first"), ("take the train", "drive"),
           ("get a cat", "get a dog"), ("study abroad", "stay home for university"),
           ("work from home", "go to the office"), ("buy a laptop", "a desktop computer"),
           ("paint the room myself", "hire someone"), ("cook at home", "order a meal kit"))

ROLES = ("a travel agent", "a personal trainer", "a history teacher", "a chef", "a career coach",
         "a librarian", "a museum guide", "a gardener", "a math tutor")

ANIMALS = ("a dolphin", "a penguin", "a bat", "a salamander", "a shark", "an ostrich", "a whale", "a turtle",
           "a platypus", "an eel", "a seal", "a lizard")


def _task(rng: random.Random, kind: int) -> str:
    """One prompt of the taxonomy's kind `kind` (0..14)."""
    n = rng.choice((3, 4, 5, 7, 10))
    if kind == 0:
        return rng.choice(("How do I {h}?", "What is the easiest way to {h}?", "Can you explain how to {h}?",
                           "Give me step-by-step instructions to {h}.")).format(h=rng.choice(HOWTO))
    if kind == 1:
        return rng.choice(("Why is it that {w}?", "Can you explain why {w}?", "I always wondered why {w}. Do you know?",
                           "Explain simply why {w}.")).format(w=rng.choice(WHY))
    if kind == 2:
        a, b = rng.choice(DIFFERENCES)
        return rng.choice(("What is the difference between {a} and {b}?", "How is {a} different from {b}?",
                           "{A} or {b}: how do I tell them apart?")).format(a=a, b=b, A=a[0].upper() + a[1:])
    if kind == 3:
        return f"Write {rng.choice(FORMS)} about {rng.choice(SUBJECTS)}."
    if kind == 4:
        return rng.choice(("Give me {n} ideas for {x}.", "Brainstorm {n} ideas for {x}.",
                           "I need {n} creative ideas for {x}.")).format(n=n, x=rng.choice(BRAINSTORM))
    if kind == 5:
        return rng.choice(("Rewrite this sentence to sound more formal: {s}", "Fix the grammar in this sentence: {s}",
                           "Make this shorter and clearer: {s}", "Rewrite this in a friendly tone: {s}",
                           "Paraphrase this sentence: {s}")).format(s=rng.choice(SENTENCES))
    if kind == 6:
        return rng.choice(('Is this review positive or negative? "{r}"', 'What is the sentiment of this review: "{r}"',
                           'Classify the tone of this customer comment: "{r}"')).format(r=rng.choice(REVIEWS))
    if kind == 7:
        a, b, c = rng.randint(2, 90), rng.randint(2, 12), rng.randint(5, 95)
        return rng.choice((f"If a train travels {a * b} km in {b} hours, what is its average speed?",
                           f"I have {a + c} apples and give away {c}. How many are left?",
                           f"What is {c}% of {a * 10}? Show your working.",
                           f"A rectangle is {b} m wide and {a} m long. What are its area and perimeter?",
                           f"Convert {a} miles to kilometres.",
                           f"A shirt costs {a} dollars and is {c}% off. What is the new price?"))
    if kind == 8:
        return rng.choice(("Recommend {n} {t} for {w}.", "What {t} would you suggest for {w}?",
                           "Can you list some good {t} for {w}?")).format(n=n, t=rng.choice(THINGS), w=rng.choice(WHO))
    if kind == 9:
        return rng.choice(("Make a {d} plan to {g}.", "Help me {g}. I want a {d} plan.",
                           "Create a simple {d} schedule to {g}.")).format(
            d=rng.choice(("one-week", "30-day", "weekend", "four-week", "daily")), g=rng.choice(GOALS))
    if kind == 10:
        return rng.choice(("What does the word '{w}' mean? Use it in a sentence.", "Define '{w}' and give an example.",
                           "Explain the meaning of '{w}' in simple words.")).format(w=rng.choice(WORDS))
    if kind == 11:
        a, b = rng.choice(CHOICES)
        return rng.choice(("Should I {a} or {b}? Help me decide.", "What are the pros and cons: {a} or {b}?",
                           "I can't decide whether to {a} or {b}. What do you think?")).format(a=a, b=b)
    if kind == 12:
        return f"You are {rng.choice(ROLES)}. " + rng.choice((
            "Introduce yourself and tell me how you can help.", "What is your best piece of advice for me?",
            f"Answer my question: what should {rng.choice(WHO)} know about {rng.choice(TOPICS)}?"))
    if kind == 13:
        xs = rng.sample(ANIMALS, 4)
        return rng.choice((f"Is {xs[0]} a mammal, a bird, a fish or a reptile?",
                           f"Sort these animals into mammals and others: {', '.join(xs)}.",
                           f"Which of these can fly: {', '.join(xs)}?"))
    return rng.choice(("Summarize this in one sentence: {s}", "What is the main point of this text? {s}",
                       "Turn this into a bullet list: {s}")).format(s=" ".join(rng.sample(PROSE, 3)))


def task_prompts(n: int, seed: int = 0) -> list[dict]:
    """n chat prompts from the instruction taxonomy (duplicates dropped, kinds in turn)."""
    rng = random.Random(seed + 101)
    seen, rows = set(), []
    for i in range(n * 20):
        if len(rows) == n:
            break
        text = _task(rng, i % 15)
        if text not in seen:
            seen.add(text)
            rows.append({"id": f"task-{len(rows)}", "messages": [{"role": "user", "content": text}]})
    return rows


def _stdlib_functions(rng: random.Random, limit: int) -> list[tuple[str, str, str]]:
    """(module, signature line, docstring) of public stdlib functions with docstrings."""
    out = []
    for name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing on this Python is just skipped
            continue
        for fname, fn in sorted(vars(mod).items()):
            if fname.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            doc = inspect.getdoc(fn)
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            if doc and 20 <= len(doc) <= 1200:
                out.append((name, f"def {fname}{sig}:", doc))
    rng.shuffle(out)
    return out[:limit]


def build_prompts(n_general: int = 900, n_code_chat: int = 500, n_completion: int = 600,
                  seed: int = 0, n_everyday: int = 0, n_tasks: int = 0) -> list[dict]:
    """A shuffled list of {"id", "prompt"} (raw completion) or {"id", "messages"} (chat)."""
    rng = random.Random(seed)
    rows: list[dict] = task_prompts(n_tasks, seed)
    for i in range(n_everyday):
        if i % 4 == 3:  # a plain question about a topic, asked conversationally
            text = rng.choice(ASKS).format(t=rng.choice(TOPICS))
        else:
            s = rng.choice(EVERYDAY_SITUATIONS)
            text = rng.choice(EVERYDAY).format(s=s[0].upper() + s[1:])
        rows.append({"id": f"everyday-{i}", "messages": [{"role": "user", "content": text}]})
    for i in range(n_general):
        t, u = rng.sample(TOPICS, 2)
        rows.append({"id": f"chat-{i}", "messages": [{"role": "user",
                                                      "content": rng.choice(GENERAL).format(t=t, u=u)}]})
    funcs = _stdlib_functions(rng, n_completion + n_code_chat)
    for i in range(n_code_chat):
        if i % 2 and funcs:
            mod, sig, doc = funcs[(n_completion + i) % len(funcs)]
            first = doc.split("\n")[0].rstrip(".")
            task = first[0].lower() + first[1:]
            text = rng.choice((f"Write a Python function that does this: {task}.",
                               f"Implement `{sig[4:-1]}` in Python. It should: {task}.",
                               f"What does `{mod}.{sig[4:sig.index('(')]}` do? Give an example."))
        else:
            text = rng.choice(CODE).format(c=rng.choice(CODE_TASKS))
        rows.append({"id": f"code-chat-{i}", "messages": [{"role": "user", "content": text}]})
    for i, (mod, sig, doc) in enumerate(funcs[:n_completion]):
        body = textwrap.indent(f'"""{doc}\n"""\n', "    ")
        head = f"import {mod.split('.')[0]}\n\n\n" if i % 3 == 0 else ""
        rows.append({"id": f"complete-{i}", "prompt": f"{head}{sig}\n{body}"})
    rng.shuffle(rows)
    return rows
