"""Router, planner and gate on the gold test split, each beside the served LM (zero-shot) and a rule baseline.

  memdistill eval-encoders --config configs/eval/encoders_cpu.yaml [key=value ...]        (make eval-encoders)

Rows: data/built/{router,planner,gate}/<split>.jsonl (`make data`). Three systems answer the same rows:
- the trained encoders (exported model dirs, in process; `tests/test_encoder_serving.py` shows the served
  model returns the same scores),
- the served LM prompted zero-shot through the SDK's LM path (`MemoryModels.classify_types / plan / gate`
  with memspec's student prompts and JSON Schemas): the merged extractor when it exists, else the
  untrained embedded SmolLM2, on one private vLLM server,
- rules (below), written from the label definitions in memspec, not fitted to data.

Layouts. Router (MemoType Table 9): per type, ACC = binary accuracy of "type present" and F1 = binary F1
of that type; overall ACC = exact match of the whole label set (none = the empty set), overall F1 = macro
average of the three per-type F1 (micro F1 reported too). Planner: accuracy and macro-F1 over simple /
hybrid / complex. Gate: keep precision / recall / F1 over all (example, candidate) pairs, and the share of
candidate tokens (whitespace words) removed; gold's share is the reference. An LM answer that does not
parse counts as wrong (router: no label and not an exact match; planner: wrong class; gate: keeps every
candidate, as a memory stack would when its gate fails). Output: runs/eval-encoders/<time>/ with
metrics.json, predictions.jsonl, report.md and PNG charts.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from memdistill.config import job_config
from memspec import memory_type, recall_gate, recall_plan

TASKS = ("router", "planner", "gate")


@dataclass
class EncoderEvalConfig:
    data_dir: str = "data/built"
    split: str = "test"
    router: str | None = "runs/router-cpu/model"  # exported model dirs; a missing one is skipped (reported)
    planner: str | None = "runs/planner-cpu/model"
    gate: str | None = "runs/gate-cpu/model"
    lm: str = "runs/extractor-cpu/merged"  # the zero-shot LM when it exists, else fallback_lm
    fallback_lm: str = "embedded:smollm2-135m-instruct"
    lm_baseline: bool = True
    serve_config: str = "configs/serving/cpu.yaml"
    structured: bool = True  # constrain the LM to memspec's JSON Schema, as SDK clients do
    concurrency: int = 16
    max_examples: int | None = None  # per task (quick runs); gate: whole examples
    write_cards: bool = True  # put the test figures into each exported model's card
    output_dir: str = "runs/eval-encoders"


# --- metrics (also used on dev by training.encoder) --------------------------------------------------

def binary_prf(pred: list[bool], gold: list[bool]) -> dict:
    tp = sum(p and g for p, g in zip(pred, gold))
    fp = sum(p and not g for p, g in zip(pred, gold))
    fn = sum(g and not p for p, g in zip(pred, gold))
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    return {"acc": sum(p == g for p, g in zip(pred, gold)) / len(gold) if gold else 0.0, "precision": prec,
            "recall": rec, "f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0, "tp": tp, "fp": fp, "fn": fn}


def router_scores(pred: list[list[str] | None], gold: list[list[str]]) -> dict:
    """MemoType Table 9 layout. `None` = unreadable output (no label, never an exact match)."""
    out: dict = {"overall": {}, "n": len(gold)}
    f1s, tp, fp, fn = [], 0, 0, 0
    for lab in memory_type.LABELS:
        s = binary_prf([p is not None and lab in p for p in pred], [lab in g for g in gold])
        out[lab] = {k: round(s[k], 4) for k in ("acc", "f1", "precision", "recall")}
        f1s.append(s["f1"])
        tp, fp, fn = tp + s["tp"], fp + s["fp"], fn + s["fn"]
    exact = sum(p is not None and set(p) == set(g) for p, g in zip(pred, gold))
    micro = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    out["overall"] = {"acc": round(exact / len(gold), 4), "f1": round(sum(f1s) / len(f1s), 4), "micro_f1": round(micro, 4)}
    out["valid_rate"] = round(sum(p is not None for p in pred) / len(gold), 4)
    return out


def planner_scores(pred: list[str | None], gold: list[str]) -> dict:
    from sklearn.metrics import confusion_matrix, f1_score

    labs = list(recall_plan.COMPLEXITIES)
    p = [x if x in labs else "invalid" for x in pred]
    per = f1_score(gold, p, labels=labs, average=None, zero_division=0)
    return {"n": len(gold), "accuracy": round(sum(a == b for a, b in zip(p, gold)) / len(gold), 4),
            "macro_f1": round(float(per.mean()), 4), "f1": {lab: round(float(v), 4) for lab, v in zip(labs, per)},
            "valid_rate": round(sum(x in labs for x in pred) / len(gold), 4),
            "confusion (rows gold, cols pred: simple, hybrid, complex, invalid)":
                confusion_matrix(gold, p, labels=labs + ["invalid"])[:3].tolist()}


def gate_examples(rows: list[dict], scores: list[float] | None = None) -> list[dict]:
    """Built gate rows (one per candidate) regrouped into examples, candidates in id order."""
    groups: dict = defaultdict(list)
    for k, r in enumerate(rows):
        groups[r["gate_id"]].append((r["candidate_id"], r, scores[k] if scores is not None else None))
    out = []
    for gid, cands in groups.items():
        cands.sort(key=lambda x: x[0])
        r0 = cands[0][1]
        out.append({"gate_id": gid, "complexity": r0["complexity"], "question": _question(r0),
                    "candidates": [r["text"] for _, r, _ in cands], "scores": [s for _, _, s in cands],
                    "gold": [i for i, (_, r, _) in enumerate(cands, 1) if r["label"] >= 0.5]})
    return out


def _question(row: dict) -> str:
    prefix = recall_gate.pair_query("", row["complexity"])
    return row["query"][len(prefix):].strip() if row["query"].startswith(prefix.strip()) else row["query"]


def gate_scores(examples: list[dict], kept: list[list[int] | None] | None = None, shift: float = 0.0) -> dict:
    """Keep precision / recall / F1 over all candidates and the share of candidate tokens removed.
    `kept` (1-based ids per example; None = unreadable, keeps all); by default `recall_gate.select` on
    the examples' scores, after subtracting `shift` from their logits (how tuning tries a threshold)."""
    import math

    if kept is None:
        def fold(s):
            s = min(max(s, 1e-7), 1 - 1e-7)
            return 1 / (1 + math.exp(-(math.log(s / (1 - s)) - shift)))
        kept = [recall_gate.select([fold(s) for s in e["scores"]], e["complexity"]) for e in examples]
    pred, gold, tokens, kept_tokens, gold_tokens, invalid, n_kept = [], [], 0, 0, 0, 0, 0
    for e, k in zip(examples, kept):
        if k is None:
            invalid += 1
            k = list(range(1, len(e["candidates"]) + 1))
        ks, gs = set(k), set(e["gold"])
        n_kept += len(ks)
        for i, c in enumerate(e["candidates"], 1):
            n = len(c.split())
            tokens += n
            kept_tokens += n * (i in ks)
            gold_tokens += n * (i in gs)
            pred.append(i in ks)
            gold.append(i in gs)
    s = binary_prf(pred, gold)
    return {"examples": len(examples), "candidates": len(pred), "keep_precision": round(s["precision"], 4),
            "keep_recall": round(s["recall"], 4), "keep_f1": round(s["f1"], 4),
            "tokens_removed_share": round(1 - kept_tokens / tokens, 4) if tokens else 0.0,
            "gold_tokens_removed_share": round(1 - gold_tokens / tokens, 4) if tokens else 0.0,
            "kept_per_example": round(n_kept / len(examples), 2) if examples else 0.0,
            "valid_rate": round(1 - invalid / len(examples), 4) if examples else 0.0}


