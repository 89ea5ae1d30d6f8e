"""Agreement between the gold labels and a blind second reading of a sample (data/seed/second_reading/).

  python -m memdistill.data.agreement [SEED_DIR] [SECOND_DIR]     (prints a Markdown report, writes agreement.json)

The second reader saw only the turns (and the questions' text): records.jsonl holds the DimMem records they wrote
for a sample of sessions, evidence.jsonl the turns they found holding each question's answer. Measured:
- which turns hold a record: agreement and Cohen's kappa over the sample's turns;
- records: a second record matches a gold record of the same turn when their contents share words (token F1 of
  the lower-cased words >= MATCH_F1, one to one, best pairs first); precision = matched second / second, recall =
  matched gold / gold, F1; on matched pairs, how often memory_type and time agree;
- questions' evidence: per question, F1 of the two turn sets (both empty = 1: both call it unanswerable), and
  the share of questions with identical sets.
- memory-tree nodes (tree_check.jsonl): the second reader split a sample of nodes into atomic claims and checked
  each against the window's turns; per level and overall, the share of claims supported, wrong, unsupported or
  foreknowledge (from a later session), the unsupported ones that are true but come from outside the node's
  window, and omissions per node.
Every rate carries a 95% bootstrap interval over its units (turns, sessions, questions; claims by node).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from memdistill.core.io import load_jsonl, write_json
from memdistill.data import seed as seedlib
from memdistill.metrics.stats import bootstrap_ci, mean_ci, rate_ci

MATCH_F1 = 0.5
_WORD = re.compile(r"[a-z0-9]+")


def token_f1(a: str, b: str) -> float:
    x, y = Counter(_WORD.findall(a.lower())), Counter(_WORD.findall(b.lower()))
    common = sum((x & y).values())
    if not common:
        return 0.0
    p, r = common / sum(y.values()), common / sum(x.values())
    return 2 * p * r / (p + r)


def match(gold: list[dict], second: list[dict]) -> list[tuple[dict, dict]]:
    """One-to-one pairs of records of the same turn whose contents share enough words, best first."""
    cands = sorted(
        (
            (token_f1(g["content"], s["content"]), i, j)
            for i, g in enumerate(gold)
            for j, s in enumerate(second)
            if g["source_turn_id"] == s["source_turn_id"]
        ),
        reverse=True,
    )
    used_g, used_s, out = set(), set(), []
    for f, i, j in cands:
        if f >= MATCH_F1 and i not in used_g and j not in used_s:
            used_g.add(i), used_s.add(j)
            out.append((gold[i], second[j]))
    return out


def _kappa(a: list[bool], b: list[bool]) -> float:
    n = len(a)
    if not n:
        return 0.0
    po = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return round((po - pe) / (1 - pe), 4) if pe < 1 else 1.0


def records_agreement(seed: seedlib.Seed, second: list[dict]) -> dict:
    sessions = sorted({(r["conversation_id"], r["source_turn_id"].split(":")[0][1:]) for r in second})
    turns = [(cid, t.turn_id) for cid, s in sessions for t in seed.conversations[cid].sessions[int(s) - 1].turns]
    gold_by, second_by = {}, {}
    for m in seed.memories:
        gold_by.setdefault((m["conversation_id"], m["source_turn_id"]), []).append(m)
    for r in second:
        second_by.setdefault((r["conversation_id"], r["source_turn_id"]), []).append(r)
    g_has = [bool(gold_by.get(k)) for k in turns]
    s_has = [bool(second_by.get(k)) for k in turns]
    per_turn = []  # (gold records, second records, matched pairs) per turn
    for k in turns:
        g, s = gold_by.get(k, []), second_by.get(k, [])
        per_turn.append((len(g), len(s), match(g, s)))

    def prf(idx):
        tp = sum(len(per_turn[i][2]) for i in idx)
        g, s = sum(per_turn[i][0] for i in idx), sum(per_turn[i][1] for i in idx)
        p, r = (tp / s if s else 0.0), (tp / g if g else 0.0)
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    every = list(range(len(turns)))
    pairs = [pair for _, _, m in per_turn for pair in m]
    p, r, f = prf(every)
    return {
        "sessions": len(sessions),
        "turns": len(turns),
        "gold_records": sum(x[0] for x in per_turn),
        "second_records": sum(x[1] for x in per_turn),
        "turn_holds_record": rate_ci([a == b for a, b in zip(g_has, s_has)]) | {"kappa": _kappa(g_has, s_has)},
        "record_precision": {"rate": round(p, 4), "ci95": bootstrap_ci(lambda i: prf(i)[0], len(turns))},
        "record_recall": {"rate": round(r, 4), "ci95": bootstrap_ci(lambda i: prf(i)[1], len(turns))},
        "record_f1": {"rate": round(f, 4), "ci95": bootstrap_ci(lambda i: prf(i)[2], len(turns))},
        "matched_memory_type": rate_ci(
            [g["dimension"]["memory_type"] == s["dimension"]["memory_type"] for g, s in pairs]
        ),
        "matched_time": rate_ci([g["dimension"]["time"] == s["dimension"]["time"] for g, s in pairs]),
    }


def evidence_agreement(seed: seedlib.Seed, second: list[dict]) -> dict:
    gold = {q["question_id"]: set(q.get("evidence") or []) for q in seed.questions}
    unanswerable = {q["question_id"] for q in seed.questions if q.get("category") in seedlib.UNANSWERABLE}
    f1s, same, both_none = [], [], []
    for row in second:
        g, s = gold[row["question_id"]], set(row["evidence"])
        if row["question_id"] in unanswerable:
            both_none.append(not s)
            continue
        tp = len(g & s)
        f1s.append(2 * tp / (len(g) + len(s)) if g or s else 1.0)
        same.append(g == s)
    return {
        "questions": len(second),
        "answerable": len(f1s),
        "evidence_f1": mean_ci(f1s),
        "identical_evidence": rate_ci(same),
        "unanswerable_found_empty": rate_ci(both_none),
    }


CLAIMS = ("supported", "wrong", "unsupported", "foreknowledge")


def tree_check(seed: seedlib.Seed, rows: list[dict]) -> dict:
    """Claim shares over the checked nodes, resampled by node (a node's claims stay together)."""
    level = {r["node_id"]: r["level"] for r in seed.tree}
    unknown = [r["node_id"] for r in rows if r["node_id"] not in level]
    if unknown:
        raise ValueError(f"tree_check.jsonl: nodes not in tree.jsonl: {unknown[:5]}")

    def shares(group: list[dict]) -> dict:
        out = {"nodes": len(group), "claims": sum(r["claims"] for r in group)}
        # out_of_window_true: unsupported claims the reader found true but taken from outside the node's window
        for k in (*CLAIMS, "out_of_window_true"):

            def stat(idx, k=k):
                return sum(group[i].get(k, 0) for i in idx) / max(1, sum(group[i]["claims"] for i in idx))

            out[k] = {"rate": round(stat(range(len(group))), 4), "ci95": bootstrap_ci(stat, len(group))}
        out["omissions_per_node"] = mean_ci([float(r["omissions"]) for r in group])
        return out

    by_level = {
        f"L{lvl}": shares([r for r in rows if level[r["node_id"]] == lvl]) for lvl in sorted(set(level.values()))
    }
    return {"overall": shares(rows), "by_level": {k: v for k, v in by_level.items() if v["nodes"]}}


def report(seed_dir: Path, second_dir: Path) -> dict:
    seed = seedlib.load(seed_dir)
    out = {
        "records": records_agreement(seed, load_jsonl(second_dir / "records.jsonl")),
        "evidence": evidence_agreement(seed, load_jsonl(second_dir / "evidence.jsonl")),
        "match_token_f1": MATCH_F1,
    }
    if (second_dir / "tree_check.jsonl").exists():
        out["tree"] = tree_check(seed, load_jsonl(second_dir / "tree_check.jsonl"))
    return out


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seed_dir = Path(args[0]) if args else seedlib.SEED_DIR
    second_dir = Path(args[1]) if len(args) > 1 else seed_dir / "second_reading"
    out = report(seed_dir, second_dir)
    write_json(second_dir / "agreement.json", out)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
