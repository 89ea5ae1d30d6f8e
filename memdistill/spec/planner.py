"""TiMem recall planning: question -> complexity (simple / hybrid / complex) + 1-3 keywords.

The complexity decides how broadly the memory runtime recalls (and how much the gate keeps).
The compact planner is a 3-class encoder; its keywords come from the query parser (the extractor
adapter) or, offline, from `heuristic_keywords` below.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.jsonout import Problem, load_json, norm_keywords, norm_str

COMPLEXITIES = ("simple", "hybrid", "complex")
Complexity = Literal["simple", "hybrid", "complex"]
MAX_KEYWORDS = 3


def complexity_of(probs) -> str:
    """The planner encoder's decision from its softmax (id2label order): the most probable complexity."""
    return COMPLEXITIES[max(range(len(probs)), key=probs.__getitem__)]


class RecallPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    complexity: Complexity
    keywords: list[str] = Field(min_length=1, max_length=MAX_KEYWORDS)


def json_schema() -> dict:
    return RecallPlan.model_json_schema()


TEACHER_SYSTEM = """\
You plan how a memory system should search before answering a question about past conversations.
Classify the question's complexity and pick its keywords. Answer with JSON only:
{"complexity": "simple|hybrid|complex", "keywords": ["...", "..."]}

Complexity:
- simple: one explicitly recorded fact answers it: who, when, where, which, what exactly happened
  ("Where does she work?", "When did he fly to Oslo?"). No reasoning, no preferences.
- hybrid: the answer gathers, lists, counts or compares several recorded facts, without judging
  ("What sports has she tried?", "Which cities did they visit?", "How many times did he move?").
- complex: the answer needs the person's preferences, habits, values or personality, a prediction
  or hypothetical ("Would she enjoy ...?", "Is he likely to ...?"), a judgement or recommendation, or a
  trend over a long period. Check for this first: if it applies, the question is complex even when it
  looks short.

Keywords: the 1-3 most important content words or short phrases (actions, objects, place types,
concepts). Never a person's name or username; no stopwords."""

STUDENT_SYSTEM = (
    "Classify the question: simple (one recorded fact), hybrid (gather or compare several facts), "
    "complex (preferences, traits, prediction, judgement or trends). Give 1-3 keywords, no person "
    'names. Reply with JSON only: {"complexity": "...", "keywords": [...]}'
)

_TIMEM_CODES = {0: "simple", 1: "hybrid", 2: "complex"}
_ALIASES = {
    "simple retrieval": "simple",
    "hybrid retrieval": "hybrid",
    "deep retrieval": "complex",
    "deep": "complex",
    "factual": "simple",
    "multi-fact": "hybrid",
}

_STOP = set(
    """a an the of in on at to for from by with about into over after before is are was were be been
do does did have has had what which who whom whose when where why how many much i me my mine you your we our
they their he she his her him it its this that these those and or not any ever there here can could would should
will shall may might must tell remind please again last first ever""".split()
)


def user_message(question: str) -> str:
    return f"Question: {' '.join(question.split())}"


def chat_messages(question: str, prompt: str = "student") -> list[dict]:
    system = STUDENT_SYSTEM if prompt == "student" else TEACHER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(question)}]


def render_completion(plan: RecallPlan) -> str:
    return json.dumps(plan.model_dump(), ensure_ascii=False, separators=(",", ":"))


def drop_names(keywords: list[str], names) -> list[str]:
    """Remove keywords that are (or contain) a person's name; TiMem forbids names in planner keywords."""
    low = {n.lower() for n in names or () if n}
    return [k for k in keywords if not any(w.strip("'s").lower() in low for w in k.split())]


def heuristic_keywords(question: str, names=()) -> list[str]:
    """Offline keyword fallback: the longest content words, in question order, names excluded."""
    words = [w.strip("'\".,?!:;()") for w in question.split()]
    words = [w for w in words if w and w.lower() not in _STOP and not w[:1].isdigit()]
    words = [w for w in words if not w[:1].isupper() or w.lower() not in {n.lower() for n in names}]
    ranked = sorted(set(words), key=lambda w: (-len(w), words.index(w)))[:MAX_KEYWORDS]
    return sorted(ranked, key=words.index) or ["memory"]


@dataclass
class ParseResult:
    plan: RecallPlan | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.plan is not None

    def to_json(self) -> dict:
        return {
            "records": [self.plan.model_dump()] if self.plan else [],
            "problems": [p.to_json() for p in self.problems],
        }


