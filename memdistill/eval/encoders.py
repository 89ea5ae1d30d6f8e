"""Router, planner, gate, consolidator and topic segmenter on the gold test split, each beside a zero-shot LM,
a rule baseline and the trivial (majority) baseline.

  memdistill eval-encoders --config configs/eval/encoders_cpu.yaml [key=value ...]        (make eval-encoders)
  memdistill eval-encoders --config configs/eval/encoders_cpu.yaml \
      'lm_baseline={base_url: https://api.openai.com/v1, model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}'

Rows: data/built/{router,planner,gate,consolidator,segmenter}/<split>.jsonl (`make data`). Three systems answer the
same rows:
- the trained encoders (exported model dirs, in process; `tests/test_encoder_serving.py` shows the served
  model returns the same scores),
- an LM prompted zero-shot through the SDK's LM path (`MemoryModels.classify_types / plan / gate /
  consolidate_pairs` with the spec's student prompts and JSON Schemas): by default (`lm_baseline: true`)
  the merged extractor when it exists, else the untrained embedded SmolLM2, on one private vLLM server;
  `lm_baseline: {base_url, model, api_key_env, name}` asks any OpenAI-compatible endpoint instead (a
  GPT-4o-mini-class model reproduces MemoType's Table 9 comparison). The table row names the model,
- rules (below), written from the label definitions in the spec, not fitted to data.

Definitions. Router, MemoType Table 9 (appendix B): per type, ACC is the share of snippets whose "this type
is present" decision is right and F1 the binary F1 of that type; overall ACC is the mean of the three
per-type ACC and overall F1 the mean of the three per-type F1, as Table 9 computes its overall columns.
"exact set" is ours and stricter: the share of snippets whose whole label set is right (none = the empty
set); micro F1 pools the three types' decisions. Planner: accuracy and macro-F1 over simple / hybrid /
complex. Gate: keep precision / recall / F1 over all (example, candidate) pairs, and the share of candidate
tokens (whitespace words) removed; gold's share is the reference. Consolidator: action accuracy, macro-F1
and per-action precision / recall over the gold pairs (data/seed/consolidation.jsonl). Segmenter (TraceMem
topic segmentation, data/seed/segments.jsonl): boundary precision / recall / F1 and accuracy over every
utterance but a session's first, Cohen's kappa, and Pk and WindowDiff (lower is better) over the sessions,
beside never cut, always cut and a blind second annotator (data/seed/segments_second.jsonl) scored as one
more system: inter-annotator agreement, the ceiling for a segmenter. Every rate carries a
95% percentile bootstrap interval (1,000 resamples of the task's units: snippets, questions, gate examples,
pairs, sessions); every accuracy sits beside the trivial baseline computed from the gold labels (router: each type's
majority decision, and the most common label set for exact set; planner and consolidator: the majority
class; gate: keep every candidate). An LM answer that does not parse counts as wrong (router: no label and
not an exact set; planner: wrong class; gate: keeps every candidate, as a memory stack would when its gate
fails). Output: runs/eval-encoders/<time>/ with metrics.json, predictions.jsonl, report.md and PNG charts.
"""

from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from memdistill.core.config import ConfigError, env_key, from_mapping, job_config
from memdistill.core.report import (
    bars_of,
    ci_cell,
    draw_grouped_bars,
    grouped_bars,
    md_table,
    print_report,
    pyplot,
    save_figure,
)
from memdistill.metrics.encoders import gate_examples, task_scores
from memdistill.spec import consolidation, memory_type, recall_gate, recall_plan

TASKS = ("router", "planner", "gate", "consolidator", "segmenter")


@dataclass
class LMBaseline:
    """An OpenAI-compatible endpoint that answers the zero-shot baseline instead of the local extractor."""

    base_url: str  # ends in /v1, e.g. https://api.openai.com/v1
    model: str  # the model name the endpoint serves, e.g. gpt-4o-mini
    api_key_env: str | None = None  # the NAME of the environment variable holding the key (never the key)
    name: str | None = None  # how the report's rows name it; default "<model> at <host>"
    qwen3_no_think: bool = False  # send vLLM's chat_template_kwargs (a Qwen3 on vLLM); OpenAI rejects the field


