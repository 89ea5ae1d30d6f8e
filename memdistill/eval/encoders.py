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

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from memdistill.core.config import ConfigError, env_key, from_mapping, job_config
from memdistill.core.io import write_json, write_jsonl
from memdistill.core.report import (
    bars_of,
    grouped_bars,
    md_table,
    print_report,
    rate_cell,
    run_dir,
)
from memdistill.metrics.encoders import decisions, gate_examples, score
from memdistill.spec import ENCODERS, MODELS, consolidator, router
from memdistill.spec import gate as gate_spec


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
    tasks: list = field(default_factory=lambda: list(ENCODERS))  # which encoders to evaluate
    # model name -> its exported directory; a missing one is skipped (reported). The query typer's rows are
    # labelled by the vote of the router named here (as `make train-querytyper` labels them).
    models: dict = field(default_factory=lambda: {n: f"runs/{n}-cpu/model" for n in ENCODERS})
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


# --- the job ----------------------------------------------------------------------------------------


def load_split(cfg: EncoderEvalConfig, task: str) -> list[dict]:
    from memdistill.train.encoder import read_rows

    m = MODELS[task]
    voter = cfg.models.get(m.labelled_by) if m.labelled_by else None
    rows = read_rows(str(Path(cfg.data_dir) / task / f"{cfg.split}.jsonl"), task, label_router=voter)
    if cfg.max_examples and m.head != "pair_score":
        rows = rows[: cfg.max_examples]
    elif cfg.max_examples:
        keep = list(dict.fromkeys(r["gate_id"] for r in rows))[: cfg.max_examples]
        rows = [r for r in rows if r["gate_id"] in set(keep)]
    return rows


def items(task: str, rows: list[dict]) -> list[dict]:
    """What a decision is made on: the built rows, or the gate's examples (a question with its candidates)."""
    return gate_examples(rows) if MODELS[task].head == "pair_score" else rows


def encoder_predictions(task: str, model_dir: str, rows: list[dict]):
    """Decisions of the exported encoder, made exactly as the SDK makes them from served scores."""
    from memdistill.core.encoder import Encoder
    from memdistill.train.encoder import model_inputs

    enc = Encoder(model_dir)
    t0 = time.time()
    pred = decisions(task, enc.scores([model_inputs(task, r) for r in rows]), rows)
    return pred, time.time() - t0


def rule_predictions(task: str, rows: list[dict]):
    """The spec's rule baseline on every item."""
    t0 = time.time()
    return [MODELS[task].rule(x) for x in items(task, rows)], time.time() - t0


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
    """The spec's zero-shot LM baseline on every item, through the SDK's chat (student prompt, JSON Schema)."""
    from tqdm import tqdm

    m, xs = MODELS[task], items(task, rows)

    def chat(*args):
        return mm.chat(*args)[0]

    t0 = time.time()
    with ThreadPoolExecutor(concurrency) as pool:
        pred = list(tqdm(pool.map(lambda x: m.zero_shot(chat, x), xs), total=len(xs), desc=f"LM {task}", unit="ex"))
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


def predictions(cfg: EncoderEvalConfig, task: str, rows: list[dict], skipped: list[str]) -> tuple[dict, dict]:
    """(system -> decisions, system -> seconds) for the trained encoder, the rule and, for the segmenter, the
    blind second annotator; what cannot answer is named in `skipped`."""
    preds, seconds = {}, {}
    model_dir = cfg.models.get(task)
    if model_dir and (Path(model_dir) / "config.json").exists():
        preds["encoder"], seconds["encoder"] = encoder_predictions(task, model_dir, rows)
    else:
        skipped.append(f"{task} encoder: no exported model at {model_dir} (run `make train-{task}`)")
    if MODELS[task].rule:
        preds["rules"], seconds["rules"] = rule_predictions(task, rows)
    if MODELS[task].tuning == "change_cut" and cfg.second_annotator:
        flags, why = second_annotator_predictions(cfg.second_annotator, rows)
        if flags is None:
            skipped.append(f"{task} second annotator: {why}")
        else:
            preds[SECOND], seconds[SECOND] = flags, 0.0
    return preds, seconds


def _tasks(cfg: EncoderEvalConfig, skipped: list[str]) -> list[str]:
    unknown = [t for t in cfg.tasks if t not in ENCODERS]
    if unknown:
        raise ValueError(f"tasks: unknown {unknown}; expected some of {ENCODERS}")
    unknown = sorted(set(cfg.models) - set(ENCODERS))
    if unknown:
        raise ConfigError(f"models: unknown {unknown}; expected some of {ENCODERS}")
    tasks = []
    for t in (t for t in ENCODERS if t in cfg.tasks):
        voter = MODELS[t].labelled_by
        if voter and not (Path(cfg.models.get(voter) or "") / "config.json").exists():
            skipped.append(f"{t}: its rows are labelled by the {voter}'s vote and no {voter} is exported")
        else:
            tasks.append(t)
    return tasks