# --- rule baselines ---------------------------------------------------------------------------------

_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_TIME = re.compile(rf"\b(yesterday|today|tonight|tomorrow|ago|last (week|month|year|night|weekend|time)|"
                   rf"next (week|month|year|weekend)|this (morning|week|weekend|afternoon|evening)|"
                   rf"on ({_DAYS})|({_MONTHS})|({_DAYS})|(19|20)\d\d|just (got|had|finished|bought|started))\b", re.I)
_FIRST_PERSON_FACT = re.compile(r"\b(i am|i'm|i've|i have|i love|i like|i hate|i prefer|i always|i usually|i never|"
                                r"my (wife|husband|partner|son|daughter|sister|brother|mom|mum|dad|mother|father|"
                                r"family|job|kids?|dog|cat|boss|friend|favou?rite)|i work|i live)\b", re.I)
_GENERAL = re.compile(r"\b(is a|are a|means|usually|typically|generally|in general|for example|recommend|try|"
                      r"you can|you could|aim for|it's best|the best)\b", re.I)


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


_COMPLEX = re.compile(r"^(would|could|should|might|is \w+ likely|are \w+ likely|do you think)\b|\b(likely|enjoy|prefer|"
                      r"suit|recommend|personality|values?|trend|over (the|time)|grown|changed|evolved|why|habits?|"
                      r"easier|better|best|given what you know)\b", re.I)
