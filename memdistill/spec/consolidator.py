"""DimMem memory update (DA-Update): a (new record, existing record) pair -> MERGE, SUPERSEDE or KEEPBOTH.

DimMem (seed 001, section 3.4, appendix A.2) only asks for a decision on pairs that survive a cheap
cascade (same memory_type, then keyword Jaccard, then embedding cosine); `candidates` is that cascade,
counting the embedding comparisons it made against the all-pairs baseline (Table 5). The compact model
is a three-way cross-encoder over `encoder_text(new, existing)`; an LM (teacher, or the served extractor
zero-shot) answers through the prompts here. For MERGE an LM also writes the merged record; when it
does not (or the encoder decided), `merge_rule` builds it. `parse` never raises: output it cannot read
becomes KEEPBOTH, the action that changes nothing, with a problem code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.extractor import MAX_CONTENT_CHARS, MAX_KEYWORDS, Dimension, inline_refs, time_problem
from memdistill.spec.jsonout import Problem, load_json, norm_keywords, norm_str

ACTIONS = ("MERGE", "SUPERSEDE", "KEEPBOTH")
Action = Literal["MERGE", "SUPERSEDE", "KEEPBOTH"]
# Cascade thresholds: DimMem's keyword Jaccard (> 0.3, Table 10) and embedding cosine (>= 0.7, where
# LightMem's embedding-only dedup uses 0.85).
JACCARD = 0.3
COSINE = 0.7
LIGHTMEM_COSINE = 0.85
# The runtime's cascade ("wide"; Consolidator and the mem0 adapter start from it): same memory_type, then any
# shared keyword or cosine >= 0.5. DimMem's (JACCARD, then COSINE) passes 4 of the gold test split's 12,242 pairs:
# keywords written record by record rarely agree word for word (README, Memory update).
WIDE = {"jaccard_min": 0.0, "cosine_min": 0.5, "keywords_then_cosine": False}


@dataclass(frozen=True)
class StoredRecord:
    """What the consolidator sees of one record: content, every dimension and where it came from."""

    content: str
    dimension: Dimension
    source_speaker: str = ""
    source_timestamp: str = ""  # ISO time of the source message; "" when unknown

    @classmethod
    def at(cls, row: dict, turn) -> "StoredRecord":
        """A record (content, dimension as a mapping) said in `turn` (a memdistill.spec.dialogue.Turn)."""
        return cls(row["content"], Dimension(**row["dimension"]), turn.speaker, turn.timestamp.isoformat())

    @classmethod
    def from_json(cls, row: dict) -> "StoredRecord":
        dim = row["dimension"]
        return cls(
            row["content"],
            dim if isinstance(dim, Dimension) else Dimension(**dim),
            row.get("source_speaker") or row.get("speaker") or "",
            str(row.get("source_timestamp") or row.get("timestamp") or ""),
        )

    def to_json(self) -> dict:
        return {
            "content": self.content,
            "dimension": self.dimension.model_dump(),
            "source_speaker": self.source_speaker,
            "source_timestamp": self.source_timestamp,
        }


# --- the cascade ---------------------------------------------------------------------------------


def _kw_set(rec: StoredRecord) -> set[str]:
    return {" ".join(k.lower().split()) for k in rec.dimension.keywords if k.strip()}


def jaccard(a: StoredRecord, b: StoredRecord) -> float:
    x, y = _kw_set(a), _kw_set(b)
    return len(x & y) / len(x | y) if x | y else 0.0


@dataclass
class CascadeStats:
    all_pairs: int = 0  # what an embedding-only dedup (LightMem) would compare: the new record x every existing one
    same_type: int = 0
    keyword_pass: int = 0
    embedding_comparisons: int = 0  # keyword passes (DimMem), or every same-type pair (keywords_then_cosine=False)
    candidates: int = 0

    @property
    def embeddings_saved(self) -> float:
        return 1 - self.embedding_comparisons / self.all_pairs if self.all_pairs else 0.0

    def add(self, other: "CascadeStats") -> None:
        for k in ("all_pairs", "same_type", "keyword_pass", "embedding_comparisons", "candidates"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def to_json(self) -> dict:
        return {
            "all_pairs": self.all_pairs,
            "same_type": self.same_type,
            "keyword_pass": self.keyword_pass,
            "embedding_comparisons": self.embedding_comparisons,
            "embeddings_saved": round(self.embeddings_saved, 4),
            "candidates": self.candidates,
        }


def candidates(
    new: StoredRecord,
    existing: list[StoredRecord],
    embed: Callable[[list[str]], object],
    jaccard_min: float = JACCARD,
    cosine_min: float = COSINE,
    keywords_then_cosine: bool = True,
    same_type: bool = True,
) -> tuple[list[tuple[int, float]], CascadeStats]:
    """Indices of `existing` records worth a decision for `new`, with their cosine, best first.

    Level 1: same memory_type; level 2: keyword Jaccard > jaccard_min; level 3: cosine of the contents
    (`embed` returns unit vectors, one row per text) >= cosine_min. Only level-2 survivors are embedded
    (DimMem). With keywords_then_cosine=False a same-type pair passes on either test (keywords written
    apart rarely agree word for word; every same-type pair is then embedded). same_type=False skips level 1:
    a change is often recorded under another type than what it replaces (a planned trip, episodic, then
    a fact that it was called off), and DimMem's grouping never compares the two."""
    stats = CascadeStats(all_pairs=len(existing))
    typed = [i for i, r in enumerate(existing) if not same_type or r.dimension.memory_type == new.dimension.memory_type]
    stats.same_type = len(typed)
    lexical = [i for i in typed if jaccard(new, existing[i]) > jaccard_min]
    stats.keyword_pass = len(lexical)
    compared = lexical if keywords_then_cosine else typed
    stats.embedding_comparisons = len(compared)
    if not compared:
        return [], stats
    vecs = np.asarray(embed([new.content] + [existing[i].content for i in compared]))
    sims = (vecs[1:] @ vecs[0]).tolist()
    keep = set(lexical)
    passed = [(i, s) for i, s in zip(compared, sims) if s >= cosine_min or (not keywords_then_cosine and i in keep)]
    out = sorted(passed, key=lambda x: -x[1])
    stats.candidates = len(out)
    return out, stats


