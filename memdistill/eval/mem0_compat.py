"""mem0's own `add()` and `search()` on the gold test conversations, fed session by session as a mem0 user
would, with mem0's LLM pointed at different endpoints side by side.

  memdistill eval-mem0 --config configs/eval/mem0_cpu.yaml [key=value ...]     (make eval-mem0)

Arms (`arms` in the config, run one after the other, each with its own vLLM server and mem0 store):
  via: mem0   mem0's own prompt straight to vLLM serving `extractor` (mem0 as shipped, on a small local model)
  via: front  the same mem0 through the compatibility front (memdistill.serve.front) over `extractor`
  via: raw    mem0 with infer=False: the messages themselves are the memories, no LLM (the trivial baseline)
A multi-party session goes in as mem0's LoCoMo evaluation feeds it: the first speaker's messages as "user",
the other's as "assistant", each content prefixed "Name: "; a user-assistant chat with its own roles. mem0
2.2.1 OSS refuses a timestamp on add(), so its prompt carries today's date, for every arm alike.

Per arm: adds that stored at least one memory, memories stored, adds that failed (and why), input tokens
per add (mem0's prompt, counted with the arm model's tokenizer and chat template; and what the compact model
read, from the front's request log), p50 / p95 latency of add(), and per gold question with evidence records
whether mem0's search (top 10, threshold 0) returns a memory matching one of them at MiniLM cosine >= 0.7
(the extraction metric's threshold) in its top 5 and top 10, with 95% bootstrap intervals over questions.
A finished arm's results are kept (arms/<name>/summary.json) and skipped on a rerun.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from memdistill.core.config import ConfigError, from_mapping, job_config
from memdistill.core.io import load_jsonl, write_json, write_text
from memdistill.core.report import ci_cell, grouped_bars, md_table, print_report
from memdistill.metrics.stats import percentile, rate_ci
from memdistill.spec.dialogue import Conversation, Session, message_text

VIAS = ("mem0", "front", "raw")


@dataclass
class Arm:
    name: str
    via: str  # mem0 | front | raw
    extractor: str | None = None  # a model directory or embedded:<name>; none for raw
    max_model_len: int = 4096


@dataclass
class Mem0EvalConfig:
    seed_dir: str = "data/seed"
    split: str = "test"
    output_dir: str = "runs/eval-mem0"
    serve_config: str = "configs/serving/cpu.yaml"
    arms: list = field(default_factory=list)  # [{name, via, extractor, max_model_len}]
    front_max_tokens: int = 384  # per window, as configs/eval/e2e_cpu.yaml
    match_threshold: float = 0.7
    top_k: list = field(default_factory=lambda: [5, 10])
    conversations: int | None = None  # the first n of the split (a smoke run); null = all


def mem0_messages(conv: Conversation, session: Session) -> list[dict]:
    if conv.style == "user-assistant":
        return [{"role": t.role, "content": message_text(t)} for t in session.turns]
    first = conv.speakers[0] if conv.speakers else session.turns[0].speaker
    return [
        {"role": "user" if t.speaker == first else "assistant", "content": f"{t.speaker}: {message_text(t)}"}
        for t in session.turns
    ]


class _Recorder:
    """Wraps mem0's LLM call to keep the messages it sends (what a user's bill is made of)."""

    def __init__(self, llm):
        self.calls, self._orig = [], llm.generate_response
        llm.generate_response = self

    def __call__(self, messages, **kwargs):
        self.calls.append(messages)
        return self._orig(messages, **kwargs)


def run_arm(cfg: Mem0EvalConfig, arm: Arm, seed, convs: list[Conversation], out: Path, embed) -> dict:
    from memdistill.serve.adapters import local_mem0

    shutil.rmtree(out, ignore_errors=True)  # an arm cut short starts over: its mem0 store is incomplete
    out.mkdir(parents=True)
    if arm.via == "raw":
        return measure(cfg, arm, seed, convs, local_mem0(out / "mem0"), None, out, embed)

    from transformers import AutoTokenizer

    from memdistill.core.models import model_path
    from memdistill.eval.generate import private_serve_config
    from memdistill.serve.server import Servers, free_port, resolve_extractor

    model = model_path(arm.extractor)
    front = {"port": free_port(), "log": str(out / "front.jsonl"), "max_tokens": cfg.front_max_tokens}
    scfg = private_serve_config(cfg.serve_config, model, arm.max_model_len, [f"front={json.dumps(front)}"])
    tokenizer = AutoTokenizer.from_pretrained(resolve_extractor(scfg))
    with Servers(scfg, log_dir=str(out / "logs"), front=arm.via == "front") as servers:
        url = f"{servers.front_url}/v1" if arm.via == "front" else f"{servers.urls[0]}/v1"
        mem = local_mem0(out / "mem0", llm_base_url=url, llm_model=scfg.served_model_name)
        return measure(cfg, arm, seed, convs, mem, tokenizer, out, embed)


def measure(cfg, arm: Arm, seed, convs, mem, tokenizer, out: Path, embed) -> dict:
    from tqdm import tqdm

    from memdistill.spec.render import prompt_ids

    rec = _Recorder(mem.llm) if arm.via != "raw" else None
    adds = []
    sessions = [(c, s) for c in convs for s in c.sessions]
    for conv, session in tqdm(sessions, desc=f"mem0 add ({arm.name})", unit="session"):
        n_calls = len(rec.calls) if rec else 0
        t0, error, stored = time.time(), None, []
        try:
            stored = mem.add(mem0_messages(conv, session), user_id=conv.conversation_id, infer=arm.via != "raw")[
                "results"
            ]
        except Exception as e:  # noqa: BLE001 - a failed add is a measured outcome (mem0 raises LLMError)
            error = f"{type(e).__name__}: {str(e)[:300]}"
        row = {
            "conversation_id": conv.conversation_id,
            "session_id": session.session_id,
            "messages": len(session.turns),
            "stored": len(stored),
            "latency_s": round(time.time() - t0, 3),
            "error": error,
        }
        if rec and len(rec.calls) > n_calls:
            row["mem0_prompt_tokens"] = len(prompt_ids(tokenizer, rec.calls[-1]))
        adds.append(row)
    if arm.via == "front":  # what the compact model read, one log line per add mem0 made
        log = [e for e in load_jsonl(out / "front.jsonl") if e.get("kind") == "mem0_add" and "error" not in e]
        asked = [a for a in adds if "mem0_prompt_tokens" in a]
        if len(log) != len(asked):
            raise RuntimeError(f"{out / 'front.jsonl'}: {len(log)} answered adds logged, {len(asked)} made")
        for a, e in zip(asked, log):
            a.update(compact_prompt_tokens=e["compact_prompt_tokens"], front_problems=e["problems"])
    write_json(out / "adds.json", adds)

    qs = [q for q in seed.rows("questions", cfg.split) if q["conversation_id"] in {c.conversation_id for c in convs}]
    qs = [q for q in qs if q.get("evidence_memory_ids")]
    ks, per_q = sorted(cfg.top_k), []
    for q in tqdm(qs, desc=f"mem0 search ({arm.name})", unit="question"):
        hits = mem.search(q["question"], top_k=ks[-1], filters={"user_id": q["conversation_id"]}, threshold=0.0)
        texts = [h["memory"] for h in hits.get("results", [])]
        gold = [seed.memory(m)["content"] for m in q["evidence_memory_ids"]]
        rank = None
        if texts:
            sims = embed(texts) @ embed(gold).T
            rank = next((i + 1 for i, row in enumerate(sims) if row.max() >= cfg.match_threshold), None)
        per_q.append({"question_id": q["question_id"], "first_match_rank": rank, "top": texts[:3]})
    write_json(out / "questions.json", per_q)

    def tokens(key):
        vals = [a[key] for a in adds if key in a]
        return round(sum(vals) / len(vals), 1) if vals else None

    lat = [a["latency_s"] for a in adds]
    errors = [a["error"] for a in adds if a["error"]]
    summary = {
        "arm": vars(arm),
        "adds": len(adds),
        "adds_storing": rate_ci([a["stored"] > 0 for a in adds]),
        "memories_stored": sum(a["stored"] for a in adds),
        "adds_failed": len(errors),
        "first_error": errors[0] if errors else None,
        "mem0_prompt_tokens_per_add": tokens("mem0_prompt_tokens"),
        "compact_prompt_tokens_per_add": tokens("compact_prompt_tokens"),
        "latency_p50_s": percentile(lat, 0.5),
        "latency_p95_s": percentile(lat, 0.95),
        "questions": len(per_q),
        "hit": {
            str(k): rate_ci([r["first_match_rank"] is not None and r["first_match_rank"] <= k for r in per_q])
            for k in ks
        },
    }
    write_json(out / "summary.json", summary)
    return summary


def run(cfg: Mem0EvalConfig) -> Path:
    from memdistill.core.embedder import Embedder
    from memdistill.data import seed as seedlib

    arms = [from_mapping(Arm, a, f"arms[{i}]") for i, a in enumerate(cfg.arms)]
    for i, a in enumerate(arms):
        if a.via not in VIAS:
            raise ConfigError(f"arms[{i}] ({a.name}): via {a.via!r} is not one of {VIAS}")
        if a.via != "raw" and not a.extractor:
            raise ConfigError(f"arms[{i}] ({a.name}): via {a.via} needs an extractor")
    if not arms:
        raise ConfigError("arms: nothing to measure")
    seed = seedlib.load(cfg.seed_dir)
    convs = [c for cid, c in seed.conversations.items() if seed.split[cid] == cfg.split][: cfg.conversations]
    out = Path(cfg.output_dir)
    embed = Embedder()
    results = {}
    for a in arms:
        d = out / "arms" / re.sub(r"[^A-Za-z0-9.]+", "-", a.name).strip("-")
        done = d / "summary.json"
        results[a.name] = json.loads(done.read_text()) if done.exists() else run_arm(cfg, a, seed, convs, d, embed)
    write_json(out / "metrics.json", {"split": cfg.split, "conversations": len(convs), "arms": results})
    write_report(out, results, cfg, len(convs))
    return out


def write_report(out: Path, results: dict, cfg: Mem0EvalConfig, n_convs: int) -> None:
    ks = sorted(cfg.top_k)
    any_r = next(iter(results.values()))
    lines = [
        "# mem0's own add() / search() with memdistill behind it",
        "",
        f"Gold {cfg.split} split: {n_convs} conversations, {any_r['adds']} sessions (one add() each), "
        f"{any_r['questions']} questions with gold evidence records. Command: `make eval-mem0` "
        "(`memdistill eval-mem0 --config configs/eval/mem0_cpu.yaml`).",
        "",
        "A question is a hit@k when mem0's search returns, in its top k, a memory within MiniLM cosine "
        f"{cfg.match_threshold} of one of the question's gold evidence records. Intervals: 95% bootstrap.",
        "",
    ]
    header = [
        "arm",
        "adds storing >= 1",
        "memories",
        "failed adds",
        "mem0 prompt tok/add",
        "compact model read tok/add",
    ]
    header += ["p50 s/add", "p95 s/add"] + [f"hit@{k}" for k in ks]
    rows = []
    for name, r in results.items():
        s = r["adds_storing"]
        rows.append(
            [name, ci_cell(s["rate"], s["ci95"], ".2f"), r["memories_stored"], r["adds_failed"]]
            + [r["mem0_prompt_tokens_per_add"] or "-", r["compact_prompt_tokens_per_add"] or "-"]
            + [r["latency_p50_s"], r["latency_p95_s"]]
            + [ci_cell(r["hit"][str(k)]["rate"], r["hit"][str(k)]["ci95"], ".3f") for k in ks]
        )
    lines += md_table(header, rows) + [""]
    for name, r in results.items():
        if r["first_error"]:
            lines.append(f"- {name}: {r['adds_failed']} of {r['adds']} adds failed; the first: `{r['first_error']}`")
    lines += ["", "![hit@k](hit_at_k.png)", ""]
    write_text(out / "report.md", "\n".join(lines))
    grouped_bars(
        out / "hit_at_k.png",
        {name: [r["hit"][str(k)]["rate"] for k in ks] for name, r in results.items()},
        [f"hit@{k}" for k in ks],
        "mem0 search: a gold evidence record matched in the top k",
    )


def main(argv=None) -> int:
    return print_report(run(job_config(Mem0EvalConfig, argv, "memdistill eval-mem0", __doc__)))


if __name__ == "__main__":
    sys.exit(main())
