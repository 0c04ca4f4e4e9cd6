"""The wide prompt mix for drafter self-distillation: text the target copies, translates or reshapes.

Drafters trained only on short questions guess badly once the answer leans on text nobody here
wrote (a pasted passage, an earlier turn, a code snippet). `wide_prompts` adds those shapes, in
nine families mixed evenly (a row's `kind` names its family):
  passage    summarize / extract / answer about / translate / rewrite a given passage; passages
             are prose paragraphs from this machine's own documentation (stdlib docstrings,
             /usr/share/doc READMEs and copyright files) plus a few written here (doc_passages.py)
  multiturn  user turn, a short assistant turn written here, then a follow-up request
  math       word problems with random numbers, asked step by step
  roleplay   persona + situation + what the user says
  code       small tasks in ten languages, explain a snippet, find the bug, convert Python
  short      one-line facts, yes/no with a reason, definitions
  long       essays, guides and stories with an explicit length
  writing    emails and letters, reviews, creative writing under a constraint
  json       classification and extraction answered in JSON
Every template and slot list was written for this project and lives in prompt_data/wide_<family>.json
(the math problems, whose answers are computed, stay here); nothing is read from a benchmark.
"""

from __future__ import annotations

import json
import random

from edgespec.export.train.doc_passages import passages
from edgespec.export.train.prompt_lists import load_lists

FAMILIES = ("passage", "multiturn", "math", "roleplay", "code", "short", "long", "writing", "json")

PASSAGE_TASKS, LANGS, FRAMES = load_lists("wide_passage", "passage_tasks", "langs", "frames")
(QA, FOLLOW_UPS, OTHERS, CODE_TURNS, CODE_FOLLOW_UPS, SUMMARY_ASKS, SUMMARY_FOLLOW_UPS, MATH_FOLLOW_UPS) = load_lists(
    "wide_multiturn",
    "qa",
    "follow_ups",
    "others",
    "code_turns",
    "code_follow_ups",
    "summary_asks",
    "summary_follow_ups",
    "math_follow_ups",
)
(STEPS,) = load_lists("wide_math", "steps")
PERSONAS, SITUATIONS, SAYS, USER_FRAMES = load_lists("wide_roleplay", "personas", "situations", "says", "user_frames")
(
    LANGUAGES,
    PROG_TASKS,
    FUNCTION_FORMS,
    CODE_EXTRAS,
    SQL_TASKS,
    SQL_FORMS,
    SQL_DIALECTS,
    BASH_TASKS,
    BASH_FORMS,
    SNIPPETS,
    EXPLAIN_FORMS,
    BUGGY,
    BUG_FORMS,
    PY_TO_CONVERT,
    CONVERT_TARGETS,
    CONVERT_FORMS,
) = load_lists(
    "wide_code",
    "languages",
    "prog_tasks",
    "function_forms",
    "code_extras",
    "sql_tasks",
    "sql_forms",
    "sql_dialects",
    "bash_tasks",
    "bash_forms",
    "snippets",
    "explain_forms",
    "buggy",
    "bug_forms",
    "py_to_convert",
    "convert_targets",
    "convert_forms",
)
YES_NO, YES_NO_FORMS, TERMS, SHORT, COUNTRIES, FACT_FORMS, UNITS, OPPOSITES, UNIT_FORMS, BREVITY = load_lists(
    "wide_short",
    "yes_no",
    "yes_no_forms",
    "terms",
    "short",
    "countries",
    "fact_forms",
    "units",
    "opposites",
    "unit_forms",
    "brevity",
)
LONG_TOPICS, LONG_FORMS, AUDIENCES = load_lists("wide_long", "long_topics", "long_forms", "audiences")
(
    PURPOSES,
    TONES,
    LETTER_FORMS,
    LETTER_ENDINGS,
    REVIEW_OF,
    STARS,
    REVIEW_FORMS,
    CREATIVE,
    CREATIVE_SUBJECTS,
    CONSTRAINTS,
) = load_lists(
    "wide_writing",
    "purposes",
    "tones",
    "letter_forms",
    "letter_endings",
    "review_of",
    "stars",
    "review_forms",
    "creative",
    "creative_subjects",
    "constraints",
)
NAMES, PRODUCTS, ISSUES, MONTHS, MESSAGE_FORMS, TASK_FORMS = load_lists(
    "wide_json", "names", "products", "issues", "months", "message_forms", "task_forms"
)