# --- the decision ---------------------------------------------------------------------------------


class MergedRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    dimension: Dimension


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    action: Action
    merged: MergedRecord | None = None


def json_schema() -> dict:
    return inline_refs(Decision.model_json_schema())


def action_of(probs) -> str:
    """The consolidator encoder's decision from its softmax (id2label order): the most probable action."""
    return ACTIONS[max(range(len(probs)), key=probs.__getitem__)]


RULES = {
    "fact": "If the new record states a different value for the same thing (a changed job, address, status, "
    "count or configuration, or a correction of the old statement), the new one SUPERSEDES the old. If it "
    "adds detail to the same fact without contradicting it, MERGE them. Facts about different things: KEEPBOTH.",
    "episodic": "If both describe the same single event (same occasion, compatible time and place), MERGE them; "
    "a plan that was moved, cancelled or replaced by a different plan is SUPERSEDED by the new record. "
    "Different occurrences of a similar activity (another trip, another appointment, another week) are "
    "distinct events: KEEPBOTH, even when they share most words.",
    "profile": "If both describe the same preference, habit or trait and agree, MERGE them; if the person's "
    "preference or habit has changed or reversed, the new record SUPERSEDES the old. Different aspects of "
    "the person (a food taste and a music taste): KEEPBOTH.",
}