def run(cfg: EncoderEvalConfig) -> Path:
    skipped: list[str] = []
    tasks = _tasks(cfg, skipped)
    out = run_dir(cfg.output_dir)
    rows = {t: load_split(cfg, t) for t in tasks}
    preds, seconds = {}, {}
    for t in tasks:
        preds[t], seconds[t] = predictions(cfg, t, rows[t], skipped)
    lm = None
    if cfg.lm_baseline:
        with zero_shot_lm(cfg, out) as (mm, name, answered_by):
            for t in (t for t in tasks if MODELS[t].zero_shot):
                preds[t][name], seconds[t][name] = lm_predictions(mm, t, rows[t], cfg.concurrency)
        lm = {"row": name, **answered_by}
    results = {
        t: {name: {**score(t, p, rows[t]), "seconds": round(seconds[t][name], 2)} for name, p in preds[t].items()}
        for t in tasks
    }
    meta = {
        "split": cfg.split,
        "data_dir": cfg.data_dir,
        "lm": lm,
        "models": {t: cfg.models.get(t) for t in tasks},
        "skipped": skipped,
    }
    write_json(out / "metrics.json", {**meta, "results": results})
    write_jsonl(out / "predictions.jsonl", _prediction_rows(tasks, rows, preds))
    write_report(out, results, meta)
    if cfg.write_cards:
        _write_cards(cfg, tasks, results, out)
    return out


def _prediction_rows(tasks: list[str], rows: dict, preds: dict) -> list[dict]:
    out = []
    for t in tasks:
        ids = [x.get("gate_id") or x.get("snippet_id") or x.get("question_id") or x.get("pair_id") or _decision_id(x)
               for x in items(t, rows[t])]  # fmt: skip
        out += [
            {"task": t, "system": name, "id": i, "prediction": x}
            for name, p in preds[t].items()
            for i, x in zip(ids, p)
        ]
    return out


def _write_cards(cfg: EncoderEvalConfig, tasks: list[str], results: dict, out: Path) -> None:
    from memdistill.train.encoder import write_card

    for t in tasks:
        model_dir = cfg.models.get(t)
        if "encoder" in results[t] and (Path(model_dir) / "memdistill.json").exists():
            figures = {k: v for k, v in results[t]["encoder"].items() if k != "seconds"}
            write_card(model_dir, {"split": cfg.split, "source": str(out / "metrics.json"), **figures})


def write_report(out: Path, results: dict, meta: dict) -> None:
    lm = meta["lm"]
    L = [
        f"# Encoders on the gold {meta['split']} split",
        "",
        f"Rows from `{meta['data_dir']}/<model>/{meta['split']}.jsonl`. "
        + (
            f"{lm['row']}: `{lm['model']}` "
            + (f"at {lm['base_url']}" if "base_url" in lm else f"served by vLLM ({lm['served_by']})")
            + ", prompted through the SDK's LM path (the spec's student prompts, JSON Schema). "
            if lm
            else "No LM baseline (lm_baseline: false). "
        )
        + "Rules: each model's `rule` in its spec module (`memdistill/spec/`). Brackets: 95% bootstrap "
        "intervals (1,000 resamples of the task's units). Trivial baselines come from the gold labels alone.",
        "",
    ]
    L += [f"Skipped: {s}" for s in meta["skipped"]] + ([""] if meta["skipped"] else [])
    for task, r in results.items():
        if r:
            L += SECTIONS[MODELS[task].metric](task, r) + [f"![{task}]({task}.png)", ""]
    (out / "report.md").write_text("\n".join(L))
    charts(out, results, meta)


def _cell(s: dict, key: str) -> str:
    return rate_cell(s, key, 1, ".4f", None)


def _trivial(name: str, figures: list[float], width: int) -> list[str]:
    """A trivial baseline's table row: its figures (no interval: they are fixed by the gold labels), then '–'."""
    return [name, *(f"{x:.4f}" for x in figures)] + ["–"] * (width - 1 - len(figures))


def router_section(task: str, r: dict) -> list[str]:
    labs = router.LABELS
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
            [name, rate_cell(s["overall"], "acc", 100, ".2f", None), rate_cell(s["overall"], "f1", 100, ".2f", None)]
            + [rate_cell(s[lab], m, 100, ".2f", None) for lab in labs for m in ("acc", "f1")]
            + [
                rate_cell(s["overall"], "exact_set", 100, ".2f", None),
                rate_cell(s["overall"], "micro_f1", 100, ".2f", None),
            ]
            + [rate_cell(s, "valid_rate", 100, ".2f", None), s["seconds"]]
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


def class_section(task: str, p: dict) -> list[str]:
    """A single-label model (planner, query typer): accuracy, macro-F1 and F1 per class."""
    cs = MODELS[task].labels
    first = next(iter(p.values()))
    base = first["majority_baseline"]
    L = [f"## {MODELS[task].summary.split(':')[0]}", ""]
    L += md_table(
        ["system", "accuracy", "macro-F1"] + [f"F1 {c}" for c in cs] + ["valid", "seconds"],
        [
            [name, _cell(s, "accuracy"), _cell(s, "macro_f1"), *(_cell(s["f1"], c) for c in cs), _cell(s, "valid_rate")]
            + [s["seconds"]]
            for name, s in p.items()
        ]
        + [_trivial(f"majority (always {base['label']})", [base["accuracy"], base["macro_f1"]], len(cs) + 4)],
    )
    return L + ["", f"{first['n']} questions.", ""]