@dataclass
class EncoderEvalConfig:
    data_dir: str = "data/built"
    split: str = "test"
    tasks: list = field(default_factory=lambda: list(TASKS))  # which encoders to evaluate
    router: str | None = "runs/router-cpu/model"  # exported model dirs; a missing one is skipped (reported)
    planner: str | None = "runs/planner-cpu/model"
    gate: str | None = "runs/gate-cpu/model"
    consolidator: str | None = "runs/consolidator-cpu/model"
    segmenter: str | None = "runs/segmenter-cpu/model"
    # A blind second labelling of whole conversations: scored as one more system, it is the agreement between
    # two annotators, the ceiling a segmenter can be read against (null: no such row)
    second_annotator: str | None = "data/seed/segments_second.jsonl"
    lm: str = "runs/extractor-cpu/merged"  # the zero-shot LM when it exists, else fallback_lm
    fallback_lm: str = "embedded:smollm2-135m-instruct"
    # true: the local LM above on a private vLLM server; false: no LM baseline; a mapping
    # {base_url, model, api_key_env, name, qwen3_no_think}: that OpenAI-compatible endpoint (LMBaseline)
    lm_baseline: dict | bool = True
    serve_config: str = "configs/serving/cpu.yaml"  # how the LM's private server runs (gpu.yaml: bf16 on GPUs)
    serve_overrides: list = field(default_factory=list)  # key=value on top of serve_config, e.g. [replicas=1]
    max_model_len: int = 4096  # the LM server's context (questions and snippets are short)
    structured: bool = True  # constrain the LM to the spec's JSON Schema, as SDK clients do
    concurrency: int = 16
    max_examples: int | None = None  # per task (quick runs); gate: whole examples
    write_cards: bool = True  # put the test figures into each exported model's card
    output_dir: str = "runs/eval-encoders"

    def __post_init__(self):
        if isinstance(self.lm_baseline, dict):
            self.lm_baseline = from_mapping(LMBaseline, self.lm_baseline, "lm_baseline")
        elif not isinstance(self.lm_baseline, (bool, LMBaseline)):
            raise ConfigError(f"lm_baseline should be true, false or a mapping with base_url and model, "
                              f"got {self.lm_baseline!r}")  # fmt: skip


# --- rule baselines ---------------------------------------------------------------------------------

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


def rule_router(snippet: str) -> list[str]:
    """EM: a time expression (date, weekday, month, yesterday, last/next ...). PM: a first-person lasting
    fact (I'm, I love/prefer/always, my <relative/job/pet>). GM: a non-first-person explanatory or advice
    sentence (usually, for example, you can, recommend ...) of at least 12 words."""
    text = memory_type.encoder_text(snippet)
    body = text.split(":", 1)[1] if re.match(r"^[\w .'-]{1,30}:", text) else text
    labels = []
    if _TIME.search(body):
        labels.append("EM")
    if _FIRST_PERSON_FACT.search(body):
        labels.append("PM")
    if _GENERAL.search(body) and len(body.split()) >= 12:
        labels.append("GM")
    return labels


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


def rule_planner(question: str) -> str:
    """complex: hypotheticals or judgement words (would/could/should, likely, enjoy, prefer, recommend,
    why, changed/grown/trend ...); hybrid: gathering words (how many/often, list, both, all, compare,
    '... and why/how'); otherwise simple."""
    if _COMPLEX.search(question):
        return "complex"
    if _HYBRID.search(question):
        return "hybrid"
    return "simple"


def _stem(w: str) -> str:
    return w.lower().strip("'\".,?!:;()")[:5]


def rule_gate(question: str, complexity: str, candidates: list[str]) -> list[int]:
    """Keyword overlap: the question's 1-3 keywords (`recall_plan.heuristic_keywords`, proper nouns left
    out: every candidate of a conversation names the same people) matched by their first five letters
    in each candidate; a candidate sharing one keyword or more is kept, most shared first, within
    `recall_gate.BUDGETS[complexity]`."""
    names = [w.strip("'\".,?!:;()").removesuffix("'s") for w in question.split()[1:] if w[:1].isupper()]
    kws = {_stem(w) for k in recall_plan.heuristic_keywords(question, names) for w in k.split()}
    scores = [len(kws & {_stem(w) for w in c.split()}) / max(len(kws), 1) for c in candidates]
    ranked = sorted((i for i, s in enumerate(scores, 1) if s > 0), key=lambda i: (-scores[i - 1], i))
    return ranked[: recall_gate.BUDGETS[complexity]]


