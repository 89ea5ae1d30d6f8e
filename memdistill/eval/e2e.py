"""End to end: build memory banks with extractors, answer the dataset's questions through the reference
runtime (memdistill.runtime.retrieval), and report evidence recall@k, recalled tokens per query and, with QA
and judge endpoints configured, LLM-judge accuracy per category beside its trivial baseline (the answer model
with no memory).

  memdistill eval-e2e --config configs/eval/e2e_cpu.yaml [key=value ...]        (make eval-e2e)
  memdistill eval-e2e --config configs/eval/e2e_locomo.yaml data_path=locomo10.json
  memdistill eval-e2e --config configs/eval/e2e_cpu.yaml run_dir=runs/eval-e2e/<time>   (resume)

Banks (`banks`, one label each): `gold` (the seed corpus's gold records: the upper bound), `turns` (one
memory per message, its raw text, no model: the NaiveRAG baseline an extractor has to beat), `records:FILE`
(a JSONL of records with source pointers, see memdistill.runtime.retrieval.MemoryBank.from_jsonl), an `http(s)://.../v1`
extractor endpoint, or a model (a directory or `embedded:<name>`) served here by a private vLLM server
(a model directory that does not exist yet is skipped and said so in the report).

Variants (`variants`): which query the runtime gets and whether the dimension route runs.
`question`: the plain question, BM25 + dense. `gold` / `gold+route`: the dataset's gold query analysis
(seed corpus only). `model` / `model+route`: the query analysis written by the bank's own extractor
model (the same adapter parses queries), or by `query_url` for banks without a model.

Fusions (`fusions`, memdistill.runtime.retrieval): `rrf`, memdistill's reciprocal-rank fusion with a hand-set
dimension weight, cut to `budget`; `dimmem_union`, DimMem's Eq. 6 (each route's top_k, content-deduplicated,
the whole union read, no cut). Every variant runs under every fusion.

Recall modes (`recall_modes`), TiMem Table 3's configurations: `default` (no planner: `budget`), `simple` /
`hybrid` / `complex` (no planner, that complexity's budget: TiMem's fixed scope), `planned` (the planner
hook picks the complexity), each optionally `+gate` (the gate hook filters). The budgets are
memdistill.spec.gate.BUDGETS, memdistill's flat caps (TiMem budgets levels of a hierarchy, Table 7).
Unset: one mode from `hooks` (planned if the planner is hooked, +gate if the gate is). Hooks come from
served models (`hooks`, `hooks_url`, `hooks_options`) or from exported encoders run in process
(`hooks_models: {planner: runs/planner-cpu/model, gate: runs/gate-cpu/model}`).

Every rate (evidence recall@k, hit@k, recall of what is read, judge accuracy) carries a 95% bootstrap
interval over questions; tokens are counted with the `token_counter` tokenizer, named in the report.

The run directory holds banks/*.jsonl (every record with its pointers), queries/*.jsonl, qa.jsonl,
per_question.jsonl, results.json, report.md and PNG charts; given as run_dir, a run resumes and redoes
only what is missing.
"""

from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memdistill.core.config import ConfigError, env_key, job_config
from memdistill.core.io import write_json
from memdistill.core.report import md_table, print_report, pyplot, rate_cell, save_figure
from memdistill.core.report import run_dir as new_run_dir
from memdistill.data import seed as seedlib
from memdistill.data.questions import Question, load_questions
from memdistill.eval.extractor import topic_starts
from memdistill.metrics.recall import RecallScores, TokenCounter
from memdistill.metrics.stats import bootstrap_ci
from memdistill.runtime import MemoryBank, MemoryItem, MemoryRuntime, hooks_from_models
from memdistill.runtime.retrieval import FUSIONS, score_gate, types_from_trimem
from memdistill.spec import qa
from memdistill.spec.dialogue import WINDOW_PRESETS, interleaved, windows
from memdistill.spec.gate import BUDGETS
from memdistill.spec.planner import COMPLEXITIES
from memdistill.spec.query_parser import QueryAnalysis

VARIANTS = {
    "question": (None, False),
    "question+route": (None, True),
    "gold": ("gold", False),
    "gold+route": ("gold", True),
    "model": ("model", False),
    "model+route": ("model", True),
}


