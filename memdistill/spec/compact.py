"""The record every compact model states once, in its spec module (`MODEL = CompactModel(...)`).

A record says what a model is called, what it reads and writes, how its probabilities become a decision,
how a labelled item becomes training rows, how a teacher is asked for a label and how the answer is read,
and which metric grades it. Data building, teacher labelling, encoder training, evaluation and the SDK
loop over `memdistill.spec.MODELS` and ask the record; none of them names a model in an `if`.

Heads:
- `lm`          the causal LM writes JSON (extractor, query parser: one adapter, two tasks)
- `multi_label` one sigmoid per label, BCE; no label = none (router)
- `softmax`     one label, argmax (planner, consolidator, segmenter, query typer)
- `pair_score`  a cross-encoder over (query, text) with one keep logit, BCE (gate; served on `/score`)

Units (the kind of labelled item, the same for the gold corpus and the teacher jobs):
`window` (dialogue window), `question`, `snippet` (one turn or two), `gate` (a question with candidate
memories), `pair` (a new and an existing record), `utterance` (one turn with its context), `node` (a
memory-tree window with its child memories and the previous nodes of its level).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

HEADS = ("lm", "multi_label", "softmax", "pair_score")
UNITS = ("window", "question", "snippet", "gate", "pair", "utterance", "node")


@dataclass(frozen=True)
class Request:
    """One chat request to the teacher: messages, the JSON Schema of the answer, and its name."""

    messages: list[dict]
    schema: dict
    name: str


@dataclass
class Answer:
    """A teacher's replies read by the model's parser: the label (None when unusable) and the problems."""

    ok: bool
    label: dict | None
    problems: list = field(default_factory=list)


@dataclass(frozen=True)
class CompactModel:
    name: str  # the one name: CLI, make targets, configs, built sets, teacher jobs, reports
    summary: str  # one line: what it answers, from which paper (model cards, docs, `memdistill models`)
    head: str  # one of HEADS
    unit: str  # one of UNITS: what one labelled item is
    rows: Callable[..., list[dict]]  # (item input, label, **options) -> training rows
    requests: Callable[[dict], list[Request]]  # item input -> the teacher's requests
    read: Callable[[list[str], dict], Answer]  # (reply texts, item input) -> the label
    gold_label: Callable[[dict], dict]  # a gold corpus row of its unit -> the label, as a teacher's
    parse: Callable  # an LM's raw answer -> ParseResult (never raises); the extractor's also takes the window
    labels: tuple[str, ...] = ()  # the encoder's id2label (empty for the LM)
    training_set: str = ""  # data/built/<training_set>/; "" = its own name (the query parser shares the extractor's)
    max_tokens: int | None = None  # cap on the teacher's answer (None: the teacher's own max_tokens)
    inputs: Callable[[dict], tuple] | None = None  # a built row -> what the encoder reads: (text,) or (query, text)
    decide: Callable | None = None  # one input's served probabilities -> the decision
    # the rule baseline: one item (a built row; the gate: an example) -> a decision, written from the label
    # definitions and never fitted to data
    rule: Callable[[dict], object] | None = None
    # the zero-shot LM baseline: (chat, item) -> a decision (None: unreadable), asked with the student prompt;
    # chat(messages, schema, name, max_tokens) returns the LM's text (the SDK's `MemoryModels.chat`)
    zero_shot: Callable[[Callable, dict], object] | None = None
    metric: str = ""  # the function of memdistill.metrics.encoders that grades decisions against built rows
    dev_metric: str = ""  # the threshold-free dev figure that picks the best epoch
    # how its decision threshold is tuned on dev and folded into the head (memdistill.train.encoder.TUNING):
    # "per_label" (one cut per sigmoid), "budgeted_keep" (one cut under the selection budgets), "change_cut"
    # (the cut on P(label 1) of a two-way softmax), "" (argmax, nothing tuned)
    tuning: str = ""
    labelled_by: str | None = None  # its label is this model's vote over the row's memories (cast at training)
    after: tuple[str, ...] = ()  # teacher jobs whose labels its items are built from

    @property
    def built(self) -> str:
        return self.training_set or self.name

    @property
    def encoder(self) -> bool:
        return self.head != "lm"

    @property
    def softmax(self) -> bool:
        return self.head == "softmax"

    @property
    def problem_type(self) -> str:
        """transformers' problem_type: BCE for the sigmoid heads (one label alone would mean MSE regression)."""
        return "single_label_classification" if self.softmax else "multi_label_classification"

    @property
    def endpoint(self) -> str:
        """The vLLM pooling endpoint that serves it."""
        return "/score" if self.head == "pair_score" else "/classify"

    def target(self, row: dict, where: str):
        """The training target of one built row, checked against the label set."""
        if self.head == "multi_label":
            labels = need(row, "labels", where)
            unknown = [x for x in labels if x not in self.labels]
            if unknown:
                raise ValueError(f"{where}: labels {unknown} are not in {self.labels}")
            return [1.0 if lab in labels else 0.0 for lab in self.labels]
        label = need(row, "label", where)
        if self.softmax:
            if label not in self.labels:
                raise ValueError(f"{where}: label {label!r} is not one of {self.labels}")
            return self.labels.index(label)
        if label not in (0, 1, 0.0, 1.0):
            raise ValueError(f"{where}: label {label!r} should be 0 or 1")
        return [float(label)]


def need(row: dict, key: str, where: str = "row"):
    """row[key], or a ValueError naming where the row came from."""
    if key not in row:
        raise ValueError(f"{where}: missing field {key!r}")
    return row[key]
