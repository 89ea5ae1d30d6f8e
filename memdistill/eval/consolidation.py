"""Memory update end to end: banks consolidated as their records arrive, then searched.

  memdistill eval-consolidation --config configs/eval/consolidation_cpu.yaml [key=value ...]
                                                                        (make eval-consolidation)

For each bank (`gold`: the seed corpus's records of the split; `records:FILE`: any bank a run wrote, e.g.
runs/eval-e2e/<time>/banks/<label>.jsonl of the trained extractor) and each decider (`none`: no
consolidation; `consolidator`: the trained encoder, in process, as the served model answers; `rule`:
`consolidator.rule_action`), the records of each conversation are added in the order they were said through
`memdistill.runtime.consolidate.Consolidator` (the cascade's thresholds from this config) and the bank is
searched with the plain question (BM25 + dense, current records first). Reported:
- DimMem Table 5 layout: embedding comparisons of an embedding-only update (every new record against every
  earlier record of its conversation, as LightMem) against the cascade's (which only compares with records
  still current), the share saved, merges and compression (merges / the all-pairs embedding count, as
  Table 5 computes it: 241 / 2,475 = 9.74% for LightMem on LoCoMo); LightMem's own merge
  count (pairs at cosine >= 0.85) beside it;
- decisions per action;
- knowledge-update questions (questions.jsonl `update`), and evidence recall@k on them:
  - newer record above: the share where the gold record holding the new answer ranks above the gold record
    it replaced (the issue's measure; banks holding the gold records only). A merged record holds what was
    merged into it, so a merge of the two leaves them tied: not above;
  - newer turn above: the same with turns instead of records (the first hit citing the newer turn against
    the first citing the older one), which any bank allows, extractor banks included; stricter, because
    any other record of the older turn (a different fact said in the same message) counts against it;
  a record missing from the ranking ranks last; both missing counts as not above;
- evidence recall@k over every question of the split;
every rate with a 95% bootstrap interval over questions.
Output: runs/eval-consolidation/<time>/ with results.json, decisions/*.jsonl (replayable logs), report.md
and a PNG chart.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from memdistill.core.config import ConfigError, job_config
from memdistill.core.io import write_json
from memdistill.core.report import bars_of, grouped_bars, md_table, print_report, rate_cell, run_dir
from memdistill.data.questions import load_questions
from memdistill.metrics.recall import evidence_coverage
from memdistill.metrics.stats import bootstrap_ci
from memdistill.runtime import MemoryBank, MemoryItem, MemoryRuntime
from memdistill.runtime.consolidate import Consolidator
from memdistill.runtime.retrieval import HISTORY
from memdistill.spec import consolidator as consolidator_spec

# gold: the labelled pairs' actions (KEEPBOTH for a pair no gold pair names), the ceiling of cascade and
# runtime with a perfect decider; the gold bank only (an extractor's records have no gold pairs)
DECIDERS = ("none", "consolidator", "rule", "gold")


@dataclass
class ConsolidationEvalConfig:
    seed_dir: str = "data/seed"
    split: str = "test"
    banks: list = field(default_factory=lambda: ["gold"])  # gold | records:FILE
    labels: list | None = None  # display names, one per bank
    deciders: list = field(default_factory=lambda: list(DECIDERS))
    consolidator: str = "runs/consolidator-cpu/model"
    # candidate cascades, each {name, jaccard_min, cosine_min, keywords_then_cosine[, same_type]}; every decider
    # runs each
    cascades: list = field(
        default_factory=lambda: [
            {
                "name": "dimmem",
                "jaccard_min": consolidator_spec.JACCARD,
                "cosine_min": consolidator_spec.COSINE,
                "keywords_then_cosine": True,
            }  # fmt: skip
        ]
    )
    ks: list = field(default_factory=lambda: [1, 5, 10])
    top_k: int = 20
    # where superseded and merged records rank (memdistill.runtime.retrieval.HISTORY; HISTORY_NOTE below)
    history: str = "after"
    embedding_model: str = "embedded:minilm"
    output_dir: str = "runs/eval-consolidation"


def ordered(bank: MemoryBank, positions: dict) -> list[MemoryItem]:
    """Records in the order they were said: conversation, source turn position, then bank order."""
    return sorted(bank.items, key=lambda it: (it.conversation_id, positions[it.conversation_id].get(it.turn_id, 10**6)))


def fresh_copy(items: list[MemoryItem]) -> list[MemoryItem]:
    return [MemoryItem.from_json(it.to_json(), "bank") for it in items]


def runs(cfg: ConsolidationEvalConfig) -> list[tuple[str, str, dict | None]]:
    """(run name, decider, cascade): `none` once, every other decider under every cascade."""
    out = []
    for d in cfg.deciders:
        if d == "none":
            out.append(("none", d, None))
        else:
            out += [(f"{d} / {c['name']}" if len(cfg.cascades) > 1 else d, d, c) for c in cfg.cascades]
    return out


def decider(name: str, cfg: ConsolidationEvalConfig, seed=None):
    if name == "gold":
        text = {m["memory_id"]: m["content"] for m in seed.memories}
        table = {
            (text[p["new"]], text[p["existing"]]): p for p in seed.pairs if isinstance(p["new"], str)
        }  # fmt: skip

        def gold(pairs):
            out = []
            for n, o in pairs:
                p = table.get((n.content, o.content), {"action": "KEEPBOTH"})
                merged = consolidator_spec.MergedRecord.model_validate(p["merged"]) if p.get("merged") else None
                out.append(consolidator_spec.ParseResult(p["action"], merged, ok=True))
            return out

        return gold
    if name == "rule":
        return lambda pairs: [
            consolidator_spec.ParseResult(consolidator_spec.rule_action(n, o), ok=True) for n, o in pairs
        ]
    if name == "consolidator":
        from memdistill.core.encoder import Encoder

        enc = Encoder(cfg.consolidator)
        return lambda pairs: [consolidator_spec.ParseResult(a, ok=True) for a in enc.actions(pairs)]
    raise ConfigError(f"deciders: unknown {name!r}; expected some of {DECIDERS}")


def lightmem(items: list[MemoryItem], embed) -> tuple[int, int]:
    """An embedding-only update (LightMem): every record embedded against every earlier record of its
    conversation; (comparisons, pairs at cosine >= 0.85 it would merge)."""
    pairs = merges = 0
    by_conv: dict = {}
    for it in items:
        by_conv.setdefault(it.conversation_id, []).append(it)
    for group in by_conv.values():
        v = embed([it.content for it in group])
        sims = v @ v.T
        pairs += len(group) * (len(group) - 1) // 2
        merges += sum(int((sims[j, :j] >= consolidator_spec.LIGHTMEM_COSINE).sum()) for j in range(len(group)))
    return pairs, merges


def first_rank(hits, match) -> int | None:
    """1-based rank of the first hit whose item `match` accepts; None when no hit does."""
    return next((r for r, h in enumerate(hits, 1) if match(h.item)), None)


def holders(bank: MemoryBank, memory_id: str) -> set[str]:
    """The record and every merged record it went into (a merged record still holds what it merged)."""
    out, it = set(), bank.get(memory_id)
    while it is not None and it.memory_id not in out:
        out.add(it.memory_id)
        it = bank.get(it.merged_into) if it.merged_into else None
    return out


def _above(cur, old) -> bool:
    return cur is not None and (old is None or cur < old)


def search(bank: MemoryBank, questions, embed, cfg: ConsolidationEvalConfig) -> dict:
    rt = MemoryRuntime(bank, embed, cfg.top_k, history=cfg.history)
    rows = []
    for q in questions:
        hits = rt.rank(q.question, q.conversation_id, route=False)
        row = {"question_id": q.question_id, "ku": q.update_turns is not None}
        for k in cfg.ks:
            row[f"recall@{k}"] = evidence_coverage(hits[:k], q.evidence)[0] if q.evidence else None
        if q.update_turns:
            cur, old = (first_rank(hits, lambda it, t=t: t in it.source_turns) for t in q.update_turns)
            row.update(turn_current_rank=cur, turn_replaced_rank=old, newer_turn_above=_above(cur, old))
            if q.update_records and all(bank.get(m) for m in q.update_records):
                held = [holders(bank, m) for m in q.update_records]
                cur, old = (first_rank(hits, lambda it, h=h: it.memory_id in h) for h in held)
                row.update(current_rank=cur, replaced_rank=old, newer_above=_above(cur, old))
        rows.append(row)
    return summarise(rows, cfg.ks)


def summarise(rows: list[dict], ks) -> dict:
    ku = [r for r in rows if r["ku"]]
    out: dict = {"questions": len(rows), "ku_questions": len(ku)}
    for key in ("newer_above", "newer_turn_above"):
        above = [float(r[key]) for r in ku if key in r]
        out[key] = round(sum(above) / len(above), 4) if above else None
        out[f"{key}_ci95"] = bootstrap_ci(lambda idx, a=above: sum(a[i] for i in idx) / len(idx), len(above))
    for name, sub in (("all", rows), ("ku", ku)):
        ev = [r for r in sub if r[f"recall@{ks[0]}"] is not None]
        for k in ks:
            vals = [r[f"recall@{k}"] for r in ev]
            out[f"{name}_recall@{k}"] = round(sum(vals) / len(vals), 4) if vals else None
            mean = lambda idx, v=vals: sum(v[i] for i in idx) / len(idx)  # noqa: E731
            out[f"{name}_recall@{k}_ci95"] = bootstrap_ci(mean, len(vals))
    out["rows"] = rows
    return out


HISTORY_NOTE = {
    "after": "current records first, then history by score but never above the record that replaced it",
    "mixed": "records by score alone, current or not",
    "drop": "current records only",
}


def run(cfg: ConsolidationEvalConfig) -> Path:
    from memdistill.core.embedder import Embedder
    from memdistill.core.models import model_path

    labels = cfg.labels or [b if b == "gold" else Path(b.split(":", 1)[-1]).stem for b in cfg.banks]
    if len(labels) != len(cfg.banks):
        raise ConfigError(f"labels: {len(labels)} labels for {len(cfg.banks)} banks")
    if cfg.history not in HISTORY:
        raise ConfigError(f"history: {cfg.history!r} is not one of {HISTORY}")
    unknown = [d for d in cfg.deciders if d not in DECIDERS]
    if unknown:
        raise ConfigError(f"deciders: unknown {unknown}; expected some of {DECIDERS}")
    if "consolidator" in cfg.deciders and not (Path(cfg.consolidator) / "config.json").exists():
        raise ConfigError(f"consolidator: no exported model at {cfg.consolidator} (run `make train-consolidator`)")
    convs, questions, _, seed = load_questions("seed", cfg.seed_dir, cfg.split)
    if not any(q.update_turns for q in questions):
        raise ValueError(f"{cfg.seed_dir}: no knowledge-update question in the {cfg.split} split")
    positions = {c: {t.turn_id: k for k, t in enumerate(v.turns)} for c, v in convs.items()}
    need = {"name", "jaccard_min", "cosine_min", "keywords_then_cosine"}
    for c in cfg.cascades:
        if not need <= set(c) <= need | {"same_type", "one_change"}:
            raise ConfigError(
                f"cascades: {c} needs name, jaccard_min, cosine_min, keywords_then_cosine (same_type, one_change "
                "optional)"
            )
    deciders = {d: decider(d, cfg, seed) for d in cfg.deciders if d != "none"}
    embed = Embedder(model_path(cfg.embedding_model))
    out = run_dir(cfg.output_dir)
    (out / "decisions").mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for spec, label in zip(cfg.banks, labels):
        if spec == "gold":
            base = MemoryBank.from_seed(seed, convs)
        elif spec.startswith("records:"):
            base = MemoryBank(
                [it for it in MemoryBank.from_jsonl(spec.split(":", 1)[1]).items if it.conversation_id in convs]
            )
        else:
            raise ConfigError(f"banks: {spec!r} is neither gold nor records:FILE")
        items = ordered(base, positions)
        pairs, lightmem_merges = lightmem(items, embed)
        results[label] = {
            "bank": spec,
            "records": len(items),
            "lightmem_pairs": pairs,
            "lightmem_merges": lightmem_merges,
        }
        for name, d, cascade in runs(cfg):
            if d == "gold" and spec != "gold":
                continue
            t0 = time.time()
            if cascade is None:
                bank, cons = MemoryBank(fresh_copy(items)), None
            else:
                bank = MemoryBank([])
                # a cascade's keys (checked above) are the Consolidator's own field names
                cons = Consolidator(deciders[d], embed, **{k: v for k, v in cascade.items() if k != "name"})
                for it in fresh_copy(items):
                    cons.add(bank, it)
                cons.save_log(out / "decisions" / f"{label}-{name.replace(' / ', '-')}.jsonl")
            res = search(bank, questions, embed, cfg)
            actions = Counter(d["action"] for d in cons.log) if cons else Counter()
            merges = sum(1 for d in cons.log if d.get("merged")) if cons else 0
            res.update(
                seconds=round(time.time() - t0, 1),
                cascade=cons.stats.to_json() if cons else None,
                decisions={a: actions[a] for a in consolidator_spec.ACTIONS},
                merges=merges,
                compression=round(merges / pairs, 4) if pairs else 0.0,
                superseded=sum(1 for it in bank.items if it.status == "superseded"),
            )
            results[label][name] = res
    meta = {"split": cfg.split, "seed_dir": cfg.seed_dir, "cascades": cfg.cascades,
            "runs": [n for n, _, _ in runs(cfg)], "consolidator": cfg.consolidator, "ks": cfg.ks,
            "history": cfg.history, "questions": len(questions),
            "ku_questions": sum(1 for q in questions if q.update_turns)}  # fmt: skip
    write_json(out / "results.json", {"meta": meta, "results": results})
    write_report(out, meta, results, cfg)
    return out


def write_report(out: Path, meta: dict, results: dict, cfg: ConsolidationEvalConfig) -> None:
    L = [
        f"# Memory update on the gold {meta['split']} split",
        "",
        "Cascades: "
        + "; ".join(
            f"{c['name']}: "
            + ("same memory_type, " if c.get("same_type", True) else "any memory_type, ")
            + f"keyword Jaccard > {c['jaccard_min']} "
            + ("then cosine" if c["keywords_then_cosine"] else "or cosine")
            + f" >= {c['cosine_min']}"
            + ("; one change per new record" if c.get("one_change") else "")
            for c in meta["cascades"]
        )
        + f". Consolidator: `{meta['consolidator']}`. {meta['questions']} questions, {meta['ku_questions']} of them "
        "knowledge-update. Search: plain question, BM25 + dense, "
        + HISTORY_NOTE[meta["history"]]
        + ". Brackets: 95% bootstrap intervals over questions.",
        "",
        "## Update efficiency (DimMem Table 5 layout)",
        "",
    ]
    rows = []
    for label, r in results.items():
        for name in [n for n in meta["runs"] if n in r]:
            c = r[name]["cascade"]
            if c is None:
                continue
            saved = round(1 - c["embedding_comparisons"] / r["lightmem_pairs"], 4) if r["lightmem_pairs"] else 0.0
            rows.append([f"{label} / {name}", r["lightmem_pairs"], c["embedding_comparisons"], saved,
                         c["candidates"], r[name]["merges"], r[name]["compression"], r["lightmem_merges"]])  # fmt: skip
    L += md_table(["bank / decider", "embed. count (LightMem: all earlier pairs)", "embed. count (cascade)",
                   "embed. saved", "decisions asked", "merges", "compression", "LightMem merges (cos >= 0.85)"],
                  rows)  # fmt: skip
    L += ["", "## Decisions and retrieval", ""]
    ks = cfg.ks
    rows = []
    for label, r in results.items():
        for name in [n for n in meta["runs"] if n in r]:
            s = r[name]
            d = s["decisions"]
            rows.append([f"{label} / {name}", d["MERGE"], d["SUPERSEDE"], d["KEEPBOTH"], s["superseded"],
                         rate_cell(s, "newer_above"), rate_cell(s, "newer_turn_above")]
                        + [rate_cell(s, f"ku_recall@{k}") for k in ks]
                        + [rate_cell(s, f"all_recall@{k}") for k in ks])  # fmt: skip
    L += md_table(["bank / decider", "MERGE", "SUPERSEDE", "KEEPBOTH", "records superseded",
                   "KU: newer record above", "KU: newer turn above"]
                  + [f"KU R@{k}" for k in ks] + [f"all R@{k}" for k in ks], rows)  # fmt: skip
    L += ["", "![knowledge-update questions](ku.png)", ""]
    (out / "report.md").write_text("\n".join(L))
    keys = ["newer_above", "newer_turn_above", f"ku_recall@{ks[-1]}", f"all_recall@{ks[-1]}"]
    values, intervals = bars_of(
        {f"{label} / {n}": r[n] for label, r in results.items() for n in meta["runs"] if n in r}, keys
    )
    grouped_bars(
        out / "ku.png",
        values,
        ["KU newer record above", "KU newer turn above", f"KU R@{ks[-1]}", f"all R@{ks[-1]}"],
        intervals=intervals,
        title=f"memory update, gold {meta['split']} split",
    )


def main(argv=None) -> int:
    return print_report(run(job_config(ConsolidationEvalConfig, argv, "memdistill eval-consolidation", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