_HYBRID = re.compile(r"\b(how many|how often|which \w+s\b|what \w+s (has|have|did)|list|all the|both|and (why|how|when|"
                     r"where|what)|compare|between|each|so far|in total)\b", re.I)


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
    return ranked[:recall_gate.BUDGETS[complexity]]


# --- the job ----------------------------------------------------------------------------------------

def load_split(cfg: EncoderEvalConfig, task: str) -> list[dict]:
    from training.encoder import read_rows
    rows = read_rows(str(Path(cfg.data_dir) / task / f"{cfg.split}.jsonl"), task)
    if cfg.max_examples and task != "gate":
        rows = rows[: cfg.max_examples]
    elif cfg.max_examples:
        keep = list(dict.fromkeys(r["gate_id"] for r in rows))[: cfg.max_examples]
        rows = [r for r in rows if r["gate_id"] in set(keep)]
    return rows


def encoder_predictions(task: str, model_dir: str, rows: list[dict]):
    """Decisions of the exported encoder, made exactly as the SDK makes them from served scores."""
    from training.encoder import Encoder
    enc = Encoder(model_dir)
    t0 = time.time()
    if task == "router":
        pred = enc.classify_types([r["text"] for r in rows])
    elif task == "planner":
        pred = enc.complexity([r["text"] for r in rows])
    else:
        pred = [recall_gate.select(enc.keep_scores(e["question"], e["complexity"], e["candidates"]), e["complexity"])
                for e in gate_examples(rows)]
    return pred, time.time() - t0


def rule_predictions(task: str, rows: list[dict]):
    t0 = time.time()
    if task == "router":
        pred = [rule_router(r["text"]) for r in rows]
    elif task == "planner":
        pred = [rule_planner(r["text"]) for r in rows]
    else:
        pred = [rule_gate(e["question"], e["complexity"], e["candidates"]) for e in gate_examples(rows)]
    return pred, time.time() - t0


def lm_predictions(mm, task: str, rows: list[dict], concurrency: int):
    from tqdm import tqdm

    t0 = time.time()
    if task == "router":
        res = mm.classify_types([r["text"] for r in rows])
        return [r.labels for r in res], time.time() - t0
    items = rows if task == "planner" else gate_examples(rows)

    def one(x):
        if task == "planner":
            p = mm.plan(x["text"])
            return p.plan.complexity if p.ok else None
        g = mm.gate(x["question"], x["complexity"], x["candidates"])
        return g.kept_ids if g.ok else None
    with ThreadPoolExecutor(concurrency) as pool:
        pred = list(tqdm(pool.map(one, items), total=len(items), desc=f"LM {task}", unit="ex"))
    return pred, time.time() - t0