@dataclass
class E2EConfig:
    dataset: str = "seed"  # seed | locomo | longmemeval
    data_path: str = "data/seed"  # the seed directory, or a LoCoMo / LongMemEval JSON file
    split: str = "test"  # seed only
    include_adversarial: bool = False  # unanswerable questions: LoCoMo category 5, the seed's adversarial / abstention
    # seed corpus: "short" or "long" keeps the conversations of that length only (data.seed.length), "all" both
    conversation_length: str = "all"
    max_conversations: int | None = None  # the first N, conversation styles taken in turn
    max_questions: int | None = None
    banks: list = field(default_factory=lambda: ["gold", "embedded:smollm2-135m-instruct", "runs/extractor-cpu/merged"])
    labels: list | None = None  # display names, one per bank
    variants: list = field(default_factory=lambda: ["question", "gold", "gold+route", "model", "model+route"])
    # extraction through an endpoint (messages per window, context messages) per conversation style
    windows: dict = field(default_factory=lambda: {k: list(v) for k, v in WINDOW_PRESETS.items()})
    # Topic-aware windows (memdistill.eval.extractor.topic_starts): null = fixed; gold (dataset seed only);
    # or a trained segmenter's directory
    topic_windows: str | None = None
    max_new_tokens: int = 1024
    structured: bool = False  # constrain extraction to the spec's JSON Schema
    concurrency: int = 8
    max_model_len: int = 4096  # private vLLM servers: the longest window prompt + max_new_tokens must fit
    serve_config: str = "configs/serving/cpu.yaml"  # how each private server runs (gpu.yaml: bf16 on GPUs)
    serve_overrides: list = field(default_factory=list)  # key=value on top of serve_config, e.g. [replicas=1]
    api_key_env: str | None = None  # for http(s) bank endpoints and query_url / hooks_url
    query_url: str | None = None  # query parser for banks that have no model of their own
    # retrieval
    ks: list = field(default_factory=lambda: [1, 5, 10, 20])
    top_k: int = 20  # candidates per route (DimMem: 20 on LongMemEval, 15 on LoCoMo)
    rrf_k: int = 60
    dim_weight: float = 2.0
    budget: int = 10  # memories the answer model reads under rrf (a planner's budget replaces it)
    fusions: list = field(default_factory=lambda: ["rrf"])  # any of rrf, dimmem_union
    recall_modes: list | None = None  # TiMem Table 3 rows, e.g. [default, simple+gate, planned, planned+gate]
    assistant_context: bool = True  # attach assistant replies when the query asks what the assistant said
    hooks_url: str | None = None  # a MemoryModels endpoint (the LM) for the optional hooks
    hooks_options: dict = field(default_factory=dict)  # more MemoryModels arguments, e.g. encoder endpoint URLs
    hooks: list = field(default_factory=list)  # any of router, planner, gate
    hooks_models: dict = field(default_factory=dict)  # {router|planner|gate: exported encoder dir}, in process
    gate_complexity: str = "hybrid"  # the gate's complexity when there is no planner
    embedding_model: str = "embedded:minilm"
    token_counter: str = "embedded:smollm2-135m-instruct"
    # QA + judge: {base_url, model, api_key_env, max_tokens, structured, concurrency, timeout, template_kwargs}
    qa: dict | None = None
    judge: dict | None = None
    qa_variants: list | None = None  # which variants to answer (None: all)
    # TiMem's memory tree over each bank (memdistill.eval.tree): rows "<recall> <levels> <scope>[+gate]", e.g.
    # "hierarchical L1-L5 planned+gate", "flat L1 hybrid"; nodes written by tree_writer: gold | lead | a URL
    trees: list = field(default_factory=list)
    tree_writer: str = "gold"
    tree_writer_model: str = "memdistill-summarizer"  # the served name behind a tree_writer URL
    output_dir: str = "runs/eval-e2e"
    run_dir: str | None = None  # resume this run directory


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "bank"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []


def _append(path: Path, rows: list[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# what the cached banks, queries and answers of a run directory depend on
RESUME_KEYS = (
    "dataset",
    "data_path",
    "split",
    "include_adversarial",
    "conversation_length",
    "max_conversations",
    "max_questions",
    "windows",
    "max_new_tokens",
    "structured",
    "qa",
    "judge",
)


def check_resume(run_dir: Path, cfg: E2EConfig) -> None:
    """A resumed run must not mix banks built under other settings with new ones."""
    want = {k: getattr(cfg, k) for k in RESUME_KEYS}
    f = run_dir / "config.json"
    if f.exists():
        had = json.loads(f.read_text())
        changed = [
            k
            for k in RESUME_KEYS
            if k in had and json.dumps(had[k], sort_keys=True) != json.dumps(want[k], sort_keys=True)
        ]
        if changed:
            raise ConfigError(
                f"run_dir={run_dir} was made with other "
                + ", ".join(f"{k} ({had[k]!r}, now {want[k]!r})" for k in changed)
                + ": start a new run, or set them back"
            )
    f.write_text(json.dumps(want, indent=1))


def bank_kind(spec: str) -> str:
    if spec in ("gold", "turns"):
        return spec
    if spec.startswith("records:"):
        return "records"
    if spec.startswith(("http://", "https://")):
        return "url"
    return "model"


def _model_available(spec: str) -> bool:
    return spec.startswith("embedded:") or (Path(spec) / "config.json").exists()


class Endpoint:
    """An OpenAI-compatible endpoint that answers or judges (vLLM, api.openai.com, ...). Requests come from
    memdistill.spec.request.chat_request; `template_kwargs: false` drops the chat-template kwargs (thinking off)
    for APIs that reject unknown fields, such as api.openai.com."""

    KEYS = {"base_url", "model", "api_key_env", "max_tokens", "structured", "concurrency", "timeout", "template_kwargs"}

    def __init__(self, d: dict, where: str, default_max_tokens: int):
        import openai

        unknown = set(d) - self.KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (known: {', '.join(sorted(self.KEYS))})")
        for key in ("base_url", "model"):
            if not d.get(key):
                raise ConfigError(f"{where}.{key} is required")
        self.model, self.max_tokens = d["model"], d.get("max_tokens", default_max_tokens)
        self.structured, self.template_kwargs = d.get("structured", True), d.get("template_kwargs", True)
        self.concurrency = d.get("concurrency", 4)
        self.client = openai.OpenAI(
            base_url=d["base_url"],
            api_key=env_key(d.get("api_key_env"), f"{where}.api_key_env") or "EMPTY",
            timeout=d.get("timeout", 300),
            max_retries=2,
        )

    def chat(self, messages: list[dict], schema: dict, name: str) -> tuple[str, int]:
        from memdistill.spec.request import chat_request

        body = chat_request(messages, self.model, self.max_tokens, schema if self.structured else None, name)
        if not self.template_kwargs:
            body.pop("extra_body")
        resp = self.client.chat.completions.create(**body)
        return resp.choices[0].message.content or "", resp.usage.prompt_tokens if resp.usage else 0


# --- building banks -----------------------------------------------------------------------------


def extract_bank(mm, convs: dict, cfg: E2EConfig, label: str, partial: Path, seed=None) -> tuple[MemoryBank, dict]:
    """Extract every window; each finished chunk of windows is appended to `partial`, so a killed run
    resumes where it stopped."""

    wins = []
    for c in convs.values():
        if c.style not in cfg.windows:
            raise ConfigError(f"windows: no size for conversation style {c.style!r} ({c.conversation_id})")
        size, overlap = cfg.windows[c.style]
        wins += windows(c, size, overlap, topic_starts(c, cfg.topic_windows, seed))
    done = {r["start"]: r for r in _jsonl(partial)}
    if any(r["of"] != len(wins) for r in done.values()):
        raise ConfigError(f"{partial}: written for other windows than this config makes; remove it or fix the config")
    step = max(1, mm.max_concurrency * 2)
    with tqdm(total=len(wins), desc=f"extract {label}", unit="window") as bar:
        bar.update(sum(r["windows"] for r in done.values()))
        for i in range(0, len(wins), step):
            if i in done:
                continue
            t0 = time.time()
            res = mm.extract(wins[i : i + step])
            problems: dict = {}
            for _, p in res.problems:
                problems[p.code] = problems.get(p.code, 0) + 1
            done[i] = {
                "start": i,
                "of": len(wins),
                "windows": len(wins[i : i + step]),
                "items": [it.to_json() for it in MemoryBank.from_extracted(res.memories).items],
                "problems": problems,
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": res.completion_tokens,
                "seconds": time.time() - t0,
            }
            _append(partial, [done[i]])
            bar.update(done[i]["windows"])
    chunks = [done[i] for i in sorted(done)]
    problems = {}
    for r in chunks:
        for code, n in r["problems"].items():
            problems[code] = problems.get(code, 0) + n
    items = [MemoryItem.from_json(row, f"{partial} chunk {r['start']}") for r in chunks for row in r["items"]]
    stats = {
        "windows": len(wins),
        "records": len(items),
        "problems": problems,
        "prompt_tokens": sum(r["prompt_tokens"] for r in chunks),
        "completion_tokens": sum(r["completion_tokens"] for r in chunks),
        "extraction_seconds": round(sum(r["seconds"] for r in chunks), 1),
    }
    return MemoryBank(items), stats


def parse_queries(mm, questions: list[Question], label: str, concurrency: int) -> list[dict]:
    def one(q):
        res = mm.parse_query(q.question, q.question_date)
        return {
            "question_id": q.question_id,
            "query": res.query.model_dump() if res.ok else None,
            "problems": [p.code for p in res.problems],
        }

    with ThreadPoolExecutor(concurrency) as pool:
        return list(tqdm(pool.map(one, questions), total=len(questions), desc=f"parse queries {label}", unit="q"))


def build_bank(spec: str, label: str, cfg: E2EConfig, convs, questions, seed, run: Path, want_queries: bool):
    """(bank, stats, model queries by question id or None); cached in the run directory."""
    from memdistill.serve.client import MemoryModels

    kind, slug = bank_kind(spec), _slug(label)
    bank_file, stats_file, query_file = (
        run / "banks" / f"{slug}.jsonl",
        run / "banks" / f"{slug}.json",
        run / "queries" / f"{slug}.jsonl",
    )
    if kind == "gold":
        if seed is None:
            raise ConfigError("bank 'gold' needs dataset=seed (only the seed corpus has gold records)")
        bank = MemoryBank.from_seed(seed, convs)
        return bank, {"records": len(bank)}, None
    if kind == "turns":
        bank = MemoryBank.from_turns(convs.values())
        return bank, {"records": len(bank)}, None
    if kind == "records":
        bank = MemoryBank(
            [it for it in MemoryBank.from_jsonl(spec.split(":", 1)[1]).items if it.conversation_id in convs]
        )
        return bank, {"records": len(bank)}, None
    have_bank = bank_file.exists() and stats_file.exists()
    have_queries = query_file.exists() or not want_queries
    bank = MemoryBank.from_jsonl(bank_file) if have_bank else None
    stats = json.loads(stats_file.read_text()) if have_bank else None
    queries = _jsonl(query_file) if query_file.exists() else None
    if not (have_bank and have_queries):

        def work(mm):
            nonlocal bank, stats, queries
            if not have_bank:
                partial = bank_file.with_suffix(".partial.jsonl")
                bank, stats = extract_bank(mm, convs, cfg, label, partial, seed)
                bank.save(bank_file)
                stats_file.write_text(json.dumps(stats, indent=1))
                partial.unlink()
            if not have_queries:
                queries = parse_queries(mm, questions, label, cfg.concurrency)
                _append(query_file, queries)

        opts = dict(
            structured=cfg.structured,
            timeout=1800,
            max_retries=1,
            max_concurrency=cfg.concurrency,
            max_tokens=cfg.max_new_tokens,
        )
        if kind == "url":
            work(MemoryModels(spec, api_key=env_key(cfg.api_key_env, "api_key_env"), **opts))
        else:
            from memdistill.eval.generate import VLLMGenerator

            with VLLMGenerator(
                spec, cfg.structured, cfg.concurrency, cfg.max_model_len, cfg.serve_config, cfg.serve_overrides
            ) as gen:
                work(MemoryModels([f"{u}/v1" for u in gen.servers.urls], **opts))
    return bank, stats, {r["question_id"]: r for r in queries} if queries is not None else None


# --- answering and judging ----------------------------------------------------------------------


NO_MEMORY = "no memory (trivial baseline)"


def answer_and_judge(
    qa_mm, judge_mm, items: list[tuple[str, str, Question, str]], done: dict, out: Path, concurrency: int
) -> None:
    """items: (bank label, variant, question, context). Appends to qa.jsonl; `done` holds earlier rows."""

    def one(item):
        label, variant, q, context = item
        raw_answer, pt = qa_mm.chat(
            qa.answer_messages(q.question, q.question_date, context), qa.answer_schema(), "answer"
        )
        ans = qa.parse_answer(raw_answer)
        raw_verdict, _ = judge_mm.chat(
            qa.judge_messages(q.question, q.answer, ans.answer or "", q.category, q.question_id),
            qa.judge_schema(),
            "verdict",
        )
        v = qa.parse_verdict(raw_verdict)
        return {
            "bank": label,
            "variant": variant,
            "question_id": q.question_id,
            "category": q.category,
            "answer": ans.answer,
            "answer_problems": [p.code for p in ans.problems],
            "qa_prompt_tokens": pt,
            "raw_verdict": raw_verdict,
            "correct": v.correct,
            "verdict_problems": [p.code for p in v.problems],
        }

    todo = [it for it in items if (it[0], it[1], it[2].question_id) not in done]
    with ThreadPoolExecutor(concurrency) as pool:
        for row in tqdm(pool.map(one, todo), total=len(todo), desc="answer + judge", unit="q"):
            _append(out, [row])
            done[(row["bank"], row["variant"], row["question_id"])] = row


def qa_summary(rows: list[dict]) -> dict:
    """Judge accuracy over all questions (an unreadable verdict counts as wrong), with a 95% bootstrap
    interval over questions."""

    def acc(rs):
        right = [float(bool(r["correct"])) for r in rs]
        return {
            "questions": len(rs),
            "judged": sum(r["correct"] is not None for r in rs),
            "accuracy": round(sum(right) / len(rs), 4) if rs else 0.0,
            "accuracy_ci95": bootstrap_ci(lambda idx: sum(right[i] for i in idx) / len(idx), len(right)),
        }

    cats = sorted({r["category"] for r in rows})
    return {"overall": acc(rows), "by_category": {c: acc([r for r in rows if r["category"] == c]) for c in cats}}


def _query_for(q: Question, source: str | None, model_queries: dict | None) -> QueryAnalysis | None:
    if source == "gold":
        return q.query
    if source == "model" and (parsed := model_queries.get(q.question_id, {}).get("query")):
        return QueryAnalysis.model_validate(parsed)
    return None


# --- recall modes (TiMem Table 3) --------------------------------------------------------------

SCOPES = ("default", *COMPLEXITIES, "planned")


def parse_mode(mode: str) -> tuple[str, bool]:
    """'planned+gate' -> ('planned', True)."""
    scope, _, gate = mode.partition("+")
    if scope not in SCOPES or gate not in ("", "gate"):
        raise ConfigError(f"recall_modes: {mode!r} is not one of {', '.join(SCOPES)}, optionally followed by +gate")
    return scope, bool(gate)


def recall_modes(cfg: E2EConfig, hooks: dict, skipped: list) -> list[str]:
    """The modes to run; one whose hook is an encoder not trained yet is skipped and said so."""
    if cfg.recall_modes is None:
        return [("planned" if "planner" in hooks else "default") + ("+gate" if "gate" in hooks else "")]
    out = []
    for mode in cfg.recall_modes:
        scope, gate = parse_mode(mode)
        missing = [h for h, used in (("planner", scope == "planned"), ("gate", gate)) if used and h not in hooks]
        absent = [h for h in missing if h in cfg.hooks_models]
        if len(absent) < len(missing):
            raise ConfigError(f"recall_modes: {mode!r} needs the {' and '.join(missing)} hook (hooks or hooks_models)")
        if absent:
            skipped.append(f"recall mode {mode}: no exported {' or '.join(absent)} model at "
                           + ", ".join(cfg.hooks_models[h] for h in absent))  # fmt: skip
        else:
            out.append(mode)
    if not out:
        raise ConfigError("recall_modes: none can run (" + "; ".join(skipped) + ")")
    return out


def mode_runtime(rt: MemoryRuntime, hooks: dict, fusion: str, mode: str, budget: int) -> MemoryRuntime:
    """DimMem's union is read whole; a fixed scope is a planner that always answers that complexity."""
    scope, gate = parse_mode(mode)
    planner = hooks.get("planner") if scope == "planned" else (lambda q, c=scope: c) if scope in COMPLEXITIES else None
    return rt.but(
        fusion=fusion,
        budget=budget if fusion == "rrf" else None,
        planner=planner,
        gate=hooks.get("gate") if gate else None,
    )


def row_name(variant: str, fusion: str, mode: str) -> str:
    return ", ".join([variant] + ([fusion] if fusion != "rrf" else []) + ([mode] if mode != "default" else []))


def build_hooks(cfg: E2EConfig) -> dict:
    """router / planner / gate callables: served (hooks + hooks_url / hooks_options) or in process
    (hooks_models, exported encoders); the planner's answer is remembered per question, since every
    variant and fusion asks it again."""
    unknown = set(cfg.hooks_models) - {"router", "planner", "gate"}
    if unknown:
        raise ConfigError(f"hooks_models: unknown hooks {sorted(unknown)}; expected router, planner, gate")
    hooks = {}
    if cfg.hooks:
        from memdistill.serve.client import MemoryModels

        mm = MemoryModels(cfg.hooks_url, api_key=env_key(cfg.api_key_env, "api_key_env"), **cfg.hooks_options)
        hooks = hooks_from_models(mm, cfg.hooks)
    if cfg.hooks_models:
        from memdistill.core.encoder import Encoder

        have = {name: path for name, path in cfg.hooks_models.items() if (Path(path) / "config.json").exists()}
        enc = {name: Encoder(path) for name, path in have.items()}
        if "router" in enc:
            hooks["router"] = lambda q: types_from_trimem(enc["router"].classify_types([q])[0])
        if "planner" in enc:
            hooks["planner"] = lambda q: enc["planner"].complexity([q])[0]
        if "gate" in enc:
            hooks["gate"] = score_gate(enc["gate"].keep_scores)
    if "planner" in hooks:
        plan, memo = hooks["planner"], {}
        hooks["planner"] = lambda q: memo[q] if q in memo else memo.setdefault(q, plan(q))
    return hooks


def with_intervals(scores: RecallScores) -> dict:
    """RecallScores.summary() plus a 95% bootstrap interval over questions for every rate in it."""
    out = scores.summary()
    rates = [f"{m}@{k}" for m in ("recall", "hit") for k in scores.ks] + ["kept_recall", "kept_hit"]
    groups = {"overall": scores.rows} | {c: [r for r in scores.rows if r["category"] == c] for c in out["by_category"]}
    for name, rows in groups.items():
        summ = out["overall"] if name == "overall" else out["by_category"][name]
        ev = [r for r in rows if r["evidence"]]
        for rate in rates:
            vals = [float(r[rate]) for r in ev]
            summ[f"{rate}_ci95"] = bootstrap_ci(lambda idx, v=vals: sum(v[i] for i in idx) / len(idx), len(vals))
        cov = [r["answer_coverage"] for r in ev if r.get("answer_coverage") is not None]
        if cov:
            summ["answer_coverage_ci95"] = bootstrap_ci(lambda idx, v=cov: sum(v[i] for i in idx) / len(idx), len(cov))
    return out


# --- the job ------------------------------------------------------------------------------------


def _labels(cfg: E2EConfig) -> list[str]:
    """The report's name for each bank; every config error is raised here, before any work."""
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"variants: unknown {unknown}; expected any of {', '.join(VARIANTS)}")
    labels = cfg.labels or [
        b
        if bank_kind(b) != "model"
        else (b.split(":", 1)[1] + " (base)" if b.startswith("embedded:") else Path(b).name)
        for b in cfg.banks
    ]
    if len(labels) != len(cfg.banks):
        raise ConfigError(f"labels: {len(labels)} labels for {len(cfg.banks)} banks")
    if bool(cfg.qa) != bool(cfg.judge):
        raise ConfigError("qa and judge go together: set both endpoints, or neither")
    bad = [f for f in cfg.fusions if f not in FUSIONS]
    if bad or not cfg.fusions:
        raise ConfigError(f"fusions: {bad or 'none'}; expected some of {', '.join(FUSIONS)}")
    if cfg.hooks and not (cfg.hooks_url or cfg.hooks_options):
        raise ConfigError("hooks need hooks_url and/or hooks_options (the MemoryModels endpoints that serve them)")
    return labels


def _questions(cfg: E2EConfig):
    """(conversations, questions, data notes, seed) of the run: the split, cut to the configured counts."""
    convs, questions, notes, seed = load_questions(cfg.dataset, cfg.data_path, cfg.split, cfg.include_adversarial)
    if cfg.conversation_length != "all":
        if cfg.conversation_length not in ("short", "long") or seed is None:
            raise ConfigError(f"conversation_length {cfg.conversation_length!r}: all, short or long (seed corpus only)")
        convs = {c: v for c, v in convs.items() if seedlib.length(v) == cfg.conversation_length}
        questions = [q for q in questions if q.conversation_id in convs]
    if cfg.max_conversations:
        convs = interleaved(convs, cfg.max_conversations)
        questions = [q for q in questions if q.conversation_id in convs]
    questions = questions[: cfg.max_questions] if cfg.max_questions else questions
    convs = {c: v for c, v in convs.items() if any(q.conversation_id == c for q in questions)}
    if not questions:
        raise ValueError(f"{cfg.data_path}: no questions to evaluate (dataset={cfg.dataset}, split={cfg.split})")
    return convs, questions, notes, seed


def recall_one(mrt, scores: RecallScores, q, query, route: bool, cfg: E2EConfig, count) -> tuple[dict, str]:
    """One question recalled through one runtime: its per-question row (scored into `scores`) and the memory
    context the answer model would read."""
    t0 = time.perf_counter()
    rec = mrt.recall(q.question, q.conversation_id, query, route, cfg.gate_complexity)
    seconds = time.perf_counter() - t0
    replies = cfg.assistant_context and bool(query and query.need_assistant_context)
    context = mrt.context(rec.kept, replies)
    # nothing recalled costs nothing (the "(no memories recalled)" placeholder is not memory)
    tokens_at = {k: count(mrt.context(rec.hits[:k], replies)) if rec.hits else 0 for k in cfg.ks}
    row = scores.add(q, rec, tokens_at, count(context) if rec.kept else 0, context if rec.kept else "", seconds)
    return {
        **row,
        "ranked_turns": [h.item.turn_id for h in rec.hits[: max(cfg.ks)]],
        "evidence_turns": q.evidence,
        "complexity": rec.complexity,
        "budget": rec.budget,
        "notes": rec.notes,
    }, context


def _meta(cfg: E2EConfig, questions: int, convs: int, counter: str, hooks, modes, skipped, notes, qa_baseline) -> dict:
    """What results.json and the report say about the run."""
    return {
        "dataset": cfg.dataset,
        "data_path": cfg.data_path,
        "split": cfg.split,
        "questions": questions,
        "conversations": convs,
        "ks": cfg.ks,
        "budget": cfg.budget,
        "top_k": cfg.top_k,
        "rrf_k": cfg.rrf_k,
        "dim_weight": cfg.dim_weight,
        "token_counter": counter,
        "hooks": sorted(hooks),
        "fusions": cfg.fusions,
        "recall_modes": modes,
        "plan_budgets": BUDGETS,
        "assistant_context": cfg.assistant_context,
        "skipped": skipped,
        "data_notes": notes,
        "qa": {k: v for k, v in (cfg.qa or {}).items() if k != "api_key_env"} or None,
        "judge": {k: v for k, v in (cfg.judge or {}).items() if k != "api_key_env"} or None,
        "qa_baseline": qa_baseline,
        "trees": cfg.trees,
        "tree_writer": cfg.tree_writer if cfg.trees else None,
    }


@dataclass
class _Job:
    """What every bank of one run is recalled with, and where its rows go."""

    cfg: E2EConfig
    questions: list
    embed: object
    count: object
    hooks: dict
    modes: list
    skipped: list
    qa_mm: object
    judge_mm: object
    qa_done: dict
    run_dir: Path
    per_question: list = field(default_factory=list)


def _recall_bank(job: _Job, label: str, rt, model_queries) -> dict:
    """Every query variant x fusion x recall mode over one bank: its recall figures (and QA when configured)."""
    cfg, questions, out = job.cfg, job.questions, {}
    for variant in cfg.variants:
        source, route = VARIANTS[variant]
        if source == "gold" and not any(q.query for q in questions):
            job.skipped.append(f"{label} / {variant}: the dataset has no gold query analysis")
            continue
        if source == "model" and model_queries is None:
            job.skipped.append(f"{label} / {variant}: no query parser for this bank (set query_url)")
            continue
        job.embed(
            [x.query_anchor if (x := _query_for(q, source, model_queries)) else q.question for q in questions]
        )  # one batch fills the embedding cache
        for fusion in cfg.fusions:
            for mode in job.modes:
                name, mrt = row_name(variant, fusion, mode), mode_runtime(rt, job.hooks, fusion, mode, cfg.budget)
                scores, items = RecallScores(cfg.ks), []
                for q in tqdm(questions, desc=f"recall {label} / {name}", unit="q", leave=False):
                    row, context = recall_one(
                        mrt, scores, q, _query_for(q, source, model_queries), route, cfg, job.count
                    )
                    where = {"bank": label, "variant": name, "query": variant, "fusion": fusion, "recall_mode": mode}
                    job.per_question.append(where | row)
                    if job.qa_mm and (cfg.qa_variants is None or variant in cfg.qa_variants):
                        items.append((label, name, q, context))
                entry = {"query": variant, "fusion": fusion, "recall_mode": mode, "recall": with_intervals(scores)}
                out[name] = entry
                if items:
                    qa_file = job.run_dir / "qa.jsonl"
                    answer_and_judge(job.qa_mm, job.judge_mm, items, job.qa_done, qa_file, job.qa_mm.concurrency)
                    entry["qa"] = qa_summary([job.qa_done[(label, name, q.question_id)] for _, _, q, _ in items])
    return out


def _recall_tree(job: _Job, label: str, bank, convs: dict, write) -> dict:
    """The bank's memory tree (resumable, under trees/) and every configured tree row over it."""
    from memdistill.eval import tree as tree_rows

    log = job.run_dir / "trees" / f"{_slug(label)}.jsonl"
    tree, calls = tree_rows.build_tree(bank, convs, write, log, job.cfg.concurrency)
    out = {}
    for spec in job.cfg.trees:
        trec = tree_rows.recall_for(tree, tree_rows.parse_row(spec), job.embed, job.hooks, job.cfg.top_k)
        scores = RecallScores(job.cfg.ks)
        for q in tqdm(job.questions, desc=f"tree {label} / {spec}", unit="q", leave=False):
            row, _ = recall_one(trec, scores, q, None, False, job.cfg, job.count)
            job.per_question.append({"bank": label, "variant": f"tree {spec}", "tree": spec} | row)
        out[spec] = {"tree": spec, "recall": with_intervals(scores)}
    return {"tree_calls": calls, "trees": out}


def run(cfg: E2EConfig) -> Path:
    labels = _labels(cfg)
    qa_mm = Endpoint(cfg.qa, "qa", 256) if cfg.qa else None
    judge_mm = Endpoint(cfg.judge, "judge", 512) if cfg.judge else None
    convs, questions, notes, seed = _questions(cfg)

    run_dir = Path(cfg.run_dir) if cfg.run_dir else new_run_dir(cfg.output_dir)
    for sub in ("banks", "queries", "trees"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    check_resume(run_dir, cfg)
    print(
        f"[eval-e2e] {len(questions)} questions over {len(convs)} conversations; run directory {run_dir} "
        f"(resume with run_dir={run_dir})",
        file=sys.stderr,
    )

    from memdistill.core.embedder import Embedder
    from memdistill.core.models import model_path

    embed, count = Embedder(model_path(cfg.embedding_model)), TokenCounter(cfg.token_counter)
    hooks, skipped = build_hooks(cfg), []
    modes = recall_modes(cfg, hooks, skipped)
    query_mm = None
    if cfg.query_url:
        from memdistill.serve.client import MemoryModels

        query_mm = MemoryModels(cfg.query_url, api_key=env_key(cfg.api_key_env, "api_key_env"))

    if cfg.trees:
        from memdistill.eval import tree as tree_rows

        tree_rows.check_rows(cfg.trees, hooks)
        write = tree_rows.writer_for(cfg, seed, convs)
    wants_model = any(VARIANTS[v][0] == "model" for v in cfg.variants)
    qa_done = {(r["bank"], r["variant"], r["question_id"]): r for r in _jsonl(run_dir / "qa.jsonl")}
    job = _Job(cfg, questions, embed, count, hooks, modes, skipped, qa_mm, judge_mm, qa_done, run_dir)
    results = {}
    for spec, label in zip(cfg.banks, labels):
        kind = bank_kind(spec)
        if kind == "model" and not _model_available(spec):
            skipped.append(f"{label}: {spec} does not exist (not trained or merged yet)")
            continue
        bank, stats, model_queries = build_bank(
            spec, label, cfg, convs, questions, seed, run_dir, wants_model and kind in ("model", "url")
        )
        if model_queries is None and wants_model and query_mm is not None:
            qfile = run_dir / "queries" / "query-url.jsonl"
            if not qfile.exists():
                _append(qfile, parse_queries(query_mm, questions, "query_url", cfg.concurrency))
            model_queries = {r["question_id"]: r for r in _jsonl(qfile)}
        rt = MemoryRuntime(
            bank, embed, cfg.top_k, cfg.rrf_k, cfg.dim_weight, budget=cfg.budget, conversations=convs,
            router=hooks.get("router"),
        )  # fmt: skip
        results[label] = {"bank": spec, "stats": stats, "variants": _recall_bank(job, label, rt, model_queries)}
        if cfg.trees:
            results[label] |= _recall_tree(job, label, bank, convs, write)

    qa_baseline = None
    if qa_mm:
        # judge accuracy's trivial baseline: the same answer model, asked with no memory at all
        items = [(NO_MEMORY, "-", q, qa.render_memories([])) for q in questions]
        answer_and_judge(qa_mm, judge_mm, items, qa_done, run_dir / "qa.jsonl", qa_mm.concurrency)
        qa_baseline = qa_summary([qa_done[(NO_MEMORY, "-", q.question_id)] for q in questions])

    meta = _meta(cfg, len(questions), len(convs), count.name, hooks, modes, skipped, notes, qa_baseline)
    write_json(run_dir / "results.json", {"meta": meta, "results": results})
    (run_dir / "per_question.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in job.per_question)
    )
    write_report(run_dir, meta, results)
    return run_dir


# --- report -------------------------------------------------------------------------------------


FUSION_TEXT = {
    "rrf": "rrf: memdistill's reciprocal-rank fusion (rrf_k={rrf_k}; the dimension route enters by value with "
    "the hand-set weight {dim_weight}), deduplicated by content, the answer model reads the top {budget}",
    "dimmem_union": "dimmem_union: DimMem's Eq. 6, the union of each route's top {top_k}, duplicate contents "
    "removed (order: dimension route, dense, BM25, as DimMem's released QA script), read whole",
}


def _scope(mode: str, budgets: dict) -> tuple[str, str]:
    scope, gate = parse_mode(mode)
    planner = {"default": "no", "planned": "yes"}.get(scope, f"no (fixed {scope}, budget {budgets.get(scope)})")
    return planner, "yes" if gate else "no"


def _tok(meta: dict) -> str:
    return f"tokens/query ({meta['token_counter']} tokenizer)"


def _intro(meta: dict) -> list[str]:
    where = meta["data_path"] + (f" ({meta['split']} split)" if meta["dataset"] == "seed" else "")
    lines = [
        f"# End-to-end memory evaluation: {meta['dataset']} {where}",
        "",
        f"{meta['questions']} questions over {meta['conversations']} conversations. Runtime: BM25 + dense "
        f"MiniLM (+ dimension route), {meta['top_k']} candidates per route, fused by "
        + "; ".join(FUSION_TEXT[f].format(**meta) for f in meta["fusions"])
        + (f". Hooks: {', '.join(meta['hooks'])}" if meta["hooks"] else "")
        + ".",
        "Evidence recall@k: share of a question's evidence turns that are the source turn of one of the top-k "
        "records; hit@k: at least one is. Brackets: 95% bootstrap intervals over questions. Tokens: the "
        f"rendered memory context, counted with the {meta['token_counter']} tokenizer"
        + (
            "; with a parsed query that asks what the assistant said, each memory carries the assistant reply "
            "its source turn led to (DimMem's assistant-context recall), which the count includes."
            if meta["assistant_context"]
            else "."
        ),
        "",
    ]
    return lines


def _banks_section(results: dict) -> list[str]:
    lines: list[str] = []
    lines += ["## Memory banks", ""]
    lines += md_table(
        [
            "bank",
            "source",
            "records",
            "windows",
            "at token cap",
            "extraction s",
            "prompt tok",
            "output tok",
            "top problems",
        ],
        [
            [
                label,
                r["bank"],
                r["stats"].get("records", ""),
                r["stats"].get("windows", "-"),
                r["stats"]["problems"].get("token_cap", 0) if "problems" in r["stats"] else "-",
                r["stats"].get("extraction_seconds", "-"),
                r["stats"].get("prompt_tokens", "-"),
                r["stats"].get("completion_tokens", "-"),
                ", ".join(
                    f"{k} {v}" for k, v in sorted(r["stats"].get("problems", {}).items(), key=lambda x: -x[1])[:3]
                )
                or "-",
            ]
            for label, r in results.items()
        ],
    )
    return lines


def _recall_section(meta: dict, results: dict) -> list[str]:
    ks, tok = meta["ks"], _tok(meta)
    lines: list[str] = []
    lines += ["", "## Evidence recall and tokens per query", ""]
    rows = []
    for label, r in results.items():
        for v in r["variants"].values():
            o = v["recall"]["overall"]
            rows.append(
                [label, v["query"], v["fusion"], v["recall_mode"]]
                + [rate_cell(o, f"recall@{k}") for k in ks]
                + [rate_cell(o, f"hit@{k}") for k in ks]
                + [rate_cell(o, "kept_recall"), o["kept_per_query"], o["tokens_per_query"]]
            )
    lines += md_table(
        ["bank", "query", "fusion", "recall mode"]
        + [f"R@{k}" for k in ks]
        + [f"hit@{k}" for k in ks]
        + ["recall (read)", "memories read", tok],
        rows,
    )
    lines += [
        "",
        f"Recalled {tok} at k: "
        + "; ".join(
            f"{label} / {name}: " + ", ".join(f"@{k} {v['recall']['overall'][f'tokens@{k}']}" for k in ks)
            for label, r in results.items()
            for name, v in r["variants"].items()
        ),
        "",
    ]
    return lines


def _tradeoff_section(meta: dict, results: dict) -> list[str]:
    tok = _tok(meta)
    lines: list[str] = []
    lines += [
        "## Accuracy-cost trade-off (TiMem Table 3 layout)",
        "",
        "TiMem Table 3 sets LLM-judge accuracy against recalled memory tokens per query, with and without the "
        "recall planner and the recall gate; evidence recall of the memories read stands beside the judge "
        "(and in for it when no judge is configured). A fixed scope reads that complexity's budget with no "
        f"planner. Budgets {meta['plan_budgets']} are memdistill's flat caps, not TiMem's: TiMem's planner sets "
        "per-level budgets over its memory tree (Table 7: simple L1:20, L2:4, L5:1; hybrid L1:20, L2:4, L3:2, "
        "L5:1; complex L1:20, L2:8, L3:4, L4:2, L5:1) and its gate caps nothing.",
        "",
    ]
    rows = []
    for label, r in results.items():
        for v in r["variants"].values():
            o = v["recall"]["overall"]
            qa_cell = rate_cell(v["qa"]["overall"], "accuracy") if "qa" in v else "-"
            rows.append(
                [label, v["query"], v["fusion"], *_scope(v["recall_mode"], meta["plan_budgets"])]
                + [
                    qa_cell,
                    rate_cell(o, "kept_recall"),
                    rate_cell(o, "kept_hit"),
                    o["kept_per_query"],
                    o["tokens_per_query"],
                ]
            )
    lines += md_table(
        ["bank", "query", "fusion", "planner", "gate", "LLM-judge acc.", "evidence recall (read)", "hit (read)"]
        + ["memories read", tok],
        rows,
    )
    lines += [""]
    return lines


def _category_section(meta: dict, results: dict) -> list[str]:
    ks = meta["ks"]
    lines: list[str] = []
    kmid = meta["budget"] if meta["budget"] in ks else ks[min(len(ks) - 1, len(ks) // 2)]
    lines += [f"## Evidence recall@{kmid} per category", ""]
    for label, r in results.items():
        vs = r["variants"]
        if not vs:
            continue
        cats = sorted({c for v in vs.values() for c in v["recall"]["by_category"]})
        lines += [f"### {label}", ""]
        lines += md_table(
            ["category", "n"] + list(vs),
            [
                [
                    c,
                    next(
                        v["recall"]["by_category"][c]["with_evidence"]
                        for v in vs.values()
                        if c in v["recall"]["by_category"]
                    ),
                ]
                + [
                    rate_cell(v["recall"]["by_category"][c], f"recall@{kmid}")
                    if c in v["recall"]["by_category"]
                    else "-"
                    for v in vs.values()
                ]
                for c in cats
            ],
        )
        lines += [""]
    return lines


def _judge_section(meta: dict, results: dict) -> list[str]:
    lines: list[str] = []
    judged = [
        (label, variant, v["qa"]) for label, r in results.items() for variant, v in r["variants"].items() if "qa" in v
    ]
    if judged:
        cats = sorted({c for _, _, q in judged for c in q["by_category"]})
        lines += [
            "## LLM-judge accuracy",
            "",
            f"Answer model {meta['qa']}, judge {meta['judge']} (prompts: memdistill.spec.qa). "
            "Accuracy over all questions (an unreadable verdict counts as wrong); brackets: 95% bootstrap "
            f"intervals over questions. {NO_MEMORY}: the answer model with no memory, what it knows or guesses "
            "alone.",
            "",
        ]
        baseline = [(NO_MEMORY, "-", meta["qa_baseline"])] if meta.get("qa_baseline") else []
        lines += md_table(
            ["bank", "variant", "overall"] + cats,
            [
                [label, variant, rate_cell(q["overall"], "accuracy")]
                + [rate_cell(q["by_category"][c], "accuracy") if c in q["by_category"] else "-" for c in cats]
                for label, variant, q in judged + baseline
            ],
        )
        lines += [""]
    else:
        lines += ["No QA / judge endpoints were configured: no LLM-judge accuracy in this run.", ""]
    return lines


def write_report(out: Path, meta: dict, results: dict) -> None:
    lines = _intro(meta) + _banks_section(results) + _recall_section(meta, results)
    lines += _tradeoff_section(meta, results) + _category_section(meta, results) + _judge_section(meta, results)
    if meta.get("trees"):
        from memdistill.eval.tree import tree_section

        lines += tree_section(meta, results)
    if meta["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s}" for s in meta["skipped"]] + [""]
    if meta["data_notes"]:
        lines += ["## Data notes", ""] + [f"- {s}" for s in meta["data_notes"][:50]] + [""]
    lines += ["![evidence recall@k](recall_at_k.png)", "", "![tokens per query](tokens_per_query.png)", ""]
    (out / "report.md").write_text("\n".join(lines))

    _charts(out, meta, results)


def _charts(out: Path, meta: dict, results: dict) -> None:
    plt, ks = pyplot(), meta["ks"]
    fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5 * max(1, len(results)), 4), squeeze=False, sharey=True)
    for ax, (label, r) in zip(axes[0], results.items()):
        for variant, v in r["variants"].items():
            ax.plot(ks, [v["recall"]["overall"][f"recall@{k}"] for k in ks], marker="o", label=variant)
        ax.set_title(label)
        ax.set_xlabel("k")
        ax.set_xscale("log")
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("evidence recall@k")
    save_figure(fig, out / "recall_at_k.png")

    bars = [
        (f"{label}\n{variant}", v["recall"]["overall"], b)
        for b, (label, r) in enumerate(results.items())
        for variant, v in r["variants"].items()
    ]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(bars) + 2), 4.5))
    ax.bar(range(len(bars)), [o["tokens_per_query"] for _, o, _ in bars], color=[f"C{b}" for _, _, b in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([n for n, _, _ in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"recalled tokens per query\n({meta['token_counter']} tokenizer)")
    for i, (_, o, _) in enumerate(bars):
        ax.annotate(f"R {o['kept_recall']:.2f}", (i, o["tokens_per_query"]), ha="center", va="bottom", fontsize=7)
    ax.set_title("memory tokens the answer model reads, with the evidence recall they buy")
    save_figure(fig, out / "tokens_per_query.png")


def main(argv=None) -> int:
    return print_report(run(job_config(E2EConfig, argv, "memdistill eval-e2e", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