def _passage_row(rng: random.Random) -> list[dict]:
    task = rng.choice(PASSAGE_TASKS).format(
        n=rng.choice((2, 3, 4)), lang=rng.choice(LANGS), age=rng.choice((8, 10, 12))
    )
    return [{"role": "user", "content": rng.choice(FRAMES).format(task=task, p=rng.choice(passages()))}]


def _multiturn_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(4)
    if kind == 0:
        i = rng.randrange(len(QA))
        first, reply = QA[i]
        follow = rng.choice(FOLLOW_UPS).format(lang=rng.choice(LANGS), other=OTHERS[i])
    elif kind == 1:
        p = rng.choice(passages())
        first = rng.choice(SUMMARY_ASKS) + p
        reply = p.split(". ")[0].rstrip(".") + "."  # a plausible first summary: the lead sentence
        follow = rng.choice(SUMMARY_FOLLOW_UPS).format(lang=rng.choice(LANGS))
    elif kind == 2:
        first, reply = rng.choice(CODE_TURNS)
        follow = rng.choice(CODE_FOLLOW_UPS)
    else:
        text, answer = _math_problem(rng)
        first, reply = text, f"The answer is {answer}."
        follow = rng.choice(MATH_FOLLOW_UPS)
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": follow},
    ]


def _math_problem(rng: random.Random) -> tuple[str, str]:
    """(problem text, answer) with random numbers: rates, percentages, ages, units, algebra, averages."""
    who = rng.choice(NAMES).split()[0]
    a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(5, 90)
    kind = rng.randrange(8)
    if kind == 0:
        return (
            f"{who} drives {a * b} km in {b} hours. At the same speed, how far does {who} go in {b + 3} hours?",
            f"{a * (b + 3)} km",
        )
    if kind == 1:
        return (
            f"A jacket costs {a * 5} euros. It is reduced by {c}% and then a further 10%. What is the final price?",
            f"{a * 5 * (100 - c) / 100 * 0.9:.2f} euros",
        )
    if kind == 2:
        return (
            f"{who} is {b} years older than a sister. In {c % 10 + 1} years their ages will add up to "
            f"{2 * a + b + 2 * (c % 10 + 1)}. How old is {who} now?",
            f"{a + b}",
        )
    if kind == 3:
        return (f"Convert {a * 3} miles per hour into metres per second.", f"{a * 3 * 1609.344 / 3600:.2f} m/s")
    if kind == 4:
        x = rng.randint(-9, 15)
        return f"Solve for x: {b}x + {c} = {b * x + c}.", f"x = {x}"
    if kind == 5:
        return (
            f"One pump fills a tank in {b} hours and another in {b + a % 7 + 1} hours. How long do they take together?",
            f"{b * (b + a % 7 + 1) / (2 * b + a % 7 + 1):.2f} hours",
        )
    if kind == 6:
        xs = [rng.randint(40, 100) for _ in range(4)]
        return (
            f"{who} scored {', '.join(map(str, xs))} on four tests. What score on the fifth test gives an "
            f"average of {c % 30 + 70}?",
            f"{5 * (c % 30 + 70) - sum(xs)}",
        )
    return (
        f"A savings account pays {b / 2:.1f}% interest per year, compounded yearly. How much is "
        f"{a * 100} dollars worth after {c % 6 + 2} years?",
        f"{a * 100 * (1 + b / 200) ** (c % 6 + 2):.2f} dollars",
    )


def _math_row(rng: random.Random) -> list[dict]:
    text, _ = _math_problem(rng)
    step = rng.choice(STEPS)
    return [{"role": "user", "content": f"{text} {step}".strip() if rng.random() < 0.7 else f"{step} {text}".strip()}]


def _roleplay_row(rng: random.Random) -> list[dict]:
    persona, sit, say = rng.choice(PERSONAS), rng.choice(SITUATIONS), rng.choice(SAYS)
    if rng.random() < 0.3:
        return [
            {"role": "system", "content": f"You are {persona}. Stay in character."},
            {"role": "user", "content": f"({sit}) {say}"},
        ]
    return [{"role": "user", "content": rng.choice(USER_FRAMES).format(p=persona, s=sit, u=say)}]


