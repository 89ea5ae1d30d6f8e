"""TriMEM memory types: a dialogue snippet -> a subset of {EM, PM, GM} (empty set = none).

The compact model is a multi-label encoder (BCE, one sigmoid per label); an LM (teacher, or the
served extractor as a zero-shot baseline) answers through the prompts here. The teacher asks one
yes/no question per type, since the MemoType authors found that more accurate than one multi-label
prompt; the single multi-label prompt is kept as an option.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.jsonout import Problem, load_json, norm_bool, norm_str

LABELS = ("EM", "PM", "GM")
Label = Literal["EM", "PM", "GM"]
LABEL_NAMES = {"EM": "episodic memory", "PM": "personal semantic memory", "GM": "general semantic memory"}

DEFINITIONS = {
    "EM": "Episodic memory: a specific event or occurrence tied to a time, place, people or activity, "
    'whether it already happened or is planned ("Last Friday I presented my thesis draft in Lyon", '
    '"I\'m meeting my advisor next Tuesday"). Questions that reveal such an event count too. '
    "General habits or patterns without a particular occurrence do not.",
    "PM": "Personal semantic memory: lasting knowledge about a particular person: identity, background, "
    'relationships, possessions, preferences, habits, skills, values, intentions ("I\'m vegetarian", '
    '"my sister is a nurse", "I prefer short answers").',
    "GM": "General semantic memory: general knowledge or objective description not about the speaker: "
    "facts about the world, explanations of how something works, definitions, instructions, "
    "recommendations of well-known things (typical of assistant answers).",
}
_ALIASES = {
    "episodic": "EM",
    "episodic memory": "EM",
    "em": "EM",
    "personal": "PM",
    "personal semantic memory": "PM",
    "personalized semantic memory": "PM",
    "pm": "PM",
    "persona": "PM",
    "general": "GM",
    "general semantic memory": "GM",
    "gm": "GM",
}


class TypeLabels(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    labels: list[Label]


class TypeDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    present: bool


def json_schema(binary: bool = False) -> dict:
    return (TypeDecision if binary else TypeLabels).model_json_schema()


def encoder_text(snippet: str) -> str:
    """The router's input: the snippet with whitespace folded (speaker prefixes kept: they matter)."""
    return "\n".join(" ".join(line.split()) for line in snippet.strip().splitlines() if line.strip())


def to_vector(labels) -> list[float]:
    s = set(labels)
    return [1.0 if lab in s else 0.0 for lab in LABELS]


def from_probs(probs, thresholds=None) -> list[str]:
    thresholds = thresholds or {lab: 0.5 for lab in LABELS}
    return [lab for lab, p in zip(LABELS, probs) if p >= thresholds[lab]]


_MULTI = """\
Decide which kinds of long-term memory a dialogue snippet contains. It may contain several kinds or none.
{defs}
Greetings, thanks, bare questions with no content and filler contain none.
Answer with JSON only: {{"labels": [...]}} using the codes EM, PM, GM; [] for none."""

TEACHER_SYSTEM = _MULTI.format(defs="\n".join(f"- {k}: {v}" for k, v in DEFINITIONS.items()))
STUDENT_SYSTEM = (
    "Which memory types does the snippet contain? EM = a specific event or plan, PM = lasting "
    "facts or preferences about a person, GM = general knowledge. Reply with JSON only: "
    '{"labels": [...]}, [] for none.'
)

_BINARY = """\
Decide whether a dialogue snippet contains {name}.
Definition: {definition}
If any part of the snippet qualifies, the answer is yes, even when the rest does not.
Answer with JSON only: {{"present": true}} or {{"present": false}}."""

TEACHER_BINARY = {lab: _BINARY.format(name=LABEL_NAMES[lab], definition=DEFINITIONS[lab]) for lab in LABELS}


def user_message(snippet: str) -> str:
    return f"Snippet:\n{encoder_text(snippet)}"


def chat_messages(snippet: str, prompt: str = "student", label: str | None = None) -> list[dict]:
    """`prompt`: "student" / "teacher" (multi-label), or "binary" with `label` (one yes/no decision)."""
    if prompt == "binary":
        system = TEACHER_BINARY[label]
    else:
        system = STUDENT_SYSTEM if prompt == "student" else TEACHER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(snippet)}]


def render_completion(labels) -> str:
    return json.dumps({"labels": [lab for lab in LABELS if lab in set(labels)]}, separators=(",", ":"))


@dataclass
class ParseResult:
    labels: list[str] | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.labels is not None

    def to_json(self) -> dict:
        return {
            "records": [{"labels": self.labels}] if self.labels is not None else [],
            "problems": [p.to_json() for p in self.problems],
        }


def _label(x) -> str | None:
    s = norm_str(x)
    return s.upper() if s.upper() in LABELS else _ALIASES.get(s.lower())