def rule_consolidator(row: dict) -> str:
    """`consolidation.rule_action` on the pair (word overlap and dimensions only, no model)."""
    return consolidation.rule_action(*_pair(row))


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


def rule_segmenter(row: dict) -> bool:
    """CHANGE on a topic-shift cue ("by the way", "anyway", "speaking of", ...) or when the utterance (4+
    content words) shares no content word with the two before it: lexical cohesion, as TextTiling
    measures it, at its simplest."""
    target = row["target"].split(": ", 1)[-1]
    if _TOPIC_CUE.search(target):
        return True

    def words(line: str) -> set[str]:
        return {_stem(w) for w in line.split(": ", 1)[-1].split() if len(w) > 3 and w.lower() not in _FUNCTION}

    cur = words(row["target"])
    return len(cur) >= 4 and not cur & set().union(*map(words, row["before"]))


def _pair(row: dict):
    return consolidation.StoredRecord.from_json(row["new"]), consolidation.StoredRecord.from_json(row["existing"])


# --- the job ----------------------------------------------------------------------------------------


def load_split(cfg: EncoderEvalConfig, task: str) -> list[dict]:
    from memdistill.train.encoder import read_rows

    rows = read_rows(str(Path(cfg.data_dir) / task / f"{cfg.split}.jsonl"), task)
    if cfg.max_examples and task != "gate":
        rows = rows[: cfg.max_examples]
    elif cfg.max_examples:
        keep = list(dict.fromkeys(r["gate_id"] for r in rows))[: cfg.max_examples]
        rows = [r for r in rows if r["gate_id"] in set(keep)]
    return rows


def encoder_predictions(task: str, model_dir: str, rows: list[dict]):
    """Decisions of the exported encoder, made exactly as the SDK makes them from served scores."""
    from memdistill.train.encoder import Encoder

    enc = Encoder(model_dir)
    t0 = time.time()
    if task == "router":
        pred = enc.classify_types([r["text"] for r in rows])
    elif task == "planner":
        pred = enc.complexity([r["text"] for r in rows])
    elif task == "consolidator":
        pred = enc.actions([_pair(r) for r in rows])
    elif task == "segmenter":
        pred = enc.changes([r["text"] for r in rows])
    else:
        pred = [
            recall_gate.select(enc.keep_scores(e["question"], e["complexity"], e["candidates"]), e["complexity"])
            for e in gate_examples(rows)
        ]
    return pred, time.time() - t0


def rule_predictions(task: str, rows: list[dict]):
    t0 = time.time()
    if task == "router":
        pred = [rule_router(r["text"]) for r in rows]
    elif task == "planner":
        pred = [rule_planner(r["text"]) for r in rows]
    elif task == "consolidator":
        pred = [rule_consolidator(r) for r in rows]
    elif task == "segmenter":
        pred = [rule_segmenter(r) for r in rows]
    else:
        pred = [rule_gate(e["question"], e["complexity"], e["candidates"]) for e in gate_examples(rows)]
    return pred, time.time() - t0


SECOND = "second annotator (blind)"


def second_annotator_predictions(path: str, rows: list[dict]) -> tuple[list[bool] | None, str]:
    """The second labelling's decision on every gold row, or (None, why) where it does not cover them all."""
    from memdistill.core.io import load_jsonl

    if not Path(path).exists():
        return None, f"no file {path}"
    changes = {(r["conversation_id"], r["session_id"]): set(r["change_turn_ids"]) for r in load_jsonl(path)}
    missing = sorted({f"{r['conversation_id']} {r['session_id']}" for r in rows} - {" ".join(k) for k in changes})
    if missing:
        return None, f"{path} does not label {len(missing)} session(s) of the split, e.g. {missing[0]}"
    return [r["turn_id"] in changes[(r["conversation_id"], r["session_id"])] for r in rows], ""