def parse(raw: str | None, names=()) -> ParseResult:
    res = ParseResult()
    value, problems = load_json(raw)
    res.problems.extend(problems)
    if not isinstance(value, dict):
        if value is not None:
            res.problems.append(Problem("wrong_shape", 'expected {"complexity": ..., "keywords": [...]}'))
        return res
    c = value.get("complexity")
    if isinstance(c, (int, float)) and not isinstance(c, bool) and int(c) in _TIMEM_CODES:
        c = _TIMEM_CODES[int(c)]
    else:
        c = norm_str(c).lower()
        c = _TIMEM_CODES.get(int(c), c) if c.isdigit() else _ALIASES.get(c, c)
    if c not in COMPLEXITIES:
        res.problems.append(
            Problem("bad_complexity", f"complexity {value.get('complexity')!r} is not simple, hybrid or complex")
        )
        return res
    kws, notes = norm_keywords(value.get("keywords"))
    res.problems.extend(Problem("keywords_normalised", n) for n in notes)
    if names:
        kept = drop_names(kws, names)
        if len(kept) != len(kws):
            res.problems.append(Problem("name_keyword", "keywords naming a person were dropped"))
        kws = kept
    if len(kws) > MAX_KEYWORDS:
        res.problems.append(Problem("too_many_keywords", f"{len(kws)} keywords cut to {MAX_KEYWORDS}"))
        kws = kws[:MAX_KEYWORDS]
    if not kws:
        res.problems.append(Problem("no_keywords", "no keywords given"))
        return res
    res.plan = RecallPlan(complexity=c, keywords=kws)
    return res


# --- rule baseline (written from the label definitions, not fitted to data) ----------------------------

_COMPLEX = re.compile(
    r"^(would|could|should|might|is \w+ likely|are \w+ likely|do you think)\b|\b(likely|enjoy|prefer|"
    r"suit|recommend|personality|values?|trend|over (the|time)|grown|changed|evolved|why|habits?|"
    r"easier|better|best|given what you know)\b",
    re.I,
)
_HYBRID = re.compile(
    r"\b(how many|how often|which \w+s\b|what \w+s (has|have|did)|list|all the|both|and (why|how|when|"
    r"where|what)|compare|between|each|so far|in total)\b",
    re.I,
)


def rule_complexity(question: str) -> str:
    """complex: hypotheticals or judgement words (would/could/should, likely, enjoy, prefer, recommend,
    why, changed/grown/trend ...); hybrid: gathering words (how many/often, list, both, all, compare,
    '... and why/how'); otherwise simple."""
    if _COMPLEX.search(question):
        return "complex"
    if _HYBRID.search(question):
        return "hybrid"
    return "simple"


def stem(w: str) -> str:
    """A word's first five letters, lower-cased and unpunctuated: how the rule baselines match words."""
    return w.lower().strip("'\".,?!:;()")[:5]


# --- the compact model ----------------------------------------------------------------------------


def encoder_text(question: str) -> str:
    return " ".join(question.split())


def training_rows(inp: dict, label: dict) -> list[dict]:
    c = label["complexity"]
    return [
        {
            "text": encoder_text(inp["question"]),
            "label": c,
            "label_id": COMPLEXITIES.index(c),
            "keywords": label["keywords"],
        }
    ]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0], names=inp.get("names") or ())
    return Answer(res.ok, res.plan.model_dump() if res.ok else None, res.problems)


def _zero_shot(chat, row: dict) -> str | None:
    res = parse(chat(chat_messages(row["text"]), json_schema(), "plan", 64))
    return res.plan.complexity if res.ok else None


MODEL = CompactModel(
    name="planner",
    summary="TiMem recall planner: a question -> simple / hybrid / complex (+ 1-3 keywords); TiMem 3.3",
    head="softmax",
    unit="question",
    labels=COMPLEXITIES,
    rows=training_rows,
    requests=lambda inp: [Request(chat_messages(inp["question"], "teacher"), json_schema(), "plan")],
    read=read_teacher,
    parse=parse,
    gold_label=lambda q: q["plan"],
    max_tokens=128,
    inputs=lambda row: (encoder_text(need(row, "text")),),
    decide=complexity_of,
    rule=lambda row: rule_complexity(row["text"]),
    zero_shot=_zero_shot,
    metric="planner_scores",
    dev_metric="macro_f1",
)
