"""The wide prompt mix for drafter self-distillation: text the target copies, translates or reshapes.

Drafters trained only on short questions guess badly once the answer leans on text nobody here
wrote (a pasted passage, an earlier turn, a code snippet). `wide_prompts` adds those shapes, in
nine families mixed evenly (a row's `kind` names its family):
  passage    summarize / extract / answer about / translate / rewrite a given passage; passages
             are prose paragraphs from this machine's own documentation (stdlib docstrings,
             /usr/share/doc READMEs and copyright files) plus a few written here
  multiturn  user turn, a short assistant turn written here, then a follow-up request
  math       word problems with random numbers, asked step by step
  roleplay   persona + situation + what the user says
  code       small tasks in ten languages, explain a snippet, find the bug, convert Python
  short      one-line facts, yes/no with a reason, definitions
  long       essays, guides and stories with an explicit length
  writing    emails and letters, reviews, creative writing under a constraint
  json       classification and extraction answered in JSON
Every template and slot list is written here; nothing is read from a benchmark.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import inspect
import json
import random
import re
import warnings
from pathlib import Path

FAMILIES = ("passage", "multiturn", "math", "roleplay", "code", "short", "long", "writing", "json")

DOC_MODULES = (
    "asyncio concurrent.futures threading multiprocessing subprocess socket selectors queue sched "
    "unittest doctest pdb timeit trace pickle shelve sqlite3 io os heapq bisect collections functools "
    "itertools decimal fractions random statistics datetime calendar textwrap difflib re json csv email "
    "mailbox http.server urllib.request xml.sax logging argparse optparse enum dataclasses typing abc "
    "contextlib weakref inspect ast tokenize zipfile tarfile shutil tempfile glob pathlib locale gettext "
    "codecs string struct array secrets hashlib hmac base64 uuid ipaddress configparser pprint copy "
    "numbers operator graphlib wave zlib gzip bz2 lzma html.parser"
).split()

WRITTEN_PASSAGES = (
    "The town library opened a tool lending shelf last spring. Members can borrow a drill, a ladder or a "
    "sewing machine for up to a week, the same way they borrow books. The idea came from a volunteer who "
    "noticed that most households own tools they use twice a year. In its first six months the shelf "
    "lent out more than four hundred items, and only three came back damaged.",
    "Cold frames are low boxes with a transparent lid that sit directly on garden soil. They trap the "
    "heat of the sun during the day and protect seedlings from frost at night. Gardeners use them to "
    "start vegetables several weeks before the last frost, or to keep lettuce growing into early winter. "
    "On warm afternoons the lid must be propped open, otherwise the plants inside can overheat.",
    "When the ferry service to the island was cut from four crossings a day to two, local shops felt it "
    "within a month. Day visitors stopped coming because the last boat back left too early, and the "
    "bakery reduced its opening hours. The island council has now asked the regional transport office "
    "to restore an evening crossing during the summer months at least.",
    "Our support team answers messages in the order they arrive. Most questions about passwords and "
    "billing are solved within one working day. Questions that need an engineer can take up to a week, "
    "and in that case we send an update every two days so that nobody is left waiting without news. "
    "Please include your account number and a short description of what you expected to happen.",
    "A good sourdough starter needs only flour, water and patience. For the first five days the mixture "
    "is fed once a day and kept in a warm place. Bubbles appear after two or three days, but the starter "
    "is ready only when it reliably doubles in size within a few hours of feeding. After that it can "
    "live in the fridge and be fed once a week.",
    "The museum's new wing is devoted to everyday objects from the last hundred years: radios, kitchen "
    "scales, school desks and telephones. Each room covers one decade, and visitors are encouraged to "
    "touch a selection of objects that have been set aside for handling. The curators say the aim is to "
    "show how ordinary life changed, rather than to celebrate rare or valuable pieces.",
    "Version control keeps a history of every change made to a set of files. Each saved change records "
    "who made it, when, and a short message explaining why. If a later change breaks something, the "
    "team can compare versions to find the cause or return to an earlier state. Branches let several "
    "people work on different features at once and combine their work when it is ready.",
    "The cycling club meets every Saturday at eight in front of the station. Rides are between forty and "
    "seventy kilometres, with a coffee stop halfway. New riders are welcome but should bring a spare "
    "inner tube and a pump, and a helmet is required. In winter the club switches to shorter routes and "
    "cancels rides when the roads are icy.",
    "Night trains are coming back in several countries. Travellers like that they can sleep on the way "
    "and arrive in a city centre in the morning, saving a hotel night. Operators, however, say the trains "
    "are expensive to run because each carriage carries fewer people than a day train, and track access "
    "fees at night are not always lower. Most new routes depend on public support.",
    "The school replaced its paper timetable with a shared online calendar this year. Teachers can now "
    "move a lesson and every student in the class sees the change at once. Parents asked for a weekly "
    "summary by email as well, because not every family checks the calendar daily. The school plans to "
    "review how well the new system works at the end of the first term.",
    "A heat pump moves heat instead of making it. In winter it pulls warmth from the outside air or the "
    "ground and releases it indoors; in summer it can run the other way and cool the house. Because "
    "moving heat takes less energy than producing it, a heat pump can deliver three or four units of "
    "heat for each unit of electricity it uses, though the gain shrinks in very cold weather.",
    "The community garden has twenty-four plots, each rented for a small yearly fee. Plot holders agree "
    "to keep paths clear, to compost their green waste and to water at least twice a week in summer. "
    "Tools are kept in a shared shed, and a rota decides who opens the gate on weekday evenings. There is "
    "currently a waiting list of about a year for a new plot.",
)


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, lines joined ("." lines separate Debian copyright paragraphs)."""
    out, cur = [], []
    for line in text.splitlines() + [""]:
        s = line.strip()
        if s in ("", "."):
            if cur:
                out.append(" ".join(cur))
            cur = []
        else:
            cur.append(s)
    return out