def lm_predictions(mm, task: str, rows: list[dict], concurrency: int):
    from tqdm import tqdm

    t0 = time.time()
    if task == "router":
        res = mm.classify_types([r["text"] for r in rows])
        return [r.labels for r in res], time.time() - t0
    if task == "consolidator":
        res = mm.consolidate_pairs([_pair(r) for r in rows])
        return [r.action if r.ok else None for r in res], time.time() - t0
    items = rows if task in ("planner", "segmenter") else gate_examples(rows)

    def one(x):
        if task == "segmenter":
            d = mm.topic_change(x["before"], x["target"], x["after"])
            return d.change if d.ok else None
        if task == "planner":
            p = mm.plan(x["text"])
            return p.plan.complexity if p.ok else None
        g = mm.gate(x["question"], x["complexity"], x["candidates"])
        return g.kept_ids if g.ok else None

    with ThreadPoolExecutor(concurrency) as pool:
        pred = list(tqdm(pool.map(one, items), total=len(items), desc=f"LM {task}", unit="ex"))
    return pred, time.time() - t0


def resolve_lm(cfg: EncoderEvalConfig) -> str:
    from memdistill.core.models import model_path

    return cfg.lm if (Path(cfg.lm) / "config.json").exists() else model_path(cfg.fallback_lm)


def _short(name: str) -> str:
    return name.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]


def local_lm_name(cfg: EncoderEvalConfig, path: str) -> str:
    """What the local LM is, for the report's rows: the base model and whether the LoRA extractor is on it."""
    from memdistill.core.models import read_meta

    if (Path(path) / "memdistill.json").exists():
        return f"{_short(read_meta(path)['base_model'])} LoRA extractor, local vLLM"
    return f"{_short(cfg.lm if path == cfg.lm else cfg.fallback_lm)} base model, local vLLM"


@contextmanager
def zero_shot_lm(cfg: EncoderEvalConfig, out: Path):
    """(SDK client on the zero-shot baseline's endpoint, the row name, what answered) for the run's length:
    the endpoint named in `lm_baseline`, or the local LM on a private vLLM server."""
    from memdistill.serve.client import MemoryModels

    common = {"structured": cfg.structured, "max_concurrency": cfg.concurrency, "timeout": 600}
    b = cfg.lm_baseline
    if isinstance(b, LMBaseline):
        key = env_key(b.api_key_env, "lm_baseline (api_key_env)")
        name = b.name or f"{b.model} at {urlparse(b.base_url).netloc}"
        mm = MemoryModels(b.base_url, api_key=key, model=b.model, qwen3_no_think=b.qwen3_no_think, **common)
        yield mm, f"LM zero-shot ({name})", {"base_url": b.base_url, "model": b.model}
        return
    from memdistill.eval.generate import private_serve_config
    from memdistill.serve.server import Servers

    lm = resolve_lm(cfg)
    scfg = private_serve_config(cfg.serve_config, lm, cfg.max_model_len, cfg.serve_overrides)
    with Servers(scfg, log_dir=str(out / "vllm-logs")) as servers:
        mm = MemoryModels([f"{u}/v1" for u in servers.urls], **common)
        yield mm, f"LM zero-shot ({local_lm_name(cfg, lm)})", {"model": lm, "served_by": cfg.serve_config}


