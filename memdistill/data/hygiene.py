"""Benchmark hygiene: a teacher build never trains on what an eval config evaluates.

`memdistill data --config configs/data/teacher_*.yaml` runs `check` after loading its sources and
before the first teacher request.

Registered eval sets. Every YAML file under `eval_configs` (configs/eval) is read as plain YAML (data
may not import eval):
- benchmark formats: an eval config's `dataset` when it is a benchmark release layout (locomo,
  longmemeval: configs/eval/e2e_locomo.yaml, e2e_longmemeval.yaml);
- evaluated files: an eval config's `data_path` (or `source: {format, path}`) when that file exists,
  loaded in its format;
- the gold corpus: the dev and test splits of the build's `seed_dir` (`make eval` evaluates test,
  `make ablate` dev), and the `split` of every eval config that names a seed directory (`seed_dir`, or
  `data_path` with dataset seed).

The rule has two parts, and neither looks at a file's name, so renaming or copying a file changes nothing:
1. Format: a source in a benchmark format is refused outright. Those loaders exist to read the
   benchmark releases, whose files are usually not on this disk to compare with (the e2e configs take
   data_path on the command line), and a renamed or trimmed copy keeps its format. Synthetic
   LoCoMo-style dialogues belong in chat-jsonl or seed format.
2. Content: every turn of MIN_TURN_WORDS+ words and every question of MIN_QUESTION_WORDS+ words of every
   source conversation is fingerprinted (sha256 of its lower-cased word sequence) and looked up among
   the same fingerprints of each eval set; a source conversation sharing any of them overlaps that set.
   That catches a converted copy: LoCoMo as chat-jsonl, the gold corpus under another name or with its
   splits edited. One exception: a seed-format conversation that carries the same gold split as the
   eval set it matches (the gold corpus itself) is no leak, because the build keeps it in that split
   (teacher labels of test conversations are dropped, those of dev conversations stay in dev).
Not seen: a conversion of an eval file that is not on disk (rule 1 covers only its format), and
paraphrases (the build's test-overlap pass removes near-copies of gold test text). LongMemEval's filler
sessions come from ShareGPT and UltraChat: with longmemeval_s.json on disk, rule 2 flags a chat corpus
that shares them.

On overlap the build stops with EvalOverlap naming each source file, the eval set with its config files,
and the overlapping ids. `allow_eval_overlap: "<reason>"` in the data config builds anyway; the reason
and the overlaps go into stats.json and DATASET_CARD.md, and from there into memdistill.json and the
model card of every model trained on the build (memdistill.core.report.dataset_overlap).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from memdistill.core.config import ConfigError
from memdistill.core.io import load_jsonl
from memdistill.data.sources import FORMATS, load

BENCHMARK_FORMATS = ("locomo", "longmemeval")  # release layouts of benchmarks; chat-jsonl, hf and seed are general
GOLD_HELD_OUT = ("dev", "test")
MIN_TURN_WORDS = 8  # shorter turns ("sounds great, see you then") recur across unrelated conversations
MIN_QUESTION_WORDS = 4  # the gold corpus's shortest question has 4 words
SHOW_IDS = 8
_WORD = re.compile(r"[a-z0-9]+")


class EvalOverlap(ConfigError):
    """A teacher build would train on an evaluated set and the data config does not allow it."""


def fingerprint(text: str, min_words: int) -> str | None:
    words = _WORD.findall(text.lower())
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:20] if len(words) >= min_words else None


@dataclass
class EvalSet:
    name: str
    configs: list[str]
    split: str | None = None  # the gold split, for sets of the gold corpus
    turns: dict[str, str] = field(default_factory=dict)  # fingerprint -> eval conversation id
    questions: dict[str, str] = field(default_factory=dict)

    def add(self, conv_id: str, turns, questions) -> None:
        for text, min_words, into in [(t, MIN_TURN_WORDS, self.turns) for t in turns] + [
            (q, MIN_QUESTION_WORDS, self.questions) for q in questions
        ]:
            if fp := fingerprint(text, min_words):
                into.setdefault(fp, conv_id)

    def where(self) -> str:
        return self.name + (f" (evaluated by {', '.join(self.configs)})" if self.configs else "")


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def eval_config_files(where: str) -> list[Path]:
    """The eval configs under `where`; a relative path missing from the working directory is looked up
    in the repository the package runs from, so a build started elsewhere is checked all the same."""
    root = Path(where)
    if not root.exists() and not root.is_absolute():
        root = Path(__file__).resolve().parents[2] / where
    if root.is_file():
        return [root]
    return sorted(p for p in root.glob("*.y*ml")) if root.is_dir() else []


def _questions(conv) -> list[str]:
    """The questions a LoCoMo sample (`qa`) or a LongMemEval instance (`question`) asks."""
    return [str(qa["question"]) for qa in conv.meta.get("qa") or [] if qa.get("question")] + (
        [conv.meta["question"]] if conv.meta.get("question") else []
    )


def registered(seed_dir: str, eval_configs: str) -> tuple[dict[str, list[str]], list[EvalSet]]:
    """({benchmark format: eval config files}, eval sets with their content fingerprints)."""
    formats: dict[str, list[str]] = {}
    files: dict[tuple[str, Path], list[str]] = {}
    gold: dict[tuple[Path, str], list[str]] = {(Path(seed_dir).resolve(), s): [] for s in GOLD_HELD_OUT}
    for f in eval_config_files(eval_configs):
        d = yaml.safe_load(f.read_text(encoding="utf-8"))
        if not isinstance(d, dict):
            continue
        name, ds, path = _show(f), d.get("dataset"), d.get("data_path")
        if isinstance(d.get("source"), dict):  # a job that evaluates on one {format, path} source file
            ds, path = d["source"].get("format"), d["source"].get("path")
        if ds in BENCHMARK_FORMATS:
            formats.setdefault(ds, []).append(name)
        if ds in FORMATS and ds != "seed" and path and Path(path).is_file():
            files.setdefault((ds, Path(path).resolve()), []).append(name)
        seed = d.get("seed_dir") or (path if ds == "seed" else None)
        if seed and Path(seed).is_dir():
            gold.setdefault((Path(seed).resolve(), d.get("split") or "test"), []).append(name)
    sets = []
    for (fmt, path), names in files.items():
        es = EvalSet(f"{fmt} file {_show(path)}", names)
        for conv in load(fmt, path):
            es.add(conv.conversation_id, [t.text for t in conv.turns], _questions(conv))
        sets.append(es)
    for d in dict.fromkeys(d for d, _ in gold):
        convs = load("seed", d / "conversations.jsonl")
        questions: dict[str, list[str]] = {}
        for q in load_jsonl(d / "questions.jsonl", missing_ok=True):
            questions.setdefault(q["conversation_id"], []).append(q["question"])
        for (d2, split), names in gold.items():
            if d2 != d:
                continue
            es = EvalSet(f"gold {split} split of {_show(d)}", names, split)
            for conv in convs:
                if conv.meta.get("split") == split:
                    es.add(conv.conversation_id, [t.text for t in conv.turns], questions.get(conv.conversation_id, []))
            sets.append(es)
    return formats, sets


def check(cfg, convs) -> dict:
    """Overlaps of the build's sources (`convs`: label.SourceConv) with the registered eval sets. Raises
    EvalOverlap when there are any and cfg.allow_eval_overlap gives no reason; returns the report that
    goes into stats.json either way."""
    allow = cfg.allow_eval_overlap
    if allow is not None and not (isinstance(allow, str) and allow.strip()):
        raise ConfigError("allow_eval_overlap: give the reason the build may train on evaluated data (a sentence)")
    formats, sets = registered(cfg.seed_dir, cfg.eval_configs)
    overlaps = []
    for spec in cfg.sources:
        if spec.get("format") in formats:
            mine = [sc for sc in convs if sc.fmt == spec["format"] and sc.path == str(spec["path"])]
            overlaps.append(
                {
                    "source": mine[0].source if mine else spec.get("name", ""),
                    "path": _show(Path(spec["path"])),
                    "kind": "format",
                    "format": spec["format"],
                    "eval_set": f"the {spec['format']} benchmark",
                    "configs": formats[spec["format"]],
                    "conversations": len(mine),
                    "conversation_ids": [sc.conv.conversation_id for sc in mine],
                    "questions": sum(len(sc.questions) for sc in mine),
                }
            )
    for es in sets:
        hits: dict[tuple, dict] = {}  # (source, path) -> conversation ids, eval conversation ids, counts
        for sc in convs:
            if sc.fmt == "seed" and es.split is not None and sc.split == es.split:
                continue  # the gold corpus itself: the build keeps it in its split
            turns = [es.turns[fp] for t in sc.conv.turns if (fp := fingerprint(t.text, MIN_TURN_WORDS)) in es.turns]
            qs = [
                es.questions[fp]
                for q in sc.questions
                if (fp := fingerprint(q["question"], MIN_QUESTION_WORDS)) in es.questions
            ]
            if turns or qs:
                h = hits.setdefault((sc.source, sc.path), {"ids": [], "eval_ids": set(), "turns": 0, "questions": 0})
                h["ids"].append(sc.conv.conversation_id)
                h["eval_ids"].update(turns + qs)
                h["turns"] += len(turns)
                h["questions"] += len(qs)
        for (source, path), h in hits.items():
            overlaps.append(
                {
                    "source": source,
                    "path": _show(Path(path)),
                    "kind": "content",
                    "eval_set": es.name,
                    "configs": es.configs,
                    "conversations": len(h["ids"]),
                    "conversation_ids": h["ids"],
                    "eval_conversation_ids": sorted(h["eval_ids"]),
                    "turns": h["turns"],
                    "questions": h["questions"],
                }
            )
    report = {
        "eval_sets": [f"the {f} benchmark format" for f in formats] + [es.where() for es in sets],
        "overlaps": overlaps,
        "allowed": allow,
        "summary": [describe(o) for o in overlaps],
    }
    if overlaps and allow is None:
        raise EvalOverlap(
            "the build overlaps data that an eval config evaluates on (benchmark hygiene, memdistill.data.hygiene):\n"
            + "\n".join(f"  - {line}" for line in report["summary"])
            + "\nRemove those sources (train on chat corpora or synthetic dialogues), or set allow_eval_overlap: "
            '"<reason>" in the data config to build anyway; the reason and this list then go into the dataset card '
            "and the card of every model trained on it."
        )
    return report


def _ids(ids: list[str]) -> str:
    return ", ".join(ids[:SHOW_IDS]) + (f", ... ({len(ids)} in all)" if len(ids) > SHOW_IDS else "")


def describe(o: dict) -> str:
    """One line per overlap, as the error, the dataset card and the model cards print it."""
    by = ", ".join(o["configs"]) or "an eval config"
    if o["kind"] == "format":
        return (
            f"source {o['source']} ({o['path']}) is in the {o['format']} format, a benchmark that {by} evaluates on: "
            f"{o['conversations']} conversation(s) [{_ids(o['conversation_ids'])}], {o['questions']} question(s)"
        )
    return (
        f"source {o['source']} ({o['path']}): {o['conversations']} conversation(s) [{_ids(o['conversation_ids'])}] "
        f"share {o['turns']} turn(s) and {o['questions']} question(s) with the {o['eval_set']} "
        f"(evaluated by {by}): its conversation(s) [{_ids(o['eval_conversation_ids'])}]"
    )