LEGAL = re.compile(r"licen[cs]e|warrant|copyright|permission|liabilit|redistribut", re.I)


def _is_prose(par: str, first_line: str = "") -> bool:
    """A readable paragraph: 40-170 words of sentences, not code, a table, a list, a licence shout or
    an address, no licence text (170, not 200: prompts over the data job's 384-token cap would be skipped)."""
    words = par.split()
    if not 40 <= len(words) <= 170 or "@" in par or "http" in par or "---" in par or "===" in par:
        return False
    if LEGAL.search(par):  # licence boilerplate repeats across hundreds of packages: a few are plenty
        return False
    if re.match(r"[A-Z][\w-]*:\s", first_line or par) or par.lstrip().startswith((">>>", "$", "|", "*", "-", "#")):
        return False
    plain = sum(c.isalpha() or c.isspace() or c in ".,;:'\"()-" for c in par) / len(par)
    letters = [c for c in par if c.isalpha()]
    upper = sum(c.isupper() for c in letters) / max(1, len(letters))
    sentences = par.count(". ") + par.rstrip().endswith(".")
    return plain > 0.95 and upper < 0.12 and sentences >= 2 and 3.5 <= len(letters) / len(words) <= 8


def _read_doc(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read(40_000)
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def passages() -> tuple[str, ...]:
    """Prose paragraphs from this machine's documentation plus the written ones, in a fixed order."""
    found: list[tuple[str, str]] = []  # (source, paragraph): sorted below, so listing order is irrelevant
    with warnings.catch_warnings():  # deprecated aliases (typing.io...) warn when their docstring is read
        warnings.simplefilter("ignore")
        for name in DOC_MODULES:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module missing on this Python is just skipped
                continue
            objs = [mod] + [v for _, v in sorted(vars(mod).items()) if (inspect.isclass(v) or inspect.isfunction(v))
                            and getattr(v, "__module__", None) == mod.__name__]
            for obj in objs:
                doc = inspect.getdoc(obj) or ""
                found += [(f"py:{name}:{getattr(obj, '__name__', '')}", p) for p in _paragraphs(doc)]
    root = Path("/usr/share/doc")
    if root.is_dir():
        for pkg in sorted(root.iterdir()):
            if not pkg.is_dir():
                continue
            for f in sorted(pkg.iterdir()):
                if f.name.startswith("README") or f.name == "copyright":
                    found += [(str(f), p) for p in _paragraphs(_read_doc(f))]
    seen, per_source, out = set(), {}, []
    for src, par in sorted(found):
        key = par.lower()[:80]
        if key in seen or per_source.get(src, 0) >= 3 or not _is_prose(par):
            continue
        seen.add(key)
        per_source[src] = per_source.get(src, 0) + 1
        out.append(par)
    return tuple(out) + WRITTEN_PASSAGES


# ---------------------------------------------------------------- passage
PASSAGE_TASKS = (
    "Summarize the passage in {n} sentences.", "Give me a one-paragraph summary of this text.",
    "Summarize this for someone who has never heard of the subject.", "What is the main point of this passage?",
    "Write a TL;DR of this text.", "Summarize the passage as {n} bullet points.",
    "List the key facts stated in this passage.", "Extract every concrete fact from the text as a numbered list.",
    "Make a list of the names, terms and numbers mentioned in this passage.",
    "Which technical terms appear in the text? List them with a short gloss each.",
    "Read the passage and answer: what problem does it describe, and what is the proposed solution?",
    "According to the passage, what should a reader do first?",
    "Based only on this text, what are the limitations mentioned?",
    "Write three questions that this passage answers, and answer each one.",
    "Does the passage give any reason or cause? Quote it and explain.",
    "Translate this passage into {lang}.", "Please translate this text to {lang}, keeping the meaning exact.",
    "Give a {lang} translation of this paragraph.", "Translate the text into {lang} for a general reader.",
    "Rewrite this passage in simpler words for a {age}-year-old.", "Rewrite the text in a formal tone.",
    "Make this passage about half as long without losing the key information.",
    "Rewrite the following as a friendly explanation for a beginner.", "Rewrite this paragraph in plain English.",
    "Turn this passage into a short dialogue between a student and a teacher.",
    "Rewrite the text as a numbered list of steps or points.",
)
LANGS = ("French", "Spanish", "German")
FRAMES = ("{task}\n\n{p}", "{task}\n\n\"\"\"\n{p}\n\"\"\"", "{p}\n\n{task}", "Text:\n{p}\n\nTask: {task}",
          "Here is a paragraph from some documentation:\n\n{p}\n\n{task}")

# ---------------------------------------------------------------- multi-turn
QA = (
    ("What is a hash table?", "A hash table stores key-value pairs. It runs each key through a hash function to "
     "pick a slot in an array, so lookups, inserts and deletes take constant time on average."),
    ("Why do we get jet lag?", "Jet lag happens when your body clock is still set to the time zone you left. "
     "Light, meals and sleep times slowly shift it, usually by about an hour a day."),
    ("How does a refrigerator keep food cold?", "A fridge pumps a refrigerant around a loop. The liquid evaporates "
     "inside, absorbing heat, and a compressor pushes it to the coils at the back where the heat is released."),
    ("What is inflation?", "Inflation is the general rise in prices over time, which means each unit of money "
     "buys a little less than before. Central banks usually aim to keep it low and steady."),
    ("What does a project manager do?", "A project manager plans the work, sets the schedule and budget, keeps "
     "the team coordinated and tells stakeholders how the project is going."),
    ("How do vaccines work?", "A vaccine shows the immune system a harmless piece or version of a germ, so it "
     "learns to recognise it. If the real germ arrives later, the body can respond much faster."),
    ("What is a budget?", "A budget is a plan for your money: you list your expected income, decide how much "
     "goes to each kind of spending and saving, and then track what actually happens."),
    ("What is recursion in programming?", "Recursion is when a function calls itself on a smaller version of "
     "the same problem, stopping at a base case that it can answer directly."),
    ("Why is the sea salty?", "Rain slowly dissolves minerals from rocks and rivers carry them to the sea. "
     "When sea water evaporates the salt stays behind, so it builds up over millions of years."),
    ("What is a good way to start learning the guitar?", "Start with a few open chords such as G, C, D and E "
     "minor, practise switching between them for ten minutes a day, and learn one simple song that uses them."),
    ("What is compound interest?", "Compound interest is interest earned on both your original money and on "
     "the interest already added, so savings grow faster the longer they are left alone."),
    ("How do I keep basil alive indoors?", "Give it a sunny windowsill, water when the top of the soil is dry, "
     "and pinch off the top leaves regularly so the plant grows bushy instead of flowering."),
    ("What is an API?", "An API is a defined way for one program to ask another for data or actions, such as a "
     "list of URLs a web service answers and the format of its requests and replies."),
    ("Why do cats purr?", "Cats purr when they are content, but also when stressed or hurt. The vibration "
     "comes from the muscles of the larynx and may help them calm down."),
    ("What is a thesis statement?", "A thesis statement is one or two sentences, usually at the end of the "
     "introduction, that state the main claim an essay will argue."),
    ("How does a bill become a law?", "In many parliaments a bill is proposed, debated and amended in "
     "committee, voted on in each chamber, and then signed or approved by the head of state."),
    ("What is a container in software?", "A container packages an application with its libraries and settings "
     "so it runs the same way on any machine, sharing the host's kernel instead of a full virtual machine."),
    ("How do I make a cup of pour-over coffee?", "Rinse a paper filter, add medium-fine ground coffee, pour a "
     "little hot water to let it bloom for 30 seconds, then pour the rest slowly in circles."),
    ("What causes tides?", "Tides are caused mainly by the Moon's gravity pulling on the oceans, with a smaller "
     "effect from the Sun. Most coasts see two high tides and two low tides a day."),
    ("What is a SWOT analysis?", "A SWOT analysis lists an organisation's Strengths, Weaknesses, Opportunities "
     "and Threats, to help plan strategy."),
)
FOLLOW_UPS = (
    "Make it shorter.", "Now put that in bullet points.", "Can you give an example?", "Explain it like I'm five.",
    "Can you say that in one sentence?", "What about the downsides?", "Why is that?", "Can you go into more detail?",
    "Now write it as a short poem.", "Turn that into a quiz question with four options.",
    "Translate your answer into {lang}.", "Can you make it more formal?", "What are common mistakes here?",
    "How would you explain that to my grandmother?", "Give me three follow-up questions I could research.",
    "Is there a simple analogy for this?", "What would an expert add to that?", "Summarize that in ten words.",
    "And what about {other}?", "How does that compare with {other}?",
)
OTHERS = ("a linked list", "travel east versus west", "a freezer", "deflation", "a product owner", "antibiotics",
          "a savings plan", "loops", "lakes", "the piano", "simple interest", "mint", "a web page", "dogs",
          "a topic sentence", "a referendum", "a virtual machine", "espresso", "waves", "a risk register")
CODE_TURNS = (
    ("Write a Python function that returns the largest even number in a list, or None.",
     "```python\ndef largest_even(xs):\n    evens = [x for x in xs if x % 2 == 0]\n    return max(evens) if evens "
     "else None\n```"),
    ("How do I read a text file and count its lines in Python?",
     "```python\nwith open(\"notes.txt\") as f:\n    n = sum(1 for _ in f)\nprint(n)\n```"),
    ("Write a JavaScript function that capitalizes the first letter of each word.",
     "```javascript\nfunction titleCase(s) {\n  return s.split(' ').map(w => w.charAt(0).toUpperCase() + "
     "w.slice(1)).join(' ');\n}\n```"),
    ("Give me a SQL query for the ten customers with the most orders.",
     "```sql\nSELECT customer_id, COUNT(*) AS n\nFROM orders\nGROUP BY customer_id\nORDER BY n DESC\nLIMIT 10;\n```"),
    ("Write a bash one-liner that lists the five biggest files in the current folder.",
     "```bash\nls -S | head -n 5\n```"),
    ("Write a C function that sums an array of ints.",
     "```c\nint sum(const int *a, int n) {\n    int s = 0;\n    for (int i = 0; i < n; i++) s += a[i];\n    return s;"
     "\n}\n```"),
)
CODE_FOLLOW_UPS = ("Add type hints or types where the language allows.", "Now add a few tests.",
                   "Explain it line by line.", "Can you make it handle empty input?", "Rewrite it in Rust.",
                   "Rewrite it in Go.", "What is its time complexity?", "Can you make it shorter?",
                   "Add comments.", "Rewrite it in TypeScript.", "How would I use it? Show an example call.")

# ---------------------------------------------------------------- role play
PERSONAS = (
    "a patient bicycle mechanic", "a strict but fair chess coach", "a cheerful hotel receptionist",
    "a ship's captain in the 1800s", "a pharmacist at a night shift", "a park ranger", "a medieval innkeeper",
    "a job interviewer at a software company", "a detective in a foggy city", "a friendly language tutor",
    "a museum guard who loves paintings", "a customer support agent for an internet provider",
    "a grumpy old wizard", "a tour guide in Rome", "a spaceship's on-board computer", "a bakery owner",
    "a football coach at half time", "a librarian in a tiny village", "a landlord showing a flat",
    "a nutritionist", "a time traveller from the year 2300", "a retired astronaut visiting a school",
    "a car salesperson", "a fitness instructor", "a pirate who is afraid of water",
)
SITUATIONS = (
    "It is a rainy evening and the place is almost empty.", "A customer arrives ten minutes before closing.",
    "You have just met the user for the first time.", "The user looks lost and worried.",
    "Something has gone wrong and the user is annoyed.", "It is a busy Saturday morning.",
    "The user is a child asking many questions.", "The user wants a discount.",
    "You are running late for another appointment.", "The user is trying to practise a language with you.",
)
SAYS = (
    "Hello, can you help me?", "I think I've made a mistake. What now?", "What do you recommend?",
    "Why should I trust you?", "Tell me a story from your past.", "How much will this cost me?",
    "I'm not sure I understand. Can you explain again?", "What's the strangest thing that has happened to you?",
    "I need this done by tomorrow.", "Can I ask you a personal question?", "What would you do in my place?",
    "Is there anything I should be careful about?",
)

# ---------------------------------------------------------------- code
LANGUAGES = ("JavaScript", "TypeScript", "C", "C++", "Rust", "Go", "Java", "Python")
PROG_TASKS = (
    "returns the number of words in a string", "checks whether a year is a leap year",
    "converts a string to snake_case", "returns the two largest numbers in an array",
    "removes every vowel from a string", "counts how often each character occurs",
    "checks whether two words are anagrams", "returns the sum of the digits of an integer",
    "clamps a number between a minimum and a maximum", "reverses the words in a sentence",
    "finds the index of the smallest element", "computes a running total of an array",
    "checks whether a matrix is symmetric", "returns the nth triangular number",
    "validates that a string contains only digits", "merges overlapping intervals",
    "computes the Hamming distance of two strings", "zips two arrays into an array of pairs",
    "splits a string into lines and trims each one", "returns the first non-repeating character",
    "converts minutes into an hours:minutes string", "computes the average of the positive numbers",
    "parses a 'key=value' string into a map", "rounds a price to the nearest 0.05",
    "returns every third element of a list", "checks whether brackets in a string are balanced",
    "finds the longest word in a sentence", "counts the set bits of an integer",
    "implements a fixed-size ring buffer", "converts a hex color like #ff8800 to RGB values",
)
SQL_TASKS = (
    "the total sales per month from a table sales(id, amount, sold_at)",
    "employees who earn more than their manager, given employees(id, name, salary, manager_id)",
    "the three most popular products from order_items(order_id, product_id, qty)",
    "customers who have never placed an order, given customers(id, name) and orders(id, customer_id)",
    "the average rating per book, only for books with at least five ratings, from ratings(book_id, stars)",
    "duplicate email addresses in a users(id, email) table",
    "the second highest salary in employees(id, salary)",
    "each department's newest hire from employees(id, dept, hired_on)",
    "the number of sign-ups per day for the last 30 days from users(id, created_at)",
    "orders whose total is above the average order total, from orders(id, total)",
    "students enrolled in more than three courses, given enrollments(student_id, course_id)",
    "the running balance per account from transactions(account_id, amount, made_at)",
    "products that were never sold, given products(id, name) and sales(product_id, qty)",
    "the busiest hour of the day from visits(id, visited_at)",
)
SQL_DIALECTS = ("", " Use PostgreSQL.", " It should work in SQLite.", " I'm on MySQL 8.",
                " Explain each clause briefly.")
BASH_TASKS = (
    "renames every .jpeg file in a folder to .jpg", "counts the lines of all .py files under a directory",
    "backs up a folder into a dated tar.gz archive", "prints the ten most common words in a text file",
    "checks whether a website answers and prints the status code", "deletes log files older than seven days",
    "watches a file and prints new lines as they appear", "lists the users who are logged in, without duplicates",
    "finds every TODO comment in a source tree with file and line", "converts all .wav files in a folder to .mp3",
    "prints the disk usage of each subfolder, largest first", "retries a command up to five times",
    "splits a big CSV file into files of 1000 lines each", "shows which process listens on a given port",
)
CODE_EXTRAS = ("", " Keep it idiomatic.", " Add short comments.", " No external libraries.",
               " Handle edge cases.", " Explain the approach first.")
SNIPPETS = (
    ("Python", "def f(xs):\n    return {x: xs.count(x) for x in set(xs)}"),
    ("JavaScript", "const debounce = (fn, ms) => {\n  let t;\n  return (...a) => { clearTimeout(t); "
     "t = setTimeout(() => fn(...a), ms); };\n};"),
    ("C", "int f(const char *s) {\n    int n = 0;\n    while (*s++) n++;\n    return n;\n}"),
    ("Rust", "fn mean(v: &[f64]) -> Option<f64> {\n    if v.is_empty() { return None; }\n    "
     "Some(v.iter().sum::<f64>() / v.len() as f64)\n}"),
    ("Go", "func reverse(s string) string {\n\tr := []rune(s)\n\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 "
     "{\n\t\tr[i], r[j] = r[j], r[i]\n\t}\n\treturn string(r)\n}"),
    ("SQL", "SELECT dept, COUNT(*) FROM staff GROUP BY dept HAVING COUNT(*) > 3;"),
    ("bash", "for f in *.txt; do wc -w \"$f\"; done | sort -n | tail -1"),
    ("TypeScript", "function pick<T, K extends keyof T>(o: T, keys: K[]): Pick<T, K> {\n  const r = {} as Pick<T, K>;"
     "\n  for (const k of keys) r[k] = o[k];\n  return r;\n}"),
    ("Java", "static int gcd(int a, int b) {\n    return b == 0 ? a : gcd(b, a % b);\n}"),
    ("C++", "std::vector<int> v{5, 2, 9};\nstd::sort(v.begin(), v.end(), std::greater<int>());"),
)
BUGGY = (
    ("Python", "def average(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs) - 1"),
    ("Python", "def last_n(xs, n):\n    return xs[len(xs) - n - 1:]"),
    ("JavaScript", "function sum(arr) {\n  let s = 0;\n  for (let i = 0; i <= arr.length; i++) s += arr[i];\n  "
     "return s;\n}"),
    ("C", "char *copy(const char *s) {\n    char *d = malloc(strlen(s));\n    strcpy(d, s);\n    return d;\n}"),
    ("Python", "def add_item(item, items=[]):\n    items.append(item)\n    return items"),
    ("Go", "func max(xs []int) int {\n\tm := 0\n\tfor _, x := range xs {\n\t\tif x > m {\n\t\t\tm = x\n\t\t}\n\t}\n"
     "\treturn m\n}"),
    ("Java", "boolean same(String a, String b) {\n    return a == b;\n}"),
    ("SQL", "SELECT name FROM users WHERE deleted_at = NULL;"),
)
PY_TO_CONVERT = (
    "def squares(n):\n    return [i * i for i in range(n)]",
    "def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))",
    "def word_lengths(text):\n    return {w: len(w) for w in text.split()}",
    "def fizz(n):\n    out = []\n    for i in range(1, n + 1):\n        out.append('Fizz' if i % 3 == 0 else str(i))"
    "\n    return out",
    "def chunks(xs, k):\n    return [xs[i:i + k] for i in range(0, len(xs), k)]",
    "def initials(name):\n    return ''.join(p[0].upper() for p in name.split())",
)

# ---------------------------------------------------------------- short and long answers
TERMS = (
    "latency", "a mortgage", "photosynthesis", "an index fund", "a sonnet", "entropy", "a firewall", "a noun phrase",
    "osmosis", "a watershed", "supply and demand", "a prime number", "a metaphor", "a virus", "a spreadsheet",
    "an algorithm", "a tariff", "a glacier", "a hypothesis", "a compiler", "a placebo", "a recession",
    "biodiversity", "a vector", "a cache", "an alloy", "a protein", "erosion", "a constitution", "a fraction",
    "bandwidth", "a dividend", "a haiku", "an enzyme", "a peninsula", "a quorum", "a mutex", "a logarithm",
    "an invoice", "a monopoly", "a semicolon", "an ecosystem", "a catalyst", "a pixel", "a treaty", "a sonar",
    "a hashtag", "a pension", "a delta", "a fjord", "an allergy", "a thermostat", "an archipelago", "a refund",
    "a syllable", "an orbit", "a footnote", "a spreadsheet formula", "a pivot table", "a checksum",
)
FACT_FORMS = (
    "What is the capital of {c}?", "Which continent is {c} in?", "What language is mainly spoken in {c}?",
    "What currency does {c} use?",
)
COUNTRIES = ("Portugal", "Kenya", "Canada", "Vietnam", "Peru", "Norway", "Egypt", "New Zealand", "Poland",
             "Chile", "Morocco", "Thailand", "Ireland", "Argentina", "Finland", "Ghana", "Austria", "Mexico",
             "Greece", "Japan", "Colombia", "Hungary", "Nepal", "Senegal", "Iceland")
UNITS = (("centimetres", "a metre"), ("seconds", "an hour"), ("grams", "a kilogram"), ("millilitres", "a litre"),
         ("minutes", "a day"), ("days", "a leap year"), ("ounces", "a pound"), ("inches", "a foot"),
         ("metres", "a kilometre"), ("hours", "a week"), ("bits", "a byte"), ("feet", "a mile"))
OPPOSITES = ("generous", "ancient", "fragile", "expand", "reluctant", "scarce", "visible", "optimistic", "rigid",
             "accept", "import", "brave", "shallow", "temporary", "simple", "victory", "include", "noisy")
BREVITY = ("", " Just the answer.", " One line, please.", " Be brief.", " Answer in a few words.")
YES_NO = (
    "Can penguins fly", "Is glass a liquid", "Do plants need oxygen", "Is zero an even number",
    "Can you see the Great Wall of China from the Moon with the naked eye", "Is a tomato a fruit",
    "Does hot water freeze faster than cold water", "Is Python a compiled language", "Can lightning strike twice",
    "Is a whale a fish", "Do humans use only ten percent of their brains", "Is the Sun a star",
    "Can a square be a rectangle", "Is sound faster in water than in air", "Do bats see in the dark",
    "Is one a prime number", "Can an HTTP GET request have a body", "Is chess a solved game",
)
SHORT = (
    "In one sentence, what is {t}?", "Define {t} in a single line.", "What is {t}? Answer in under twenty words.",
    "Give me a one-line definition of {t}.", "Briefly: what does {t} mean?",
)
YES_NO_FORMS = ("{q}? Answer yes or no, then give one reason.", "{q}? One word, then one sentence why.",
                "Yes or no: {q}? Keep it short.", "Quick check: {q}? Yes/no and a short reason.",
                "{q}? Reply in one sentence.")
LONG_TOPICS = (
    "why cities should plant more trees", "the history of the bicycle", "how to start a vegetable garden",
    "what makes a good teacher", "the pros and cons of working from home", "how batteries store energy",
    "learning a second language as an adult", "the role of bees in agriculture", "how the internet routes data",
    "preparing for a first marathon", "how to choose a used car", "why sleep matters for teenagers",
    "the future of public transport", "how to run a productive meeting", "the science of baking bread",
    "saving money on a small income", "how to write a clear bug report", "the life cycle of a star",
    "how volcanoes form", "the invention of the printing press", "caring for an older dog",
    "how to plan a week of healthy meals", "the ethics of zoos", "why some languages die out",
    "how a bill of materials is used in manufacturing", "the history of coffee houses", "how to learn to code",
    "the causes of traffic jams", "how to prepare for a job interview", "what happens inside a data centre",
    "the benefits of reading fiction", "how tides shape coastlines", "the basics of personal investing",
    "how to organise a small conference", "the role of fungi in forests", "how to teach a child to ride a bike",
    "the story of the first transatlantic telegraph cable", "how recycling is sorted", "keeping a home office tidy",
    "why bridges are built the way they are",
)
AUDIENCES = ("", " The readers are high-school students.", " Write it for a company blog.",
             " Assume the reader is a complete beginner.", " Use a friendly, conversational tone.")
LONG_FORMS = (
    "Write a {w}-word essay on {t}.", "Write a detailed guide on {t}, with at least {k} sections and headings.",
    "Write a long, thorough explanation of {t}. Aim for about {w} words.",
    "Write an article of roughly {w} words about {t} for a general audience.",
    "Give me an in-depth answer, around {w} words, on {t}. Use examples.",
    "Write a story of about {w} words in which a character learns about {t}.",
    "I need a comprehensive piece (about {w} words) on {t}. Include an introduction and a conclusion.",
    "Write {k} detailed paragraphs about {t}.",
)

# ---------------------------------------------------------------- writing
PURPOSES = (
    "asking for a deadline extension", "thanking a mentor", "complaining about a late delivery",
    "declining a job offer", "inviting neighbours to a street party", "requesting a refund",
    "asking a professor for a recommendation letter", "apologising for missing a meeting",
    "introducing yourself to a new team", "reminding a client about an unpaid invoice",
    "asking the council to repair a street light", "resigning from a volunteer role",
    "congratulating a colleague on a promotion", "asking a landlord to allow a pet",
    "following up after a job interview", "proposing a new weekly team meeting time",
    "asking a supplier for a better price", "welcoming a new member to a hobby club",
    "telling customers about a price increase", "asking a neighbour to trim an overhanging tree",
)
TONES = ("polite", "warm", "firm but friendly", "formal", "casual", "concise")
REVIEW_OF = ("a pair of running shoes", "a small Italian restaurant", "a budget hotel near the airport",
             "a noise-cancelling headset", "a cookbook for beginners", "a city walking tour", "a phone case",
             "an electric kettle", "a yoga class", "a board game for families", "a second-hand bookshop",
             "a car rental company", "a language learning app", "a camping tent", "a dentist's office",
             "a robot vacuum cleaner", "a pottery workshop", "a streaming service", "a bakery's croissants",
             "an online furniture store")
STARS = ("one", "two", "three", "four", "five")
CREATIVE = ("a poem", "a very short story", "a fable", "a song verse", "a diary entry", "a scene of dialogue")
CREATIVE_SUBJECTS = ("a lighthouse that stopped working", "the last bus of the night", "a lost mitten",
                     "a robot gardener", "an empty swimming pool", "a letter that arrived fifty years late",
                     "a town where it never stops snowing", "a violin in a pawn shop", "the first day of spring",
                     "two strangers sharing an umbrella", "a map with one town missing", "a night shift at a bakery",
                     "the oldest tree in the park", "a goalkeeper's last match", "a paper boat in a gutter",
                     "a dog waiting at a bus stop", "a house that remembers its owners", "a chess piece that runs away")
CONSTRAINTS = ("in exactly {k} lines", "without using the letter 'e'", "where every sentence starts with the "
               "same letter", "in the second person", "ending with a surprise", "using no more than {w} words",
               "that rhymes", "told from the point of view of an object", "with a hopeful ending",
               "that includes the words 'copper', 'whistle' and 'maple'")

# ---------------------------------------------------------------- JSON
NAMES = ("Ana Silva", "Tom Becker", "Priya Nair", "Lukas Novak", "Mei Chen", "Omar Haddad", "Sara Lind",
         "Jonas Weber", "Grace Okafor", "Diego Ruiz")
PRODUCTS = ("wireless mouse", "standing desk", "coffee grinder", "winter jacket", "phone charger",
            "gym membership", "train ticket", "laptop stand", "water filter", "yoga mat")
ISSUES = ("It arrived broken.", "I was charged twice for it.", "It stopped working after a week.",
          "It never arrived.", "I cannot log in to my account to check on it.",
          "I would like to change the delivery address.", "Could you send me a copy of the invoice?",
          "I am very happy with it, thank you!", "The colour is different from the photo.",
          "The tracking page has not changed for ten days.")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def _passage_row(rng: random.Random) -> list[dict]:
    task = rng.choice(PASSAGE_TASKS).format(n=rng.choice((2, 3, 4)), lang=rng.choice(LANGS),
                                            age=rng.choice((8, 10, 12)))
    return [{"role": "user", "content": rng.choice(FRAMES).format(task=task, p=rng.choice(passages()))}]


def _multiturn_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(4)
    if kind == 0:
        i = rng.randrange(len(QA))
        first, reply = QA[i]
        follow = rng.choice(FOLLOW_UPS).format(lang=rng.choice(LANGS), other=OTHERS[i])
    elif kind == 1:
        p = rng.choice(passages())
        first = rng.choice(("Can you summarize this?\n\n", "What is this text about?\n\n", "Summarize:\n\n")) + p
        reply = p.split(". ")[0].rstrip(".") + "."  # a plausible first summary: the lead sentence
        follow = rng.choice(("Now give me the key points as bullets.", "Can you explain the main idea more simply?",
                             "Translate the original text into {lang}.", "What questions does the text leave open?",
                             "Make your summary longer and more complete.", "Give an example that illustrates it.")
                            ).format(lang=rng.choice(LANGS))
    elif kind == 2:
        first, reply = rng.choice(CODE_TURNS)
        follow = rng.choice(CODE_FOLLOW_UPS)
    else:
        text, answer = _math_problem(rng)
        first, reply = text, f"The answer is {answer}."
        follow = rng.choice(("Can you show your work step by step?", "How did you get that?",
                             "What if all the numbers were doubled?", "Explain it as if I were twelve.",
                             "Can you check that answer another way?"))
    return [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
            {"role": "user", "content": follow}]


def _math_problem(rng: random.Random) -> tuple[str, str]:
    """(problem text, answer) with random numbers: rates, percentages, ages, units, algebra, averages."""
    who = rng.choice(NAMES).split()[0]
    a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(5, 90)
    kind = rng.randrange(8)
    if kind == 0:
        return (f"{who} drives {a * b} km in {b} hours. At the same speed, how far does {who} go in {b + 3} hours?",
                f"{a * (b + 3)} km")
    if kind == 1:
        return (f"A jacket costs {a * 5} euros. It is reduced by {c}% and then a further 10%. What is the final "
                f"price?", f"{a * 5 * (100 - c) / 100 * 0.9:.2f} euros")
    if kind == 2:
        return (f"{who} is {b} years older than a sister. In {c % 10 + 1} years their ages will add up to "
                f"{2 * a + b + 2 * (c % 10 + 1)}. How old is {who} now?", f"{a + b}")
    if kind == 3:
        return (f"Convert {a * 3} miles per hour into metres per second.", f"{a * 3 * 1609.344 / 3600:.2f} m/s")
    if kind == 4:
        x = rng.randint(-9, 15)
        return f"Solve for x: {b}x + {c} = {b * x + c}.", f"x = {x}"
    if kind == 5:
        return (f"One pump fills a tank in {b} hours and another in {b + a % 7 + 1} hours. How long do they take "
                f"together?", f"{b * (b + a % 7 + 1) / (2 * b + a % 7 + 1):.2f} hours")
    if kind == 6:
        xs = [rng.randint(40, 100) for _ in range(4)]
        return (f"{who} scored {', '.join(map(str, xs))} on four tests. What score on the fifth test gives an "
                f"average of {c % 30 + 70}?", f"{5 * (c % 30 + 70) - sum(xs)}")
    return (f"A savings account pays {b / 2:.1f}% interest per year, compounded yearly. How much is "
            f"{a * 100} dollars worth after {c % 6 + 2} years?",
            f"{a * 100 * (1 + b / 200) ** (c % 6 + 2):.2f} dollars")


STEPS = ("Think step by step.", "Show your work.", "Explain each step.", "Let's work through it step by step.",
         "Please reason step by step and give the final answer at the end.", "Show the calculation.", "")


def _math_row(rng: random.Random) -> list[dict]:
    text, _ = _math_problem(rng)
    step = rng.choice(STEPS)
    return [{"role": "user", "content": f"{text} {step}".strip() if rng.random() < 0.7 else f"{step} {text}".strip()}]


def _roleplay_row(rng: random.Random) -> list[dict]:
    persona, sit, say = rng.choice(PERSONAS), rng.choice(SITUATIONS), rng.choice(SAYS)
    if rng.random() < 0.3:
        return [{"role": "system", "content": f"You are {persona}. Stay in character."},
                {"role": "user", "content": f"({sit}) {say}"}]
    return [{"role": "user", "content": rng.choice((
        "Let's role-play. You are {p}. {s} I say: \"{u}\"", "Pretend you are {p}. {s}\n\nMe: {u}",
        "Act as {p} and answer in character. {s} My first line: {u}"))
        .format(p=persona, s=sit, u=say)}]


def _code_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(6)
    if kind == 0:
        lang = rng.choice(LANGUAGES)
        text = rng.choice(("Write a {l} function that {t}.", "In {l}, how would I write a function that {t}?",
                           "Show me {l} code for a function that {t}, with a short explanation.",
                           "Implement a function that {t} in {l}. Include an example call.")).format(
            l=lang, t=rng.choice(PROG_TASKS)) + rng.choice(CODE_EXTRAS)
    elif kind == 1:
        text = rng.choice(("Write a SQL query that returns {t}.", "I need SQL for {t}.",
                           "How do I get {t} in SQL?")).format(t=rng.choice(SQL_TASKS)) + rng.choice(SQL_DIALECTS)
    elif kind == 2:
        text = rng.choice(("Write a bash script that {t}.", "Give me a shell command that {t}.",
                           "How can I write a small bash script that {t}?")).format(t=rng.choice(BASH_TASKS)
                                                                                   ) + rng.choice(CODE_EXTRAS)
    elif kind == 3:
        lang, code = rng.choice(SNIPPETS)
        text = rng.choice(("Explain what this {l} code does:\n\n```\n{c}\n```", "What does this snippet do, and "
                           "when would I use it?\n\n{c}", "Walk me through this {l} code line by line:\n\n{c}")
                          ).format(l=lang, c=code)
    elif kind == 4:
        lang, code = rng.choice(BUGGY)
        text = rng.choice(("Find the bug in this {l} code and fix it:\n\n```\n{c}\n```", "This {l} code has a "
                           "bug. What is it?\n\n{c}", "Why is this wrong?\n\n{c}")).format(l=lang, c=code)
    else:
        target = rng.choice(("JavaScript", "TypeScript", "Go", "Rust", "Java", "C++"))
        text = rng.choice(("Convert this Python to {l}:\n\n```python\n{c}\n```", "Rewrite this Python function "
                           "in {l}:\n\n{c}")).format(l=target, c=rng.choice(PY_TO_CONVERT))
    return [{"role": "user", "content": text}]


def _short_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(4)
    if kind == 0:
        text = rng.choice(YES_NO_FORMS).format(q=rng.choice(YES_NO))
    elif kind == 1:
        text = rng.choice(SHORT).format(t=rng.choice(TERMS))
    elif kind == 2:
        text = rng.choice(FACT_FORMS).format(c=rng.choice(COUNTRIES))
    else:
        small, big = rng.choice(UNITS)
        text = rng.choice((f"How many {small} are in {big}?", f"What is the opposite of '{rng.choice(OPPOSITES)}'?",
                           f"Give one synonym for '{rng.choice(OPPOSITES)}'."))
    return [{"role": "user", "content": text + (rng.choice(BREVITY) if kind > 0 else "")}]


def _long_row(rng: random.Random) -> list[dict]:
    text = rng.choice(LONG_FORMS).format(w=rng.choice((300, 400, 500, 600, 800, 1000)), k=rng.choice((4, 5, 6)),
                                         t=rng.choice(LONG_TOPICS))
    return [{"role": "user", "content": text + rng.choice(AUDIENCES)}]


def _writing_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(3)
    if kind == 0:
        text = rng.choice(("Write a {tone} email {p}.", "Draft a {tone} letter {p}.",
                           "Help me write a {tone} message {p}. Keep it under {w} words.")).format(
            tone=rng.choice(TONES), p=rng.choice(PURPOSES), w=rng.choice((80, 120, 150)))
        text += rng.choice(("", "", f" Sign it {rng.choice(NAMES).split()[0]}.", " Add a subject line."))
    elif kind == 1:
        text = rng.choice(("Write a {s}-star review of {r}.", "Write a customer review of {r} that gives it {s} "
                           "stars and mentions one good and one bad thing.")).format(
            s=rng.choice(STARS), r=rng.choice(REVIEW_OF))
    else:
        text = "Write {f} about {s}, {c}.".format(f=rng.choice(CREATIVE), s=rng.choice(CREATIVE_SUBJECTS),
                                                  c=rng.choice(CONSTRAINTS).format(k=rng.choice((4, 6, 8)),
                                                                                   w=rng.choice((50, 80, 100))))
    return [{"role": "user", "content": text}]


def _json_row(rng: random.Random) -> list[dict]:
    name, product = rng.choice(NAMES), rng.choice(PRODUCTS)
    issue, order = rng.choice(ISSUES), rng.randint(10000, 99999)
    date = f"{rng.randint(1, 28)} {rng.choice(MONTHS)}"
    message = rng.choice((f"Hi, this is {name}. I ordered a {product} on {date} (order {order}). {issue}",
                          f"Order #{order}, {product}, bought {date}. {issue} Regards, {name}",
                          f"Hello! {issue} It's the {product} from order {order} on {date}. - {name}"))
    text = rng.choice((
        'Classify this customer message as "shipping", "billing", "technical" or "feedback". Reply only with '
        'JSON like {{"label": ..., "reason": ...}}.\n\n{m}',
        'Extract the customer name, product, order number and date from this message as a JSON object.\n\n{m}',
        "Read the message below and return JSON with the fields name, order_id, product, problem and urgency "
        "(low, medium or high).\n\n{m}",
        'Return a JSON object {{"sentiment": "positive" | "neutral" | "negative", "topics": [...]}} for this '
        "message:\n\n{m}")).format(m=message)
    return [{"role": "user", "content": text}]


_BUILDERS = {"passage": _passage_row, "multiturn": _multiturn_row, "math": _math_row, "roleplay": _roleplay_row,
             "code": _code_row, "short": _short_row, "long": _long_row, "writing": _writing_row, "json": _json_row}


def wide_prompts(n: int, seed: int = 0) -> list[dict]:
    """n distinct chat rows {"id", "kind", "messages"}, families in turn; the same list for the same seed
    on the same machine (passages depend on the documentation installed)."""
    rng = random.Random(seed * 7919 + 17)
    seen, rows = set(), []
    exhausted: set[str] = set()
    i = 0
    while len(rows) < n:
        live = [f for f in FAMILIES if f not in exhausted]
        if not live:
            raise ValueError(f"wide_prompts: only {len(rows)} distinct prompts for n={n}. Hint: ask for fewer.")
        fam = live[i % len(live)]
        i += 1
        for _ in range(200):  # a family whose space is used up is skipped from then on
            msgs = _BUILDERS[fam](rng)
            key = json.dumps(msgs)
            if key not in seen:
                seen.add(key)
                rows.append({"id": f"wide-{fam}-{len(rows)}", "kind": fam, "messages": msgs})
                break
        else:
            exhausted.add(fam)
    return rows