def run(cfg: EncoderEvalConfig) -> Path:
    unknown = [t for t in cfg.tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"tasks: unknown {unknown}; expected some of {TASKS}")
    tasks = [t for t in TASKS if t in cfg.tasks]
    out = Path(cfg.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    rows = {t: load_split(cfg, t) for t in tasks}
    preds: dict = {t: {} for t in tasks}
    seconds: dict = {t: {} for t in tasks}
    skipped = []
    for t in tasks:
        model_dir = getattr(cfg, t)
        if model_dir and (Path(model_dir) / "config.json").exists():
            preds[t]["encoder"], seconds[t]["encoder"] = encoder_predictions(t, model_dir, rows[t])
        else:
            skipped.append(f"{t} encoder: no exported model at {model_dir} (run `make train-{t}`)")
        preds[t]["rules"], seconds[t]["rules"] = rule_predictions(t, rows[t])
    if "segmenter" in tasks and cfg.second_annotator:
        flags, why = second_annotator_predictions(cfg.second_annotator, rows["segmenter"])
        if flags is None:
            skipped.append(f"segmenter second annotator: {why}")
        else:
            preds["segmenter"][SECOND], seconds["segmenter"][SECOND] = flags, 0.0
    lm = None
    if cfg.lm_baseline:
        with zero_shot_lm(cfg, out) as (mm, name, answered_by):
            for t in tasks:
                preds[t][name], seconds[t][name] = lm_predictions(mm, t, rows[t], cfg.concurrency)
        lm = {"row": name, **answered_by}
    results = {
        t: {name: {**task_scores(t, p, rows[t]), "seconds": round(seconds[t][name], 2)} for name, p in preds[t].items()}
        for t in tasks
    }
    meta = {
        "split": cfg.split,
        "data_dir": cfg.data_dir,
        "lm": lm,
        "models": {t: getattr(cfg, t) for t in tasks},
        "skipped": skipped,
    }
    (out / "metrics.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    with (out / "predictions.jsonl").open("w") as f:
        for t in tasks:
            ids = (
                [r.get("snippet_id") or r.get("question_id") or r.get("pair_id") or _decision_id(r) for r in rows[t]]
                if t != "gate"
                else [e["gate_id"] for e in gate_examples(rows[t])]
            )
            for name, p in preds[t].items():
                for i, x in zip(ids, p):
                    f.write(json.dumps({"task": t, "system": name, "id": i, "prediction": x}) + "\n")
    write_report(out, results, meta)
    if cfg.write_cards:
        from memdistill.train.encoder import write_card

        for t in tasks:
            if "encoder" in results[t] and (Path(getattr(cfg, t)) / "memdistill.json").exists():
                write_card(
                    getattr(cfg, t),
                    {
                        "split": cfg.split,
                        "source": str(out / "metrics.json"),
                        **{k: v for k, v in results[t]["encoder"].items() if k != "seconds"},
                    },
                )
    return out


def write_report(out: Path, results: dict, meta: dict) -> None:
    lm = meta["lm"]
    L = [
        f"# Encoders on the gold {meta['split']} split",
        "",
        f"Rows from `{meta['data_dir']}/<task>/{meta['split']}.jsonl`. "
        + (
            f"{lm['row']}: `{lm['model']}` "
            + (f"at {lm['base_url']}" if "base_url" in lm else f"served by vLLM ({lm['served_by']})")
            + ", prompted through the SDK's LM path (the spec's student prompts, JSON Schema). "
            if lm
            else "No LM baseline (lm_baseline: false). "
        )
        + "Rules: `memdistill/eval/encoders.py`. Brackets: 95% bootstrap intervals (1,000 resamples of the "
        "task's units). Trivial baselines come from the gold labels alone.",
        "",
    ]
    L += [f"Skipped: {s}" for s in meta["skipped"]] + ([""] if meta["skipped"] else [])
    for task, section in (
        ("router", router_section),
        ("planner", planner_section),
        ("gate", gate_section),
        ("consolidator", consolidator_section),
        ("segmenter", segmenter_section),
    ):
        if results.get(task):
            L += section(results[task])
    L += ["![router](router.png)", ""] if "router" in results else []
    L += ["![planner and gate](planner_gate.png)", ""] if {"planner", "gate"} <= set(results) else []
    L += ["![consolidator](consolidator.png)", ""] if "consolidator" in results else []
    L += ["![segmenter](segmenter.png)", ""] if "segmenter" in results else []
    (out / "report.md").write_text("\n".join(L))
    charts(out, results, meta)


def _ci(s: dict, key: str, scale: float = 1, digits: int = 4) -> str:
    """A figure with its interval: `value [low, high]`."""
    return ci_cell(s[key] * scale, [x * scale for x in s[f"{key}_ci95"]], f".{digits}f")


def _trivial(name: str, figures: list[float], width: int) -> list[str]:
    """A trivial baseline's table row: its figures (no interval: they are fixed by the gold labels), then '–'."""
    return [name, *(f"{x:.4f}" for x in figures)] + ["–"] * (width - 1 - len(figures))


def router_section(r: dict) -> list[str]:
    labs = memory_type.LABELS
    first = next(iter(r.values()))
    base = first["majority_baseline"]
    L = [
        "## Type router (MemoType Table 9 layout, plus exact set)",
        "",
        "Per type (MemoType Table 9): ACC = share of snippets whose 'this type is present' decision is right, "
        "F1 = binary F1 of that type. Overall ACC = mean of the three per-type ACC and overall F1 = mean of the "
        "three per-type F1, as Table 9 computes its overall columns (MemoType's BERT router: 92.10 / 91.75). "
        "Exact set (ours, stricter): share of snippets whose whole label set is right (none = the empty set). "
        "Micro F1 pools the three types' decisions. Values in %.",
        "",
    ]

    def row(name, s):
        return (
            [name, _ci(s["overall"], "acc", 100, 2), _ci(s["overall"], "f1", 100, 2)]
            + [_ci(s[lab], m, 100, 2) for lab in labs for m in ("acc", "f1")]
            + [_ci(s["overall"], "exact_set", 100, 2), _ci(s["overall"], "micro_f1", 100, 2)]
            + [_ci(s, "valid_rate", 100, 2), s["seconds"]]
        )

    types, top = "+".join(base["labels"]) or "none", "+".join(base["exact_set_labels"]) or "none"
    trivial = (
        [f"majority (per type: {types}; set: {top})"]
        + [f"{100 * base['overall']['acc']:.2f}", "–"]
        + [x for lab in labs for x in (f"{100 * base[lab]['acc']:.2f}", "–")]
        + [f"{100 * base['overall']['exact_set']:.2f}", "–", "–", "–"]
    )
    L += md_table(
        ["system", "overall ACC", "overall F1"]
        + [f"{lab} {m}" for lab in labs for m in ("ACC", "F1")]
        + ["exact set", "micro F1", "valid", "seconds"],
        [row(name, s) for name, s in r.items()] + [trivial],
    )
    return L + ["", f"{first['n']} snippets.", ""]


def planner_section(p: dict) -> list[str]:
    cs = recall_plan.COMPLEXITIES
    first = next(iter(p.values()))
    base = first["majority_baseline"]
    L = ["## Recall planner", ""]
    L += md_table(
        ["system", "accuracy", "macro-F1"] + [f"F1 {c}" for c in cs] + ["valid", "seconds"],
        [
            [name, _ci(s, "accuracy"), _ci(s, "macro_f1"), *(_ci(s["f1"], c) for c in cs), _ci(s, "valid_rate")]
            + [s["seconds"]]
            for name, s in p.items()
        ]
        + [_trivial(f"majority (always {base['label']})", [base["accuracy"], base["macro_f1"]], len(cs) + 4)],
    )
    return L + ["", f"{first['n']} questions.", ""]


def gate_section(gate: dict) -> list[str]:
    g = next(iter(gate.values()))
    base = g["keep_all_baseline"]
    cols = ["keep_precision", "keep_recall", "keep_f1", "tokens_removed_share", "kept_per_example", "valid_rate"]
    L = [
        "## Recall gate",
        "",
        f"Selection: `recall_gate.select` with the project's flat keep caps {recall_gate.BUDGETS} per complexity "
        "(our choice, not TiMem's per-level budgets). Token share over whitespace words of all candidates.",
        "",
    ]
    L += md_table(
        ["system", "keep precision", "keep recall", "keep F1", "tokens removed", "kept / example", "valid", "seconds"],
        [[name, *(_ci(s, c) for c in cols), s["seconds"]] for name, s in gate.items()]
        + [_trivial("keep all (no gate)", [base[c] for c in cols[:4]], len(cols) + 2)],
    )
    return L + [
        "",
        f"{g['examples']} examples (the bootstrap's units), {g['candidates']} candidates; "
        f"gold keeps remove {_ci(g, 'gold_tokens_removed_share')} of the tokens.",
        "",
    ]


def consolidator_section(c: dict) -> list[str]:
    first = next(iter(c.values()))
    base = first["majority_baseline"]
    acts = consolidation.ACTIONS
    L = [
        "## Memory-update consolidator (DimMem DA-Update)",
        "",
        f"{first['n']} gold pairs; gold shares {first['gold_share']}. Trivial baseline (always "
        f"{base['action']}): accuracy {base['accuracy']}, macro-F1 {base['macro_f1']}. "
        "An unreadable LM answer is wrong.",
        "",
    ]
    L += md_table(
        ["system", "accuracy", "macro-F1"] + [f"{a} P / R" for a in acts] + ["valid", "seconds"],
        [
            [name, _ci(s, "accuracy"), _ci(s, "macro_f1")]
            + [f"{_ci(s['per_action'][a], 'precision')} / {_ci(s['per_action'][a], 'recall')}" for a in acts]
            + [_ci(s, "valid_rate"), s["seconds"]]
            for name, s in c.items()
        ]
        + [_trivial(f"majority (always {base['action']})", [base["accuracy"], base["macro_f1"]], len(acts) + 4)],
    )
    return L + [""]


def segmenter_section(c: dict) -> list[str]:
    first = next(iter(c.values()))
    keys = ["precision", "recall", "f1", "accuracy", "kappa", "pk", "windowdiff"]
    L = [
        "## Topic segmenter (TraceMem CHANGE_TOPIC / DEVELOP_TOPIC)",
        "",
        f"{first['sessions']} gold sessions, {first['decisions']} decisions (every utterance but a session's "
        f"first), {first['gold_change_share']:.1%} of them topic changes. Boundary precision / recall / F1, "
        "accuracy and Cohen's kappa over decisions; Pk and WindowDiff over sessions (error rates: lower is "
        "better; probe = half the mean gold episode). An unreadable LM answer is no cut."
        + (
            f' The row "{SECOND}" holds another labelling of the same sessions, written without seeing the '
            "gold one and scored the same way: how far two annotators agree, the ceiling for a segmenter."
            if SECOND in c
            else ""
        ),
        "",
    ]
    L += md_table(
        [
            "system",
            "boundary P",
            "boundary R",
            "boundary F1",
            "accuracy",
            "kappa",
            "Pk",
            "WindowDiff",
            "valid",
            "seconds",
        ],
        [[name] + [_ci(s, k) for k in keys] + [_ci(s, "valid_rate"), s["seconds"]] for name, s in c.items()]
        + [
            _trivial(label, [first[b][k] for k in keys], 10)
            for label, b in (("never cut (majority)", "never_cut_baseline"), ("always cut", "always_cut_baseline"))
        ],
    )
    return L + [""]


def _decision_id(row: dict) -> str | None:
    return f"{row['conversation_id']}/{row['turn_id']}" if "turn_id" in row else None


def charts(out: Path, results: dict, meta: dict) -> None:
    if "router" in results:
        cols = ["overall ACC", "overall F1"] + [f"{lab} {m}" for lab in memory_type.LABELS for m in ("acc", "F1")]
        grouped_bars(
            out / "router.png",
            {
                name: [s["overall"]["acc"], s["overall"]["f1"]]
                + [s[lab][m] for lab in memory_type.LABELS for m in ("acc", "f1")]
                + [s["overall"]["exact_set"]]
                for name, s in results["router"].items()
            },
            cols + ["exact set"],
            f"type router, gold {meta['split']} split",
            size=(9, 3.8),
        )
    if {"planner", "gate"} <= set(results):
        fig, axes = pyplot().subplots(1, 2, figsize=(10, 3.8))
        for ax, (task, keys) in zip(
            axes,
            (
                ("planner", ["accuracy", "macro_f1"]),
                ("gate", ["keep_precision", "keep_recall", "keep_f1", "tokens_removed_share"]),
            ),
        ):
            values, intervals = bars_of(results[task], keys)
            draw_grouped_bars(ax, values, keys, task, rotation=15, intervals=intervals)
        save_figure(fig, out / "planner_gate.png")
    if "consolidator" in results:
        grouped_bars(
            out / "consolidator.png",
            {
                name: [s["accuracy"], s["macro_f1"]] + [s["per_action"][a]["f1"] for a in consolidation.ACTIONS]
                for name, s in results["consolidator"].items()
            },  # fmt: skip
            ["accuracy", "macro-F1"] + [f"F1 {a}" for a in consolidation.ACTIONS],
            f"consolidator, gold {meta['split']} split",
        )
    if "segmenter" in results:
        keys = ["precision", "recall", "f1", "kappa", "pk", "windowdiff"]
        values, intervals = bars_of(results["segmenter"], keys)
        grouped_bars(
            out / "segmenter.png",
            values,
            ["boundary P", "boundary R", "boundary F1", "kappa", "Pk (lower better)", "WindowDiff (lower better)"],
            f"topic segmenter, gold {meta['split']} split",
            intervals=intervals,
        )


def main(argv=None) -> int:
    return print_report(run(job_config(EncoderEvalConfig, argv, "memdistill eval-encoders", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