def parse(raw: str | None) -> ParseResult:
    """Multi-label output -> labels. Accepts {"labels": [...]}, a bare list, or label names in prose."""
    res = ParseResult()
    value, problems = load_json(raw, expect=dict)
    res.problems.extend(problems)
    if isinstance(value, dict):
        value = value.get("labels", value.get("memory_types", value.get("types")))
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        labs = []
        for x in value:
            lab = _label(x)
            if lab is None:
                if norm_str(x).lower() not in ("none", ""):
                    res.problems.append(Problem("bad_label", f"label {x!r} dropped"))
            elif lab not in labs:
                labs.append(lab)
        res.labels = [lab for lab in LABELS if lab in labs]
        return res
    # No usable JSON: a model that answered in words ("Episodic Memory, General ...").
    if raw and raw.strip():
        found = [lab for lab in LABELS if re.search(rf"\b({lab}|{LABEL_NAMES[lab]})\b", raw, re.I)]
        if found or re.fullmatch(r"\W*none\W*", raw.strip(), re.I):
            res.problems = [p for p in res.problems if p.code != "no_json"] + [
                Problem("labels_from_text", "labels read from plain text")
            ]
            res.labels = found
        elif value is not None:
            res.problems.append(Problem("wrong_shape", 'expected {"labels": [...]}'))
    return res


def parse_binary(raw: str | None) -> tuple[bool | None, list[Problem]]:
    """One yes/no decision -> True / False / None (unreadable)."""
    value, problems = load_json(raw)
    if isinstance(value, dict):
        b = norm_bool(value.get("present", value.get("answer")))
        if b is not None:
            return b, problems
    text = (raw or "").strip().lower()
    if text:
        if re.search(r"\b(yes|true)\b", text) and not re.search(r"\b(no|false|none)\b", text):
            return True, [Problem("decision_from_text", "yes read from plain text")]
        if re.search(r"\b(no|false|none)\b", text):
            return False, [Problem("decision_from_text", "no read from plain text")]
    return None, problems + [Problem("unreadable_decision", "neither yes nor no")]


# --- rule baseline (written from the label definitions, not fitted to data) ----------------------------

_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_TIME = re.compile(
    rf"\b(yesterday|today|tonight|tomorrow|ago|last (week|month|year|night|weekend|time)|"
    rf"next (week|month|year|weekend)|this (morning|week|weekend|afternoon|evening)|"
    rf"on ({_DAYS})|({_MONTHS})|({_DAYS})|(19|20)\d\d|just (got|had|finished|bought|started))\b",
    re.I,
)
_FIRST_PERSON_FACT = re.compile(
    r"\b(i am|i'm|i've|i have|i love|i like|i hate|i prefer|i always|i usually|i never|"
    r"my (wife|husband|partner|son|daughter|sister|brother|mom|mum|dad|mother|father|"
    r"family|job|kids?|dog|cat|boss|friend|favou?rite)|i work|i live)\b",
    re.I,
)
_GENERAL = re.compile(
    r"\b(is a|are a|means|usually|typically|generally|in general|for example|recommend|try|"
    r"you can|you could|aim for|it's best|the best)\b",
    re.I,
)


def rule_labels(snippet: str) -> list[str]:
    """EM: a time expression (date, weekday, month, yesterday, last/next ...). PM: a first-person lasting
    fact (I'm, I love/prefer/always, my <relative/job/pet>). GM: a non-first-person explanatory or advice
    sentence (usually, for example, you can, recommend ...) of at least 12 words."""
    text = encoder_text(snippet)
    body = text.split(":", 1)[1] if re.match(r"^[\w .'-]{1,30}:", text) else text
    labels = []
    if _TIME.search(body):
        labels.append("EM")
    if _FIRST_PERSON_FACT.search(body):
        labels.append("PM")
    if _GENERAL.search(body) and len(body.split()) >= 12:
        labels.append("GM")
    return labels


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict) -> list[dict]:
    return [
        {
            "text": encoder_text(inp["text"]),
            "labels": [lab for lab in LABELS if lab in label["labels"]],
            "label_vector": to_vector(label["labels"]),
        }
    ]


def teacher_requests(inp: dict) -> list[Request]:
    """mode "binary" (the default): one yes/no request per type, as the MemoType authors found more accurate
    than one multi-label prompt; "single": one multi-label request."""
    if inp.get("mode") == "single":
        return [Request(chat_messages(inp["text"], "teacher"), json_schema(), "labels")]
    return [Request(chat_messages(inp["text"], "binary", lab), json_schema(binary=True), "decision") for lab in LABELS]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    if inp.get("mode") == "single":
        res = parse(texts[0])
        return Answer(res.ok, {"labels": res.labels} if res.ok else None, res.problems)
    decisions, problems = {}, []
    for lab, text in zip(LABELS, texts):
        decisions[lab], probs = parse_binary(text)
        problems += [Problem(p.code, f"{lab}: {p.detail}") for p in probs]
    ok = None not in decisions.values()
    return Answer(
        ok, {"labels": [lab for lab, b in decisions.items() if b], "decisions": decisions} if ok else None, problems
    )


MODEL = CompactModel(
    name="router",
    summary="TriMEM memory type router: a snippet -> a subset of EM / PM / GM (none = no label); MemoType 2.2",
    head="multi_label",
    unit="snippet",
    labels=LABELS,
    rows=training_rows,
    requests=teacher_requests,
    read=read_teacher,
    parse=parse,
    gold_label=lambda s: {"labels": s["labels"]},
    max_tokens=64,
    inputs=lambda row: (encoder_text(need(row, "text")),),
    decide=from_probs,
    rule=lambda row: rule_labels(row["text"]),
    zero_shot=lambda chat, row: parse(chat(chat_messages(row["text"]), json_schema(), "labels", 32)).labels,
    tuning="per_label",
    metric="router_scores",
    dev_metric="macro_ap",
)
