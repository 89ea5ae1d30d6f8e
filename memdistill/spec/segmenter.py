"""TraceMem topic segmentation: each utterance of a session -> CHANGE (it opens a new topic) or DEVELOP.

TraceMem (seed 003, section 3.1.1 and its segmentation prompt in the appendix) decides each utterance D_n
from D_n with the two utterances before and the two after it, and cuts a session into episodes at the
changes. The first utterance of a session opens its first episode by construction, so it is never a
decision: `decisions` yields the others. `context(turns, i)` renders an utterance with its neighbours;
the compact model is a two-way cross-encoder over `encoder_text(*context(turns, i))`; an LM (teacher, or
the served extractor zero-shot) answers through the prompts here, and `parse` never raises: an answer it
cannot read is DEVELOP (no cut) with a problem code.
Gold labels: data/seed/segments.jsonl, one row per session with the turn ids that open a topic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.dialogue import Turn, message_text
from memdistill.spec.jsonout import Problem, load_json
from memdistill.spec.planner import stem

LABELS = ("DEVELOP", "CHANGE")  # index 1 = a boundary before this utterance
CONTEXT = 2  # utterances on each side, as TraceMem's prompt


class SegmentOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    intent: str


def json_schema() -> dict:
    return {
        "type": "object",
        "properties": {"intent": {"type": "string", "enum": list(LABELS)}},
        "required": ["intent"],
        "additionalProperties": False,
    }


def decisions(turns: list[Turn]) -> list[int]:
    """Indices of a session's utterances that take a decision (all but the first)."""
    return list(range(1, len(turns)))


def _line(t: Turn) -> str:
    return f"{t.speaker}: {message_text(t)}"


def context(turns: list[Turn], i: int) -> tuple[list[str], str, list[str]]:
    """Utterance i as the models read it: (up to CONTEXT lines before, its line, up to CONTEXT after), all
    within the session; a line is `Speaker: text` with a shared photo's caption."""
    before, after = turns[max(0, i - CONTEXT) : i], turns[i + 1 : i + 1 + CONTEXT]
    return [_line(t) for t in before], _line(turns[i]), [_line(t) for t in after]


def encoder_text(before: list[str], target: str, after: list[str]) -> str:
    """What the cross-encoder reads, one text (so that vLLM's /classify reads it exactly as trained)."""
    return " | ".join(before + [f">> {target} <<"] + after)


TEACHER_SYSTEM = """\
You mark where a conversation moves to a new topic. You get one utterance (marked TARGET) with up to two
utterances before it and two after it, from the same session.
Answer CHANGE when the TARGET brings in a subject, activity, event or area of life that the utterances
before it were not about: a question about a different matter, a "by the way" move, news on another
front, a photo about something new, a new request on a different task. An utterance that answers briefly
and then opens a different subject is CHANGE.
Answer DEVELOP when the TARGET answers, reacts to, agrees with, asks a follow-up about, or adds detail to
the subject already under discussion.
Use the utterances after the TARGET only to see whether it started something the conversation then
follows. Reply with JSON only: {"intent": "CHANGE"} or {"intent": "DEVELOP"}."""

STUDENT_SYSTEM = 'Does TARGET open a new topic? Reply with JSON only: {"intent": "CHANGE"} or {"intent": "DEVELOP"}.'


def user_message(before: list[str], target: str, after: list[str]) -> str:
    lines = [f"BEFORE: {x}" for x in before] + [f"TARGET: {target}"]
    return "\n".join(lines + [f"AFTER: {x}" for x in after])


def chat_messages(before: list[str], target: str, after: list[str], prompt: str = "student") -> list[dict]:
    system = TEACHER_SYSTEM if prompt == "teacher" else STUDENT_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(before, target, after)}]


@dataclass
class ParseResult:
    intent: str = "DEVELOP"
    problems: list[Problem] = field(default_factory=list)

    @property
    def change(self) -> bool:
        return self.intent == "CHANGE"

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"records": [{"intent": self.intent}], "problems": [p.to_json() for p in self.problems]}


