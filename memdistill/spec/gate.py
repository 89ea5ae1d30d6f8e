"""TiMem recall gating: question + complexity + numbered candidate memories -> the ids to keep.

The compact gate is a cross-encoder scoring (question with its complexity, one candidate) pairs;
`select` turns scores into kept ids under per-complexity budgets. An LM answers through the prompts.
The flat budgets (BUDGETS) are memdistill's choice, not TiMem's: see the note on BUDGETS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from memdistill.spec.compact import Answer, CompactModel, Request, need
from memdistill.spec.jsonout import Problem, load_json
from memdistill.spec.planner import COMPLEXITIES, heuristic_keywords, stem

# Most memories the gate may keep, and the planner's recall budget in memdistill.runtime: memdistill's own
# flat caps, since its bank has no hierarchy. TiMem caps no gate output; its planner sets per-level budgets
# of hierarchical recall over the memory tree (Table 7: simple L1:20, L2:4, L5:1; hybrid L1:20, L2:4,
# L3:2, L5:1; complex L1:20, L2:8, L3:4, L4:2, L5:1), and its gate then keeps what it judges useful.
# Where the numbers come from: the top of TiMem's simple-query gating prompt ("3-8 memories", E.3.6)
# for simple, its 20 leaf memories (L1:20) for complex, hybrid between the two.
BUDGETS = {"simple": 8, "hybrid": 12, "complex": 20}
# Per-complexity policy: simple queries favour precision, complex ones recall (TiMem 3.3.3).
THRESHOLD_SHIFT = {"simple": 0.1, "hybrid": 0.0, "complex": -0.1}


class GateOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kept_ids: list[int]


def json_schema() -> dict:
    return GateOutput.model_json_schema()


_POLICY = {
    "simple": "Keep only memories that directly answer the question or give its essential time or place (usually 3-8).",
    "hybrid": "Keep every memory that supplies one of the facts the answer must gather or compare; drop the "
    "rest (usually up to 12).",
    "complex": "Keep memories that bear on the person's preferences, habits, traits or the trend asked "
    "about, favouring recall over precision (up to 20).",
}

TEACHER_SYSTEM = (
    """\
You filter memories recalled for a question, keeping only those that help answer it. You get the
question, its complexity (simple, hybrid or complex) and numbered candidate memories.
Keep a memory when it answers the question or gives context the answer needs (its time, place,
people, or a fact the answer combines). Drop memories on other topics, and related ones that do not
contribute, even when they share words with the question. When memories conflict, keep the most
recent one and any that explain the change.
Policy by complexity:
"""
    + "\n".join(f"- {k}: {v}" for k, v in _POLICY.items())
    + """
Answer with JSON only: {"kept_ids": [ids in order of usefulness]}; [] when nothing helps."""
)

STUDENT_SYSTEM = (
    "Keep the numbered memories that help answer the question (simple: only direct answers; "
    "hybrid: each fact to combine; complex: broader context). Reply with JSON only: "
    '{"kept_ids": [...]}'
)


def pair_query(question: str, complexity: str) -> str:
    """First text of a cross-encoder pair: the complexity tag conditions what counts as relevant."""
    if complexity not in COMPLEXITIES:
        raise ValueError(f"complexity {complexity!r} is not one of {COMPLEXITIES}")
    return f"[{complexity}] {' '.join(question.split())}"


def user_message(question: str, complexity: str, candidates: list[str]) -> str:
    lines = "\n".join(f"{i}. {' '.join(c.split())}" for i, c in enumerate(candidates, 1))
    return f"Complexity: {complexity}\nQuestion: {' '.join(question.split())}\nCandidates ({len(candidates)}):\n{lines}"


def chat_messages(question: str, complexity: str, candidates: list[str], prompt: str = "student") -> list[dict]:
    system = STUDENT_SYSTEM if prompt == "student" else TEACHER_SYSTEM
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user_message(question, complexity, candidates)},
    ]


def render_completion(kept_ids) -> str:
    return json.dumps({"kept_ids": list(kept_ids)}, separators=(",", ":"))


def select(scores, complexity: str, threshold: float = 0.5) -> list[int]:
    """Kept 1-based ids from keep probabilities: above the complexity-shifted threshold, best first,
    at most BUDGETS[complexity]."""
    cut = threshold + THRESHOLD_SHIFT[complexity]
    ranked = sorted(((s, i) for i, s in enumerate(scores, 1) if s >= cut), key=lambda x: (-x[0], x[1]))
    return [i for _, i in ranked[: BUDGETS[complexity]]]


@dataclass
class ParseResult:
    kept_ids: list[int] | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.kept_ids is not None

    def to_json(self) -> dict:
        return {
            "records": [{"kept_ids": self.kept_ids}] if self.kept_ids is not None else [],
            "problems": [p.to_json() for p in self.problems],
        }


def parse(raw: str | None, n_candidates: int | None = None, complexity: str | None = None) -> ParseResult:
    """Accepts {"kept_ids": [...]}, TiMem's {"relevant_ids": [...]}, or a bare list. Ids out of range
    or repeated are dropped; a list over the complexity's budget is cut."""
    res = ParseResult()
    value, problems = load_json(raw, list_key="kept_ids")
    res.problems.extend(problems)
    if isinstance(value, dict):
        value = value.get("kept_ids", value.get("relevant_ids", value.get("ids")))
    if not isinstance(value, list):
        if value is not None or not problems:
            res.problems.append(Problem("wrong_shape", 'expected {"kept_ids": [...]}'))
        return res
    ids = []
    for x in value:
        try:
            i = int(x)
        except (TypeError, ValueError):
            res.problems.append(Problem("bad_id", f"id {x!r} dropped"))
            continue
        if n_candidates is not None and not 1 <= i <= n_candidates:
            res.problems.append(Problem("id_out_of_range", f"id {i} is not a candidate (1-{n_candidates})"))
        elif i in ids:
            res.problems.append(Problem("duplicate_id", f"id {i} repeated"))
        else:
            ids.append(i)
    if complexity in BUDGETS and len(ids) > BUDGETS[complexity]:
        res.problems.append(
            Problem("over_budget", f"{len(ids)} ids cut to the {complexity} budget {BUDGETS[complexity]}")
        )
        ids = ids[: BUDGETS[complexity]]
    res.kept_ids = ids
    return res