def _code_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(6)
    if kind == 0:
        lang = rng.choice(LANGUAGES)
        text = rng.choice(FUNCTION_FORMS).format(l=lang, t=rng.choice(PROG_TASKS)) + rng.choice(CODE_EXTRAS)
    elif kind == 1:
        text = rng.choice(SQL_FORMS).format(t=rng.choice(SQL_TASKS)) + rng.choice(SQL_DIALECTS)
    elif kind == 2:
        text = rng.choice(BASH_FORMS).format(t=rng.choice(BASH_TASKS)) + rng.choice(CODE_EXTRAS)
    elif kind == 3:
        lang, code = rng.choice(SNIPPETS)
        text = rng.choice(EXPLAIN_FORMS).format(l=lang, c=code)
    elif kind == 4:
        lang, code = rng.choice(BUGGY)
        text = rng.choice(BUG_FORMS).format(l=lang, c=code)
    else:
        target = rng.choice(CONVERT_TARGETS)
        text = rng.choice(CONVERT_FORMS).format(l=target, c=rng.choice(PY_TO_CONVERT))
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
        a, b = rng.choice(OPPOSITES), rng.choice(OPPOSITES)  # both drawn whichever form is picked: a seed's rows
        text = rng.choice(UNIT_FORMS).format(small=small, big=big, a=a, b=b)
    return [{"role": "user", "content": text + (rng.choice(BREVITY) if kind > 0 else "")}]


def _long_row(rng: random.Random) -> list[dict]:
    text = rng.choice(LONG_FORMS).format(
        w=rng.choice((300, 400, 500, 600, 800, 1000)), k=rng.choice((4, 5, 6)), t=rng.choice(LONG_TOPICS)
    )
    return [{"role": "user", "content": text + rng.choice(AUDIENCES)}]


def _writing_row(rng: random.Random) -> list[dict]:
    kind = rng.randrange(3)
    if kind == 0:
        text = rng.choice(LETTER_FORMS).format(
            tone=rng.choice(TONES), p=rng.choice(PURPOSES), w=rng.choice((80, 120, 150))
        )
        name = rng.choice(NAMES).split()[0]  # drawn whichever ending is picked: a seed's rows
        text += rng.choice(LETTER_ENDINGS).format(name=name)
    elif kind == 1:
        text = rng.choice(REVIEW_FORMS).format(s=rng.choice(STARS), r=rng.choice(REVIEW_OF))
    else:
        what, subject = rng.choice(CREATIVE), rng.choice(CREATIVE_SUBJECTS)
        rule = rng.choice(CONSTRAINTS).format(k=rng.choice((4, 6, 8)), w=rng.choice((50, 80, 100)))
        text = f"Write {what} about {subject}, {rule}."
    return [{"role": "user", "content": text}]


def _json_row(rng: random.Random) -> list[dict]:
    name, product = rng.choice(NAMES), rng.choice(PRODUCTS)
    issue, order = rng.choice(ISSUES), rng.randint(10000, 99999)
    date = f"{rng.randint(1, 28)} {rng.choice(MONTHS)}"
    message = rng.choice(MESSAGE_FORMS).format(name=name, product=product, date=date, order=order, issue=issue)
    return [{"role": "user", "content": rng.choice(TASK_FORMS).format(m=message)}]


_BUILDERS = {
    "passage": _passage_row,
    "multiturn": _multiturn_row,
    "math": _math_row,
    "roleplay": _roleplay_row,
    "code": _code_row,
    "short": _short_row,
    "long": _long_row,
    "writing": _writing_row,
    "json": _json_row,
}


def check_families(families: tuple[str, ...]) -> None:
    """ValueError naming the families the mix does not have, with the ones it has."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"no family {', '.join(unknown)} in the wide mix. Hint: pick from {','.join(FAMILIES)}")


def wide_prompts(n: int, seed: int = 0, families: tuple[str, ...] = ()) -> list[dict]:
    """n distinct chat rows {"id", "kind", "messages"}, families in turn (`families`: only those; empty:
    all of FAMILIES); the same list for the same seed and families on the same machine (passages depend
    on the documentation installed)."""
    check_families(families)
    rng = random.Random(seed * 7919 + 17)
    seen, rows = set(), []
    exhausted: set[str] = set()
    i = 0
    while len(rows) < n:
        live = [f for f in families or FAMILIES if f not in exhausted]
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