def parse(raw: str | None) -> ParseResult:
    """An LM's answer; never raises. Unreadable -> DEVELOP (no cut) with a problem."""
    value, problems = load_json(raw)
    if value is None:
        return ParseResult(problems=problems)
    intent = value.get("intent") if isinstance(value, dict) else None
    norm = str(intent).strip().upper().replace(" ", "_") if intent is not None else ""
    norm = {"CHANGE_TOPIC": "CHANGE", "DEVELOP_TOPIC": "DEVELOP", "TC": "CHANGE", "TD": "DEVELOP"}.get(norm, norm)
    if norm not in LABELS:
        return ParseResult(problems=problems + [Problem("bad_intent", f"intent {intent!r} is not one of {LABELS}")])
    return ParseResult(norm, problems)


def label_of(probs) -> str:
    """An encoder's softmax over LABELS -> the label."""
    return LABELS[max(range(len(probs)), key=probs.__getitem__)]


def flags(turns: list[Turn], change_turn_ids) -> list[bool]:
    """Per decision (`decisions(turns)`): whether that utterance opens a topic."""
    ids = set(change_turn_ids)
    return [turns[i].turn_id in ids for i in decisions(turns)]


def episodes(turns: list[Turn], change_turn_ids) -> list[list[Turn]]:
    """A session cut at its changes: contiguous episodes, the first opened by the session's first turn."""
    ids, out = set(change_turn_ids), []
    for k, t in enumerate(turns):
        if k == 0 or t.turn_id in ids:
            out.append([])
        out[-1].append(t)
    return out


# --- rule baseline (written from the label definitions, not fitted to data) ----------------------------

_TOPIC_CUE = re.compile(
    r"\b(by the way|btw|anyway|anyways|speaking of|on another note|changing the subject|unrelated|random question|"
    r"quick question|different question|other news|oh,? (and|also))\b",
    re.I,
)
_FUNCTION = set(
    "that this with have what your about been just they there from were will would like really think know yeah "
    "good great thanks thank sure also some more when then than them could should does much very well going "
    "want need it's i'm that's you're don't".split()
)


def rule_change(row: dict) -> bool:
    """CHANGE on a topic-shift cue ("by the way", "anyway", "speaking of", ...) or when the utterance (4+
    content words) shares no content word with the two before it: lexical cohesion, as TextTiling
    measures it, at its simplest."""
    target = row["target"].split(": ", 1)[-1]
    if _TOPIC_CUE.search(target):
        return True

    def words(line: str) -> set[str]:
        return {stem(w) for w in line.split(": ", 1)[-1].split() if len(w) > 3 and w.lower() not in _FUNCTION}

    cur = words(row["target"])
    return len(cur) >= 4 and not cur & set().union(*map(words, row["before"]))


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict) -> list[dict]:
    change = label["intent"] == "CHANGE"
    return [
        {
            "text": encoder_text(inp["before"], inp["target"], inp["after"]),
            "before": inp["before"],
            "target": inp["target"],
            "after": inp["after"],
            "label": LABELS[change],
            "label_id": int(change),
        }
    ]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0])
    return Answer(res.ok, {"intent": res.intent} if res.ok else None, res.problems)


def _zero_shot(chat, row: dict) -> bool | None:
    res = parse(chat(chat_messages(row["before"], row["target"], row["after"]), json_schema(), "intent", 16))
    return res.change if res.ok else None


MODEL = CompactModel(
    name="segmenter",
    summary="TraceMem topic segmenter (cross-encoder over an utterance with two utterances of context on each "
    "side): CHANGE (opens a topic) / DEVELOP; TraceMem 3.1.1",
    head="softmax",
    unit="utterance",
    labels=LABELS,
    rows=training_rows,
    requests=lambda inp: [
        Request(chat_messages(inp["before"], inp["target"], inp["after"], "teacher"), json_schema(), "intent")
    ],
    read=read_teacher,
    parse=parse,
    gold_label=lambda u: {"intent": LABELS[u["change"]]},
    max_tokens=32,
    inputs=lambda row: (" ".join(need(row, "text").split()),),
    decide=lambda probs: label_of(probs) == "CHANGE",
    rule=rule_change,
    zero_shot=_zero_shot,
    tuning="change_cut",
    metric="segmenter_scores",
    dev_metric="macro_f1",
)
