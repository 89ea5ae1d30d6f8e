"""eval-e2e's memory-tree rows: TiMem's temporal memory tree built over each bank and recalled flat or
hierarchically (seed 000, Tables 3-6), beside the bank's own rows.

A row is named "<recall> <levels> <scope>[+gate][@k]": recall `hierarchical` or `flat`; levels `L1-L5` (all),
`L1` (leaves only) or `L2-L5` (summaries only); scope a fixed complexity (`simple`, `hybrid`, `complex`:
its levels and Table 7 budgets) or `planned` (the planner hook picks it per question); `+gate` filters the
candidates with the gate hook; `@k` sets how many nodes a flat row reads (default: top_k), so a flat row can
be matched to a hierarchical one's tokens. Node texts come from `tree_writer`: `gold` (data/seed/tree.jsonl), `lead`
(no model: the children's first sentences) or an OpenAI-compatible URL (the level summarizer, or any LM
zero-shot, through `MemoryModels.summarize`).
"""

from __future__ import annotations

import re
from pathlib import Path

from memdistill.core.config import ConfigError
from memdistill.core.report import md_table, rate_cell
from memdistill.runtime.tree import RECALLS, SCOPES, MemoryTree, TreeRecall, gold_writer, lead_writer, lm_writer

LEVEL_SETS = {"L1-L5": (1, 2, 3, 4, 5), "L1": (1,), "L2-L5": (2, 3, 4, 5)}
_ROW = re.compile(r"^(?P<recall>\w+) (?P<levels>L[0-9](?:-L[0-9])?) (?P<scope>\w+)(?P<gate>\+gate)?(?:@(?P<k>\d+))?$")


def parse_row(spec: str) -> dict:
    m = _ROW.match(spec.strip())
    ok = m and m["recall"] in RECALLS and m["levels"] in LEVEL_SETS and m["scope"] in (*SCOPES, "planned")
    if not ok:
        raise ConfigError(
            f"trees: {spec!r}: expected '<recall> <levels> <scope>[+gate][@k]' with recall in {RECALLS}, levels in "
            f"{sorted(LEVEL_SETS)}, scope in {sorted(SCOPES)} or planned (e.g. 'hierarchical L1-L5 planned+gate')"
        )
    k = int(m["k"]) if m["k"] else None
    return {
        "recall": m["recall"],
        "levels": LEVEL_SETS[m["levels"]],
        "scope": m["scope"],
        "gate": bool(m["gate"]),
        "k": k,
    }


def check_rows(specs: list, hooks: dict) -> list[dict]:
    rows = [parse_row(s) for s in specs]
    for spec, r in zip(specs, rows):
        for hook, needed in (("planner", r["scope"] == "planned"), ("gate", r["gate"])):
            if needed and hook not in hooks:
                raise ConfigError(f"trees: {spec!r} needs the {hook} hook (hooks: [{hook}], or hooks_models)")
    return rows


def writer_for(cfg, seed, convs: dict):
    """The node writer `tree_writer` names; gold nodes must cover every conversation of the run."""
    if cfg.tree_writer == "gold":
        if seed is None:
            raise ConfigError("tree_writer=gold needs the seed corpus (dataset: seed)")
        have = {r["conversation_id"] for r in seed.tree}
        missing = sorted(set(convs) - have)
        if missing:
            raise ConfigError(
                f"tree_writer=gold: data/seed/tree.jsonl has no nodes for {len(missing)} conversation(s) of the run "
                f"({', '.join(missing[:5])}); gold nodes cover {len(have)} (set conversation_length=long, or "
                "tree_writer=lead / an endpoint URL)"
            )
        return gold_writer(seed)
    if cfg.tree_writer == "lead":
        return lead_writer()
    if cfg.tree_writer.startswith(("http://", "https://")):
        from memdistill.core.config import env_key
        from memdistill.serve.client import MemoryModels

        mm = MemoryModels(cfg.tree_writer, api_key=env_key(cfg.api_key_env, "api_key_env"), model=cfg.tree_writer_model)
        return lm_writer(mm)
    raise ConfigError(f"tree_writer {cfg.tree_writer!r}: expected gold, lead or an http(s) endpoint URL")


def build_tree(bank, convs: dict, write, path: Path, concurrency: int = 8) -> tuple[MemoryTree, dict]:
    """The bank's tree over every conversation (resumed from `path`; conversations written concurrently, each in
    its own order), and its consolidation calls against a flat bank (TiMem Table 5: one L1 call per message,
    plus one per node above)."""
    from concurrent.futures import ThreadPoolExecutor

    tree = MemoryTree(bank, convs, path)
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda cid: tree.close(cid, write, progress=True), convs))
    messages = sum(len(c.turns) for c in convs.values())
    nodes = sum(len(tree.nodes(cid, (2, 3, 4, 5))) for cid in convs)
    calls = {
        "conversations": len(convs),
        "l1_calls": messages,
        "tree_calls": messages + nodes,
        "nodes": nodes,
        "extra": round(nodes / messages, 4) if messages else 0.0,
        "skipped": tree.skipped[:20],
    }
    return tree, calls


def recall_for(tree: MemoryTree, row: dict, embed, hooks: dict, top_k: int) -> TreeRecall:
    planned = row["scope"] == "planned"
    return TreeRecall(
        tree,
        embed,
        row["levels"],
        row["recall"],
        planner=hooks["planner"] if planned else None,
        gate=hooks["gate"] if row["gate"] else None,
        complexity="hybrid" if planned else row["scope"],
        flat_k=row["k"] or top_k,
    )


def tree_section(meta: dict, results: dict) -> list[str]:
    rows, calls = [], []
    for label, r in results.items():
        if "tree_calls" in r:
            c = r["tree_calls"]
            calls.append(
                [
                    label,
                    meta["tree_writer"],
                    c["conversations"],
                    round(c["l1_calls"] / c["conversations"], 1),
                    round(c["tree_calls"] / c["conversations"], 1),
                    f"+{c['extra']:.1%}",
                ]
            )
        for spec, v in r.get("trees", {}).items():
            o = v["recall"]["overall"]
            rows.append(
                [
                    label,
                    spec,
                    rate_cell(o, "answer_coverage"),
                    rate_cell(o, "kept_recall"),
                    rate_cell(o, "recall@10"),
                    o["kept_per_query"],
                    o["tokens_per_query"],
                    f"{o.get('recall_p50_s', '-')} / {o.get('recall_p95_s', '-')}",
                ]
            )
    if not rows:
        return []
    lines = [
        "## Memory tree (TiMem Tables 3-6 layouts)",
        "",
        f"Nodes written by `{meta['tree_writer']}`. Answer coverage: the share of the gold answer's content "
        "words in the memories read (it credits summaries, which evidence recall does not: only leaves point "
        "at turns). Budgets and levels per scope: TiMem Table 7. Latency: recall alone (planner, scoring, "
        "gate), seconds p50 / p95.",
        "",
    ]
    lines += md_table(
        [
            "bank",
            "tree row",
            "answer coverage (read)",
            "evidence recall (read)",
            "leaf R@10",
            "memories read",
            _tok(meta),
            "recall s p50 / p95",
        ],
        rows,
    )
    lines += ["", "Consolidation calls per conversation (TiMem Table 5):", ""]
    lines += md_table(["bank", "nodes", "conversations", "flat L1 calls", "tree calls", "extra"], calls) + [""]
    return lines


def _tok(meta: dict) -> str:
    return f"tokens/query ({meta['token_counter']} tokenizer)"