TEACHER_SYSTEM = (
    """\
You maintain a long-term memory of conversations. A new memory record has just been extracted and an
existing record looks related. Decide what to do with the pair:
- MERGE: both are about the same thing and agree; replace them with one record that keeps every detail
  of both (write it in "merged").
- SUPERSEDE: the new record replaces the old one: the fact changed, the plan changed, or the old one was
  corrected. The old record is kept as history, marked as no longer current.
- KEEPBOTH: they are about different things, or you are unsure. Nothing changes.
Rules by memory type:
"""
    + "\n".join(f"- {k}: {v}" for k, v in RULES.items())
    + """
Read the times and dates: the new record was said later. Sharing words is not enough for MERGE.
A merged record keeps the DimMem form: one self-contained sentence with names and absolute dates,
its memory_type, time (YYYY-MM-DD, YYYY-MM, YYYY or a range a/b, "" if none), location, reason,
purpose and 1-6 keywords.
Answer with JSON only: {"action": "MERGE" | "SUPERSEDE" | "KEEPBOTH", "merged": {record} or null}."""
)

STUDENT_SYSTEM = (
    "Compare a new memory with an existing one. MERGE if they describe the same thing and agree (write the "
    "merged record), SUPERSEDE if the new one changes or corrects the old, KEEPBOTH if they are different "
    'things. Reply with JSON only: {"action": ..., "merged": {...} or null}'
)


def record_text(rec: StoredRecord) -> str:
    """One line per record, every dimension included: the text both the LM and the encoder read."""
    d = rec.dimension
    parts = [f"[{d.memory_type}]", " ".join(rec.content.split())]
    for name in ("time", "location", "reason", "purpose"):
        value = getattr(d, name)
        if value:
            parts.append(f"{name}: {' '.join(value.split())}")
    if d.keywords:
        parts.append("keywords: " + ", ".join(d.keywords))
    said = " ".join(x for x in (rec.source_speaker, rec.source_timestamp[:16].replace("T", " ")) if x)
    if said:
        parts.append(f"said: {said}")
    return " | ".join(parts)


def encoder_text(new: StoredRecord, existing: StoredRecord) -> str:
    """The cross-encoder's one input text (one text, so vLLM's /classify and training tokenise alike)."""
    return f"NEW {record_text(new)}\nOLD {record_text(existing)}"


def user_message(new: StoredRecord, existing: StoredRecord) -> str:
    return f"Existing record: {record_text(existing)}\nNew record: {record_text(new)}"


def chat_messages(new: StoredRecord, existing: StoredRecord, prompt: str = "student") -> list[dict]:
    system = STUDENT_SYSTEM if prompt == "student" else TEACHER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message(new, existing)}]


def render_completion(action: str, merged: MergedRecord | None = None) -> str:
    body = {"action": action, "merged": merged.model_dump() if merged is not None else None}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def merge_rule(new: StoredRecord, existing: StoredRecord) -> MergedRecord:
    """The documented merge when no model wrote one: the content that covers the other (>= 60% of its
    words) wins, else old then new content joined; each dimension takes the new record's value when it
    has one, else the old one's; keywords are the union (old first), at most MAX_KEYWORDS."""
    a, b = existing.content.strip(), new.content.strip()
    wa, wb = _words(a), _words(b)
    if wb and len(wa & wb) >= 0.6 * len(wa):
        content = b
    elif wa and len(wa & wb) >= 0.6 * len(wb):
        content = a
    else:
        content = f"{a.rstrip('.')}. {b}"
    dn, do = new.dimension, existing.dimension
    keywords = list(dict.fromkeys(do.keywords + dn.keywords))[:MAX_KEYWORDS]
    return MergedRecord(
        content=content[:MAX_CONTENT_CHARS],
        dimension=Dimension(
            memory_type=dn.memory_type,
            time=dn.time or do.time,
            location=dn.location or do.location,
            reason=dn.reason or do.reason,
            purpose=dn.purpose or do.purpose,
            keywords=keywords,
        ),
    )


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


_CHANGE = re.compile(
    r"\b(now|instead|no longer|any more|anymore|actually|corrected|changed|switched|moved|rescheduled|"
    r"postponed|cancell?ed|replaced|new|not \w+ but|stopped|quit|decided)\b",
    re.I,
)


