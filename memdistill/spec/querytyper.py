"""MemoType query typing: a question -> the one TriMEM type its answer is stored as (EM / PM / GM), or none.

MemoType (seed 004, section 2.2) does not classify the raw question, which its authors found inaccurate:
an LLM writes K = 5 hypothetical memories that would answer the question (HyDE-style, its Figure 16),
the trained type router (memdistill.spec.router) labels each, and a majority vote gives the query's
type; retrieval is then scoped to memories of that type. Here:
- `chat_messages` / `json_schema` / `parse` are the hypothetical-memory call (teacher or served LM);
- `vote` turns the router's probabilities over the K memories into the query type: the label present
  in the most memories (probability >= 0.5, the router's folded cut), ties broken by the summed
  probability; `NONE` when no memory carries any label (then nothing is scoped);
- the distilled query typer is a 4-way encoder over `encoder_text(question)` trained on that vote, so
  the runtime pays one encoder call instead of an LM call plus K router calls;
- `in_scope` is the runtime's filter: a record of the query's type, or a record with no type (never
  typed, or typed none), stays searchable. MemoType leaves none-typed memories out of every scope;
  memdistill keeps them, so that scoping can only skip records the router placed elsewhere.
Offline (no teacher), the K memories are a question's gold evidence turns (`Speaker: text`, at most K):
the real dialogue records the hypothetical ones stand in for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.jsonout import Problem, load_json, norm_str
from memdistill.spec.router import LABELS as MEMORY_TYPES
from memdistill.spec.router import rule_labels

K = 5
NONE = "none"
LABELS = (*MEMORY_TYPES, NONE)


def json_schema(k: int = K) -> dict:
    return {
        "type": "object",
        "properties": {
            "memories": {"type": "array", "items": {"type": "string", "maxLength": 300}, "minItems": k, "maxItems": k}
        },
        "required": ["memories"],
        "additionalProperties": False,
    }


def encoder_text(question: str) -> str:
    return " ".join(question.split())


TEACHER_SYSTEM = """\
A memory system stores what people said in past conversations. Given a question that will be asked of that
memory, imagine the earlier messages that would hold its answer. Write {k} different hypothetical messages,
each one sentence said by one speaker, as "Speaker: message". Use the names in the question; for a chat
between a user and an assistant, the speaker is User or Assistant, whichever would have said it. Invent
plausible details where the question leaves them open. Reply with JSON only: {{"memories": [...]}}."""

STUDENT_SYSTEM = (
    'Write {k} different one-sentence messages ("Speaker: message") from an earlier conversation that would '
    'answer the question. Reply with JSON only: {{"memories": [...]}}.'
)


def chat_messages(question: str, prompt: str = "student", k: int = K) -> list[dict]:
    system = (TEACHER_SYSTEM if prompt == "teacher" else STUDENT_SYSTEM).format(k=k)
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {encoder_text(question)}"}]


@dataclass
class ParseResult:
    memories: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.memories)

    def to_json(self) -> dict:
        return {
            "records": [{"memories": self.memories}] if self.memories else [],
            "problems": [p.to_json() for p in self.problems],
        }


def parse(raw: str | None, k: int = K) -> ParseResult:
    """Hypothetical memories; never raises. Keeps the first k distinct non-empty strings."""
    value, problems = load_json(raw, expect=dict)
    if isinstance(value, dict):
        value = value.get("memories")
    if not isinstance(value, list):
        return ParseResult(
            problems=problems + ([Problem("wrong_shape", 'expected {"memories": [...]}')] if raw else [])
        )
    out = []
    for x in value:
        s = " ".join(norm_str(x).split())
        if s and s not in out:
            out.append(s)
    res = ParseResult(out[:k], problems)
    if not out:
        res.problems.append(Problem("no_memories", "no non-empty memory"))
    elif len(out) < k:
        res.problems.append(Problem("few_memories", f"{len(out)} distinct memories, asked for {k}"))
    return res


def vote(probs: list[list[float]]) -> str:
    """Router probabilities (one vector over router.LABELS per memory) -> the query type."""
    counts = {lab: sum(p[i] >= 0.5 for p in probs) for i, lab in enumerate(MEMORY_TYPES)}
    if not any(counts.values()):
        return NONE
    mass = {lab: sum(p[i] for p in probs) for i, lab in enumerate(MEMORY_TYPES)}
    return max(MEMORY_TYPES, key=lambda lab: (counts[lab], mass[lab]))


def label_of(probs) -> str:
    """The query typer's softmax over LABELS -> the query type."""
    return LABELS[max(range(len(probs)), key=probs.__getitem__)]


def in_scope(record_types, query_type: str | None) -> bool:
    """Whether a record with TriMEM labels `record_types` (None = never typed) is searched for a query of
    `query_type` (None or NONE = no scope)."""
    return not query_type or query_type == NONE or not record_types or query_type in record_types


# --- the compact model ----------------------------------------------------------------------------


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0])
    return Answer(res.ok, {"memories": res.memories} if res.ok else None, res.problems)


MODEL = CompactModel(
    name="querytyper",
    summary="MemoType query typer: a question -> the TriMEM type its answer is stored as (EM / PM / GM / none), "
    "distilled from the type router's majority vote over memories that answer it; MemoType 2.2",
    head="softmax",
    unit="question",
    labels=LABELS,
    # the label is cast at training time: the router's vote over these memories (labelled_by)
    rows=lambda inp, label: [{"text": encoder_text(inp["question"]), "memories": label["memories"]}],
    requests=lambda inp: [Request(chat_messages(inp["question"], "teacher"), json_schema(), "memories")],
    read=read_teacher,
    parse=parse,
    # offline, the K memories are the question's first K gold evidence turns (`Speaker: text`)
    gold_label=lambda q: {"memories": q["evidence_texts"][:K]},
    max_tokens=640,
    inputs=lambda row: (" ".join(need(row, "text").split()),),
    decide=label_of,
    # the type router's rule on the question itself: its first label, none when it finds none
    rule=lambda row: next(iter(rule_labels(row["text"])), NONE),
    metric="querytyper_scores",
    dev_metric="macro_f1",
    labelled_by="router",
)
