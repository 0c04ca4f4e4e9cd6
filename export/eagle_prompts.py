"""Training prompts for drafter heads (EAGLE, Medusa): written here, never taken from a benchmark.

Three kinds, so the head sees what the target really writes:
  code completion  raw text: a signature + docstring of a Python standard-library function (read
                   from this machine's own stdlib with `inspect`), which the target continues
  code chat        chat messages: "write a function that <first docstring line>" and other
                   programming requests built from the same stdlib docstrings and from topic lists
  general chat     chat messages: instruction templates x topics (explain, list, compare, email...)
  everyday chat    chat messages: first-person requests about daily life (a situation + what the
                   user wants: advice, a plan, a message to write, an explanation, ideas)
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
                  seed: int = 0, n_everyday: int = 0) -> list[dict]:
    """A shuffled list of {"id", "prompt"} (raw completion) or {"id", "messages"} (chat)."""
    rng = random.Random(seed)
    rows: list[dict] = []
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
