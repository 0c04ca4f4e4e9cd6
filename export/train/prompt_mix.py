"""Training prompts for drafters (every train-<name>): written here, never taken from a benchmark.

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
                   decisions, role play), each kind with its own slot lists
  self-instruct    chat messages the target itself wrote when asked for a user's question about a
                   topic (`eagle_data.self_instruct`): phrasing no template of ours has
The templates and slot lists were written for this project and live in prompt_data/eagle_*.json
(the arithmetic problems, whose numbers are computed, stay here). No HumanEval, MBPP, MT-Bench or
other evaluation set is read; tests check that no HumanEval prompt text appears in the set.
"""

from __future__ import annotations

import importlib
import inspect
import random
import textwrap

from edgespec.export.train.prompt_lists import load_lists

STDLIB_MODULES, CODE_TASKS, CODE, STDLIB_FORMS = load_lists(
    "eagle_code", "stdlib_modules", "code_tasks", "code", "stdlib_forms"
)
TOPICS, GENERAL = load_lists("eagle_general", "topics", "general")
EVERYDAY_SITUATIONS, EVERYDAY, ASKS = load_lists("eagle_everyday", "everyday_situations", "everyday", "asks")
(
    HOWTO,
    HOWTO_FORMS,
    WHY,
    WHY_FORMS,
    DIFFERENCES,
    DIFFERENCE_FORMS,
    FORMS,
    SUBJECTS,
    BRAINSTORM,
    BRAINSTORM_FORMS,
    SENTENCES,
    REWRITE_FORMS,
    REVIEWS,
    SENTIMENT_FORMS,
    THINGS,
    WHO,
    RECOMMEND_FORMS,
    GOALS,
    PLAN_FORMS,
    PLAN_SPANS,
    WORDS,
    WORD_FORMS,
    CHOICES,
    CHOICE_FORMS,
    ROLES,
    ROLE_ASKS,
    ANIMALS,
    ANIMAL_FORMS,
    SUMMARY_FORMS,
) = load_lists(
    "eagle_tasks",
    "howto",
    "howto_forms",
    "why",
    "why_forms",
    "differences",
    "difference_forms",
    "forms",
    "subjects",
    "brainstorm",
    "brainstorm_forms",
    "sentences",
    "rewrite_forms",
    "reviews",
    "sentiment_forms",
    "things",
    "who",
    "recommend_forms",
    "goals",
    "plan_forms",
    "plan_spans",
    "words",
    "word_forms",
    "choices",
    "choice_forms",
    "roles",
    "role_asks",
    "animals",
    "animal_forms",
    "summary_forms",
)

PROSE = tuple(x for x in SENTENCES if x[0].isupper())  # the well-formed ones, for summaries


def _task(rng: random.Random, kind: int) -> str:
    """One prompt of the taxonomy's kind `kind` (0..14)."""
    n = rng.choice((3, 4, 5, 7, 10))
    if kind == 0:
        return rng.choice(HOWTO_FORMS).format(h=rng.choice(HOWTO))
    if kind == 1:
        return rng.choice(WHY_FORMS).format(w=rng.choice(WHY))
    if kind == 2:
        a, b = rng.choice(DIFFERENCES)
        return rng.choice(DIFFERENCE_FORMS).format(a=a, b=b, A=a[0].upper() + a[1:])
    if kind == 3:
        return f"Write {rng.choice(FORMS)} about {rng.choice(SUBJECTS)}."
    if kind == 4:
        return rng.choice(BRAINSTORM_FORMS).format(n=n, x=rng.choice(BRAINSTORM))
    if kind == 5:
        return rng.choice(REWRITE_FORMS).format(s=rng.choice(SENTENCES))
    if kind == 6:
        return rng.choice(SENTIMENT_FORMS).format(r=rng.choice(REVIEWS))
    if kind == 7:
        a, b, c = rng.randint(2, 90), rng.randint(2, 12), rng.randint(5, 95)
        return rng.choice(
            (
                f"If a train travels {a * b} km in {b} hours, what is its average speed?",
                f"I have {a + c} apples and give away {c}. How many are left?",
                f"What is {c}% of {a * 10}? Show your working.",
                f"A rectangle is {b} m wide and {a} m long. What are its area and perimeter?",
                f"Convert {a} miles to kilometres.",
                f"A shirt costs {a} dollars and is {c}% off. What is the new price?",
            )
        )
    if kind == 8:
        return rng.choice(RECOMMEND_FORMS).format(n=n, t=rng.choice(THINGS), w=rng.choice(WHO))
    if kind == 9:
        return rng.choice(PLAN_FORMS).format(d=rng.choice(PLAN_SPANS), g=rng.choice(GOALS))
    if kind == 10:
        return rng.choice(WORD_FORMS).format(w=rng.choice(WORDS))
    if kind == 11:
        a, b = rng.choice(CHOICES)
        return rng.choice(CHOICE_FORMS).format(a=a, b=b)
    if kind == 12:
        role = rng.choice(ROLES)
        who, topic = rng.choice(WHO), rng.choice(TOPICS)  # drawn whichever ask is picked: a seed's rows
        return f"You are {role}. " + rng.choice(ROLE_ASKS).format(who=who, topic=topic)
    if kind == 13:
        xs = rng.sample(ANIMALS, 4)
        return rng.choice(ANIMAL_FORMS).format(first=xs[0], all=", ".join(xs))
    return rng.choice(SUMMARY_FORMS).format(s=" ".join(rng.sample(PROSE, 3)))


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


def build_prompts(
    n_general: int = 900,
    n_code_chat: int = 500,
    n_completion: int = 600,
    seed: int = 0,
    n_everyday: int = 0,
    n_tasks: int = 0,
) -> list[dict]:
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
        rows.append(
            {"id": f"chat-{i}", "messages": [{"role": "user", "content": rng.choice(GENERAL).format(t=t, u=u)}]}
        )
    funcs = _stdlib_functions(rng, n_completion + n_code_chat)
    for i in range(n_code_chat):
        if i % 2 and funcs:
            mod, sig, doc = funcs[(n_completion + i) % len(funcs)]
            first = doc.split("\n")[0].rstrip(".")
            text = rng.choice(STDLIB_FORMS).format(
                task=first[0].lower() + first[1:], call=sig[4:-1], mod=mod, name=sig[4 : sig.index("(")]
            )
        else:
            text = rng.choice(CODE).format(c=rng.choice(CODE_TASKS))
        rows.append({"id": f"code-chat-{i}", "messages": [{"role": "user", "content": text}]})
    for i, (mod, sig, doc) in enumerate(funcs[:n_completion]):
        body = textwrap.indent(f'"""{doc}\n"""\n', "    ")
        head = f"import {mod.split('.')[0]}\n\n\n" if i % 3 == 0 else ""
        rows.append({"id": f"complete-{i}", "prompt": f"{head}{sig}\n{body}"})
    rng.shuffle(rows)
    return rows