def gate_section(task: str, gate: dict) -> list[str]:
    g = next(iter(gate.values()))
    base = g["keep_all_baseline"]
    cols = ["keep_precision", "keep_recall", "keep_f1", "tokens_removed_share", "kept_per_example", "valid_rate"]
    L = [
        "## Recall gate",
        "",
        f"Selection: `gate.select` with the project's flat keep caps {gate_spec.BUDGETS} per complexity "
        "(our choice, not TiMem's per-level budgets). Token share over whitespace words of all candidates.",
        "",
    ]
    L += md_table(
        ["system", "keep precision", "keep recall", "keep F1", "tokens removed", "kept / example", "valid", "seconds"],
        [[name, *(_cell(s, c) for c in cols), s["seconds"]] for name, s in gate.items()]
        + [_trivial("keep all (no gate)", [base[c] for c in cols[:4]], len(cols) + 2)],
    )
    return L + [
        "",
        f"{g['examples']} examples (the bootstrap's units), {g['candidates']} candidates; "
        f"gold keeps remove {_cell(g, 'gold_tokens_removed_share')} of the tokens.",
        "",
    ]


def consolidator_section(task: str, c: dict) -> list[str]:
    first = next(iter(c.values()))
    base = first["majority_baseline"]
    acts = consolidator.ACTIONS
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
            [name, _cell(s, "accuracy"), _cell(s, "macro_f1")]
            + [f"{_cell(s['per_action'][a], 'precision')} / {_cell(s['per_action'][a], 'recall')}" for a in acts]
            + [_cell(s, "valid_rate"), s["seconds"]]
            for name, s in c.items()
        ]
        + [_trivial(f"majority (always {base['action']})", [base["accuracy"], base["macro_f1"]], len(acts) + 4)],
    )
    return L + [""]


def segmenter_section(task: str, c: dict) -> list[str]:
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
        [[name] + [_cell(s, k) for k in keys] + [_cell(s, "valid_rate"), s["seconds"]] for name, s in c.items()]
        + [
            _trivial(label, [first[b][k] for k in keys], 10)
            for label, b in (("never cut (majority)", "never_cut_baseline"), ("always cut", "always_cut_baseline"))
        ],
    )
    return L + [""]


def _decision_id(row: dict) -> str | None:
    return f"{row['conversation_id']}/{row['turn_id']}" if "turn_id" in row else None


def router_chart(r: dict, title: str) -> tuple[dict, list[str], None]:
    labs = router.LABELS
    values = {
        name: [s["overall"]["acc"], s["overall"]["f1"]]
        + [s[lab][m] for lab in labs for m in ("acc", "f1")]
        + [s["overall"]["exact_set"]]
        for name, s in r.items()
    }
    return (
        values,
        ["overall ACC", "overall F1"] + [f"{lab} {m}" for lab in labs for m in ("acc", "F1")] + ["exact set"],
        None,
    )


def _bars(keys: list[str], labels: list[str] | None = None):
    def chart(r: dict, title: str):
        values, intervals = bars_of(r, keys)
        return values, labels or keys, intervals

    return chart


def consolidator_chart(r: dict, title: str):
    acts = consolidator.ACTIONS
    values = {name: [s["accuracy"], s["macro_f1"]] + [s["per_action"][a]["f1"] for a in acts] for name, s in r.items()}
    return values, ["accuracy", "macro-F1"] + [f"F1 {a}" for a in acts], None


# Per grader (`CompactModel.metric`): the report section and the chart of its figures.
SECTIONS = {
    "router_scores": router_section,
    "planner_scores": class_section,
    "querytyper_scores": class_section,
    "gate_scores": gate_section,
    "consolidator_scores": consolidator_section,
    "segmenter_scores": segmenter_section,
}
CHARTS = {
    "router_scores": router_chart,
    "planner_scores": _bars(["accuracy", "macro_f1"]),
    "querytyper_scores": _bars(["accuracy", "macro_f1"]),
    "gate_scores": _bars(["keep_precision", "keep_recall", "keep_f1", "tokens_removed_share"]),
    "consolidator_scores": consolidator_chart,
    "segmenter_scores": _bars(
        ["precision", "recall", "f1", "kappa", "pk", "windowdiff"],
        ["boundary P", "boundary R", "boundary F1", "kappa", "Pk (lower better)", "WindowDiff (lower better)"],
    ),
}


def charts(out: Path, results: dict, meta: dict) -> None:
    """One PNG per model: its headline figures for every system, with intervals where the figures carry them."""
    for task, r in results.items():
        if r:
            title = f"{task}, gold {meta['split']} split"
            values, labels, intervals = CHARTS[MODELS[task].metric](r, title)
            grouped_bars(out / f"{task}.png", values, labels, title, size=(9, 3.8), intervals=intervals)


def main(argv=None) -> int:
    return print_report(run(job_config(EncoderEvalConfig, argv, "memdistill eval-encoders", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