def rule_action(new: StoredRecord, existing: StoredRecord) -> str:
    """The rule baseline, written from the action definitions, not fitted: a new record whose wording
    signals a change (now, instead, no longer, moved, rescheduled, cancelled, ...) supersedes; else
    records sharing most content words (word Jaccard >= 0.5) merge; else keep both."""
    if _CHANGE.search(new.content):
        return "SUPERSEDE"
    a, b = _words(new.content), _words(existing.content)
    if a and b and len(a & b) / len(a | b) >= 0.5:
        return "MERGE"
    return "KEEPBOTH"


def below_successors(ids: list[str], successor: Callable[[str], str | None]) -> list[int]:
    """A ranking's order (positions into `ids`) kept, except that a record moves just below the lowest-ranked
    record that replaced it: what superseded it or what it merged into (`successor`), following the chain
    through records outside the ranking. No record then ranks above its replacement, even when a later record
    superseded that one too (the runtime's history="after" and the mem0 adapter's history search)."""
    pos = {m: k for k, m in enumerate(ids)}
    key: dict[str, float] = {}

    def place(m: str, seen: frozenset) -> float:
        if m not in key:
            k, nxt = float(pos[m]), successor(m)
            while nxt and nxt not in seen:
                seen |= {nxt}
                if nxt in pos:
                    k = max(k, place(nxt, seen) + 0.5)
                    break
                nxt = successor(nxt)
            key[m] = k
        return key[m]

    return sorted(range(len(ids)), key=lambda k: (place(ids[k], frozenset({ids[k]})), k))


@dataclass
class ParseResult:
    action: str = "KEEPBOTH"
    merged: MergedRecord | None = None
    problems: list[Problem] = field(default_factory=list)
    ok: bool = False  # False: the action is the KEEPBOTH fallback for an output with no readable action

    def to_json(self) -> dict:
        return {
            "action": self.action,
            "merged": self.merged.model_dump() if self.merged is not None else None,
            "ok": self.ok,
            "problems": [p.to_json() for p in self.problems],
        }


_ACTION_ALIASES = {"KEEP_BOTH": "KEEPBOTH", "KEEP": "KEEPBOTH", "NONE": "KEEPBOTH", "UPDATE": "SUPERSEDE",
                   "REPLACE": "SUPERSEDE", "NOOP": "KEEPBOTH", "ADD": "KEEPBOTH"}  # fmt: skip


def _action(x) -> str | None:
    s = re.sub(r"[\s-]+", "_", norm_str(x).upper())
    return s if s in ACTIONS else _ACTION_ALIASES.get(s)


def parse(raw: str | None, new: StoredRecord | None = None, existing: StoredRecord | None = None) -> ParseResult:
    """Any output -> a decision. Unreadable -> KEEPBOTH with a problem (the action that loses nothing).
    MERGE without a usable merged record -> `merge_rule(new, existing)` when the pair is given."""
    res = ParseResult()
    value, problems = load_json(raw)
    res.problems.extend(problems)
    if isinstance(value, str):
        value = {"action": value}
    if value is None and raw:
        # A bare word answer ("SUPERSEDE") from a model that ignored the JSON instruction.
        found = {a for a in (_action(w) for w in re.findall(r"[A-Za-z_]+", raw)) if a}
        if len(found) == 1:
            res.problems = [p for p in res.problems if p.code != "no_json"]
            res.problems.append(Problem("action_from_text", "action read from plain text"))
            value = {"action": found.pop()}
    if not isinstance(value, dict):
        if value is not None or not problems:
            res.problems.append(Problem("wrong_shape", 'expected {"action": ..., "merged": ...}'))
        return res
    action = _action(value.get("action", value.get("decision", value.get("event"))))
    if action is None:
        res.problems.append(Problem("bad_action", f"action {value.get('action')!r} is not one of {ACTIONS}"))
        return res
    res.action, res.ok = action, True
    merged = value.get("merged")
    if action != "MERGE":
        if merged:
            res.problems.append(Problem("extra_fields", f"merged record ignored for {action}"))
        return res
    res.merged = _merged(merged, res.problems)
    if res.merged is None and new is not None and existing is not None:
        res.problems.append(Problem("merged_by_rule", "no usable merged record; built by merge_rule"))
        res.merged = merge_rule(new, existing)
    return res