def score(task: str, pred, rows: list[dict]) -> dict:
    if task == "router":
        return router_scores(pred, [r["labels"] for r in rows])
    if task == "planner":
        return planner_scores(pred, [r["label"] for r in rows])
    return gate_scores(gate_examples(rows), pred)


def resolve_lm(cfg: EncoderEvalConfig) -> str:
    from training.base_models import model_path
    return cfg.lm if (Path(cfg.lm) / "config.json").exists() else model_path(cfg.fallback_lm)


def run(cfg: EncoderEvalConfig) -> Path:
    out = Path(cfg.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    rows = {t: load_split(cfg, t) for t in TASKS}
    preds: dict = {t: {} for t in TASKS}
    seconds: dict = {t: {} for t in TASKS}
    skipped = []
    for t in TASKS:
        model_dir = getattr(cfg, t)
        if model_dir and (Path(model_dir) / "config.json").exists():
            preds[t]["encoder"], seconds[t]["encoder"] = encoder_predictions(t, model_dir, rows[t])
        else:
            skipped.append(f"{t} encoder: no exported model at {model_dir} (run `make train-{t}`)")
        preds[t]["rules"], seconds[t]["rules"] = rule_predictions(t, rows[t])
    lm = None
    if cfg.lm_baseline:
        from memdistill.config import load_config
        from serving.client import MemoryModels
        from serving.server import Servers, ServeConfig, free_port

        lm = resolve_lm(cfg)
        scfg = load_config(ServeConfig, cfg.serve_config, [f"port={free_port()}", f"extractor={lm}"])
        with Servers(scfg, log_dir=str(out / "vllm-logs")) as servers:
            mm = MemoryModels(f"{servers.urls[0]}/v1", structured=cfg.structured, max_concurrency=cfg.concurrency,
                              timeout=600)
            for t in TASKS:
                preds[t]["LM zero-shot"], seconds[t]["LM zero-shot"] = lm_predictions(mm, t, rows[t], cfg.concurrency)
    results = {t: {name: {**score(t, p, rows[t]), "seconds": round(seconds[t][name], 2)} for name, p in preds[t].items()}
               for t in TASKS}
    meta = {"split": cfg.split, "data_dir": cfg.data_dir, "lm": lm, "models": {t: getattr(cfg, t) for t in TASKS},
            "skipped": skipped}
    (out / "metrics.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    with (out / "predictions.jsonl").open("w") as f:
        for t in TASKS:
            ids = ([r.get("snippet_id") or r.get("question_id") for r in rows[t]] if t != "gate"
                   else [e["gate_id"] for e in gate_examples(rows[t])])
            for name, p in preds[t].items():
                for i, x in zip(ids, p):
                    f.write(json.dumps({"task": t, "system": name, "id": i, "prediction": x}) + "\n")
    write_report(out, results, meta)
    if cfg.write_cards:
        from training.encoder import write_card
        for t in TASKS:
            if "encoder" in results[t] and (Path(getattr(cfg, t)) / "memdistill.json").exists():
                write_card(getattr(cfg, t), {"split": cfg.split, "source": str(out / "metrics.json"),
                                             **{k: v for k, v in results[t]["encoder"].items() if k != "seconds"}})
    return out


def write_report(out: Path, results: dict, meta: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L = [f"# Encoders on the gold {meta['split']} split", "",
         f"Rows from `{meta['data_dir']}/<task>/{meta['split']}.jsonl`. Zero-shot LM: `{meta['lm']}` served by vLLM, "
         "prompted through the SDK's LM path (memspec student prompts, JSON Schema). Rules: `eval/encoder_eval.py`.", ""]
    L += [f"Skipped: {s}" for s in meta["skipped"]] + ([""] if meta["skipped"] else [])
    r = results["router"]
    L += ["## Type router (MemoType Table 9 layout)", "",
          "Overall ACC = exact match of the label set (none = empty set); overall F1 = macro mean of the per-type F1. "
          "Per-type ACC = binary accuracy of 'type present', per-type F1 = binary F1 of that type. Values in %.", "",
          "| system | Overall ACC | Overall F1 | EM ACC | EM F1 | PM ACC | PM F1 | GM ACC | GM F1 | micro F1 | valid |",
          "|---|" + "---|" * 10]
    pct = lambda x: f"{100 * x:.2f}"  # noqa: E731
    for name, s in r.items():
        L.append(f"| {name} | {pct(s['overall']['acc'])} | {pct(s['overall']['f1'])} | "
                 + " | ".join(f"{pct(s[lab]['acc'])} | {pct(s[lab]['f1'])}" for lab in memory_type.LABELS)
                 + f" | {pct(s['overall']['micro_f1'])} | {pct(s['valid_rate'])} |")
    n = next(iter(r.values()))["n"] if r else 0
    L += ["", f"{n} snippets.", "", "## Recall planner", "",
          "| system | accuracy | macro-F1 | F1 simple | F1 hybrid | F1 complex | valid | seconds |", "|---|" + "---|" * 7]
    for name, s in results["planner"].items():
        L.append(f"| {name} | {s['accuracy']} | {s['macro_f1']} | " + " | ".join(str(s["f1"][c]) for c in recall_plan.COMPLEXITIES)
                 + f" | {s['valid_rate']} | {s['seconds']} |")
    L += ["", "## Recall gate", "",
          f"Selection: `recall_gate.select` (budgets {recall_gate.BUDGETS}). Token share over whitespace words of all candidates.", "",
          "| system | keep precision | keep recall | keep F1 | tokens removed | kept / example | valid | seconds |",
          "|---|" + "---|" * 7]
    for name, s in results["gate"].items():
        L.append(f"| {name} | {s['keep_precision']} | {s['keep_recall']} | {s['keep_f1']} | {s['tokens_removed_share']} | "
                 f"{s['kept_per_example']} | {s['valid_rate']} | {s['seconds']} |")
    g = next(iter(results["gate"].values()), None)
    if g:
        L += ["", f"{g['examples']} examples, {g['candidates']} candidates; gold keeps remove {g['gold_tokens_removed_share']} of the tokens."]
    L += ["", "![router](router.png)", "", "![planner and gate](planner_gate.png)", ""]
    (out / "report.md").write_text("\n".join(L))

    fig, ax = plt.subplots(figsize=(9, 3.8))
    cols = ["overall acc", "overall F1"] + [f"{lab} {m}" for lab in memory_type.LABELS for m in ("acc", "F1")]
    w = 0.8 / max(len(r), 1)
    for k, (name, s) in enumerate(r.items()):
        vals = [s["overall"]["acc"], s["overall"]["f1"]] + [s[lab][m] for lab in memory_type.LABELS for m in ("acc", "f1")]
        ax.bar([i + k * w for i in range(len(cols))], vals, w, label=name)
    ax.set_xticks([i + w * (len(r) - 1) / 2 for i in range(len(cols))])
    ax.set_xticklabels(cols, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"type router, gold {meta['split']} split")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "router.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (task, keys) in zip(axes, (("planner", ["accuracy", "macro_f1"]),
                                       ("gate", ["keep_precision", "keep_recall", "keep_f1", "tokens_removed_share"]))):
        res = results[task]
        w = 0.8 / max(len(res), 1)
        for k, (name, s) in enumerate(res.items()):
            ax.bar([i + k * w for i in range(len(keys))], [s[c] for c in keys], w, label=name)
        ax.set_xticks([i + w * (len(res) - 1) / 2 for i in range(len(keys))])
        ax.set_xticklabels(keys, fontsize=8, rotation=15)
        ax.set_ylim(0, 1.05)
        ax.set_title(task)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "planner_gate.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    out = run(job_config(EncoderEvalConfig, argv, "memdistill eval-encoders", __doc__))
    print((out / "report.md").read_text())
    print(f"\nreport: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