# --- rule baseline (written from the label definitions, not fitted to data) ----------------------------


def rule_keep(question: str, complexity: str, candidates: list[str]) -> list[int]:
    """Keyword overlap: the question's 1-3 keywords (`heuristic_keywords`, proper nouns left
    out: every candidate of a conversation names the same people) matched by their first five letters
    in each candidate; a candidate sharing one keyword or more is kept, most shared first, within
    `BUDGETS[complexity]`."""
    names = [w.strip("'\".,?!:;()").removesuffix("'s") for w in question.split()[1:] if w[:1].isupper()]
    kws = {stem(w) for k in heuristic_keywords(question, names) for w in k.split()}
    scores = [len(kws & {stem(w) for w in c.split()}) / max(len(kws), 1) for c in candidates]
    ranked = sorted((i for i, s in enumerate(scores, 1) if s > 0), key=lambda i: (-scores[i - 1], i))
    return ranked[: BUDGETS[complexity]]


# --- the compact model ----------------------------------------------------------------------------


def training_rows(inp: dict, label: dict) -> list[dict]:
    """One (question with complexity, candidate) pair per candidate, labelled keep (1.0) or drop (0.0)."""
    kept, query = set(label["kept_ids"]), pair_query(inp["question"], inp["complexity"])
    return [
        {"query": query, "text": c, "label": 1.0 if i in kept else 0.0, "candidate_id": i}
        for i, c in enumerate(inp["candidates"], 1)
    ]


def teacher_requests(inp: dict) -> list[Request]:
    messages = chat_messages(inp["question"], inp["complexity"], inp["candidates"], "teacher")
    return [Request(messages, json_schema(), "gate")]


def read_teacher(texts: list[str], inp: dict) -> Answer:
    res = parse(texts[0], n_candidates=len(inp["candidates"]), complexity=inp["complexity"])
    return Answer(res.ok, {"kept_ids": res.kept_ids} if res.ok else None, res.problems)


def _zero_shot(chat, ex: dict) -> list[int] | None:
    text = chat(chat_messages(ex["question"], ex["complexity"], ex["candidates"]), json_schema(), "gate", 128)
    res = parse(text, n_candidates=len(ex["candidates"]), complexity=ex["complexity"])
    return res.kept_ids if res.ok else None


MODEL = CompactModel(
    name="gate",
    summary="TiMem recall gate (cross-encoder): (question with complexity, candidate memory) -> keep probability; "
    "kept ids under per-complexity budgets; TiMem 3.3",
    head="pair_score",
    unit="gate",
    labels=("keep",),
    rows=training_rows,
    requests=teacher_requests,
    read=read_teacher,
    parse=parse,
    gold_label=lambda g: {"kept_ids": g["kept_ids"]},
    max_tokens=512,
    inputs=lambda row: (need(row, "query"), need(row, "text")),
    decide=lambda probs: probs[0],
    rule=lambda ex: rule_keep(ex["question"], ex["complexity"], ex["candidates"]),
    zero_shot=_zero_shot,
    tuning="budgeted_keep",
    metric="gate_scores",
    dev_metric="ap",
    after=("extractor", "planner"),
)