def _merged(item, problems: list[Problem]) -> MergedRecord | None:
    if not isinstance(item, dict):
        if item is not None:
            problems.append(Problem("bad_merged", f"merged is a {type(item).__name__}, not an object"))
        return None
    dim = item.get("dimension")
    if not isinstance(dim, dict):
        problems.append(Problem("bad_merged", "merged record has no dimension object"))
        return None
    kws, _ = norm_keywords(dim.get("keywords"))
    t = norm_str(dim.get("time"))
    if time_problem(t) is not None:
        problems.append(Problem("invalid_time", f"merged time {t!r} emptied"))
        t = ""
    try:
        return MergedRecord(
            content=norm_str(item.get("content"))[:MAX_CONTENT_CHARS],
            dimension=Dimension(
                memory_type=norm_str(dim.get("memory_type")).lower(),
                time=t,
                location=norm_str(dim.get("location")),
                reason=norm_str(dim.get("reason")),
                purpose=norm_str(dim.get("purpose")),
                keywords=kws[:MAX_KEYWORDS],
            ),
        )
    except ValidationError as e:
        problems.append(Problem("bad_merged", str(e).splitlines()[0]))
        return None


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict) -> list[dict]:
    """inp: the two records as StoredRecord JSON ("new", "existing"); label: action and merged record."""
    new, old = (StoredRecord.from_json(inp[k]) for k in ("new", "existing"))
    return [
        {
            "text": encoder_text(new, old),
            "label": label["action"],
            "label_id": ACTIONS.index(label["action"]),
            "merged": label.get("merged"),
            "new": inp["new"],
            "existing": inp["existing"],
        }
    ]


def teacher_requests(inp: dict) -> list[Request]:
    new, old = (StoredRecord.from_json(inp[k]) for k in ("new", "existing"))
    return [Request(chat_messages(new, old, "teacher"), json_schema(), "decision")]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    new, old = (StoredRecord.from_json(inp[k]) for k in ("new", "existing"))
    res = parse(texts[0], new, old)
    label = {"action": res.action, "merged": res.merged.model_dump() if res.merged else None}
    return Answer(res.ok, label if res.ok else None, res.problems)


def _pair(row: dict) -> tuple[StoredRecord, StoredRecord]:
    """A built row's (new, existing) records."""
    return StoredRecord.from_json(row["new"]), StoredRecord.from_json(row["existing"])


def _zero_shot(chat, row: dict) -> str | None:
    new, old = _pair(row)
    res = parse(chat(chat_messages(new, old), json_schema(), "decision", 384), new, old)
    return res.action if res.ok else None


MODEL = CompactModel(
    name="consolidator",
    summary="DimMem memory-update consolidator (cross-encoder over one text holding both records): (new record, "
    "existing record) -> MERGE / SUPERSEDE / KEEPBOTH; merged records by `consolidator.merge_rule`; DimMem 3.4",
    head="softmax",
    unit="pair",
    labels=ACTIONS,
    rows=training_rows,
    requests=teacher_requests,
    read=read_teacher,
    parse=parse,
    gold_label=lambda p: {"action": p["action"], "merged": p.get("merged")},
    max_tokens=512,
    inputs=lambda row: (" ".join(need(row, "text").split()),),
    decide=action_of,
    rule=lambda row: rule_action(*_pair(row)),
    zero_shot=_zero_shot,
    metric="consolidator_scores",
    dev_metric="macro_f1",
    after=("extractor",),
)
