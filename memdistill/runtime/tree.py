"""TiMem's temporal memory tree over a memory bank, and its hierarchical recall (seed 000, sections 3.1-3.3,
Table 7).

Leaves (L1) are the bank's records, one per extracted fact of one message: TiMem's segments of one turn.
Nodes of levels 2-5 (session, day, week, month; `memdistill.spec.summarizer`) are written by a `Writer`
from their children and the three previous nodes of their level, when their window closes
(`MemoryTree.close`). Each node written is appended to the tree's log at once, so a killed build resumes
at the next node. Consolidation marks records and the tree keeps them: a superseded or merged record
stays its session's child, with its status.

    tree = MemoryTree(bank, conversations, path="tree.jsonl")
    tree.close("conv-1", gold_writer(seed))         # or lm_writer(MemoryModels(...)), lead_writer()
    rec = TreeRecall(tree, embed, planner=..., gate=...).recall("When did ...?", "conv-1")
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from memdistill.core.io import append_jsonl, recover_log, write_jsonl
from memdistill.runtime.bank import MemoryBank, MemoryItem
from memdistill.runtime.retrieval import Hit, Recall, gated
from memdistill.spec import qa, summarizer
from memdistill.spec.dialogue import Conversation

LAMBDA = 0.9  # leaf score: 0.9 x cosine + 0.1 x BM25 (eq. 7, Table 7)
LEAVES = 20  # k1: leaves activated (Table 7)
# per-level budgets by query complexity (Table 7); the levels a complexity reaches are the keys (eqs. 4-6)
SCOPES = {
    "simple": {1: 20, 2: 4, 5: 1},
    "hybrid": {1: 20, 2: 4, 3: 2, 5: 1},
    "complex": {1: 20, 2: 8, 3: 4, 4: 2, 5: 1},
}
RECALLS = ("hierarchical", "flat")


class TreeError(ValueError):
    pass


@dataclass
class Node:
    """One memory of the tree. A leaf wraps its bank record; a node above holds its text, its children's ids
    and the turns below it (`sources`). It reads like a `MemoryItem` to the recall harness."""

    node_id: str
    conversation_id: str
    level: int
    period: str  # the window's name: a session id, a day, an ISO week, a month
    start: dt.datetime  # the span of what it holds: its first and last source message
    end: dt.datetime
    text: str
    children: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    sessions: tuple[str, ...] = ()
    profile: list[dict] | None = None
    item: MemoryItem | None = None  # a leaf's record

    @property
    def memory_id(self) -> str:
        return self.node_id

    @property
    def content(self) -> str:
        return self.text

    @property
    def current(self) -> bool:
        return self.item.current if self.item else True

    @property
    def status(self) -> str:
        return self.item.status if self.item else "current"

    @property
    def turn_id(self) -> str | None:
        return self.item.turn_id if self.item else None

    @property
    def source_turns(self) -> list[str]:
        """What evidence recall credits: a leaf's source turns. A summary is credited by answer coverage
        (`memdistill.metrics.recall.answer_coverage`), not for every turn of its window."""
        return self.item.source_turns if self.item else []

    def render(self, reply: str | None = None) -> str:
        if self.item:
            return self.item.render(reply)
        span = f"{self.start:%Y-%m-%d}" + (f" to {self.end:%Y-%m-%d}" if self.end.date() != self.start.date() else "")
        return f"[{summarizer.LEVELS[self.level]} {self.period}, {span}] {self.text}"

    def to_json(self) -> dict:
        row = {k: getattr(self, k) for k in ("node_id", "conversation_id", "level", "period", "text", "children")}
        row |= {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "sources": self.sources,
            "sessions": list(self.sessions),
            "profile": self.profile,
        }
        return row

    @classmethod
    def from_json(cls, row: dict, where: str) -> Node:
        try:
            return cls(
                row["node_id"],
                row["conversation_id"],
                int(row["level"]),
                row["period"],
                dt.datetime.fromisoformat(row["start"]),
                dt.datetime.fromisoformat(row["end"]),
                row["text"],
                list(row["children"]),
                list(row["sources"]),
                tuple(row["sessions"]),
                row.get("profile"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TreeError(f"{where}: not a tree node ({type(e).__name__}: {e})") from None


@dataclass
class NodeRequest:
    """What a writer is given for one node (formula 1): its window, its children and the previous nodes of its
    level (w = 3), and whom a profile describes."""

    conversation_id: str
    window: summarizer.Window
    children: list[Node]
    history: list[Node]
    people: list[str]

    def to_json(self) -> dict:
        return summarizer.request(
            self.window,
            [(c.end, c.text) for c in self.children],
            [(h.period, h.text) for h in self.history],
            self.people,
        )


Writer = Callable[[NodeRequest], tuple[str, list[dict] | None]]


class MemoryTree:
    def __init__(self, bank: MemoryBank, conversations: dict[str, Conversation], path=None):
        self.bank, self.conversations = bank, conversations
        self.path = Path(path) if path else None
        self.skipped: list[str] = []
        self._nodes: dict[str, Node] = {}
        self._lock = threading.Lock()  # conversations may close concurrently: one log, one table
        if self.path and self.path.exists():  # resume: what a killed build wrote stays written
            for i, row in enumerate(recover_log(self.path, TreeError), 1):
                node = Node.from_json(row, f"{self.path}:{i}")
                self._nodes[node.node_id] = node

    def _conversation(self, cid: str) -> Conversation:
        if cid not in self.conversations:
            raise TreeError(f"no conversation {cid!r}: the tree needs its sessions and times")
        return self.conversations[cid]

    def leaves(self, cid: str) -> list[Node]:
        """The bank's records of a conversation as L1 nodes, in the order of their source turns."""
        conv = self._conversation(cid)
        session_of = {t.turn_id: s.session_id for s in conv.sessions for t in s.turns}
        when = {t.turn_id: t.timestamp for t in conv.turns}
        out = []
        for it in self.bank.of(cid):
            if it.turn_id not in session_of:
                raise TreeError(f"record {it.memory_id}: turn {it.turn_id} is not in conversation {cid}")
            t = it.timestamp or when[it.turn_id]
            out.append(
                Node(
                    it.memory_id,
                    cid,
                    1,
                    session_of[it.turn_id],
                    t,
                    t,
                    it.content,
                    [],
                    list(it.source_turns),
                    (session_of[it.turn_id],),
                    item=it,
                )
            )
        return out

    def nodes(self, cid: str, levels=(1, 2, 3, 4, 5)) -> list[Node]:
        """The conversation's nodes at these levels, in time order."""
        out = self.leaves(cid) if 1 in levels else []
        out += [n for n in self._snapshot() if n.conversation_id == cid and n.level in levels]
        return sorted(out, key=lambda n: (n.end, n.level, n.node_id))

    def node_id(self, cid: str, window: summarizer.Window) -> str:
        return f"{cid}-{window.node_id}"

    def due(self, cid: str, until: dt.datetime | None = None) -> list[summarizer.Window]:
        """The windows closed by `until` (None: every window of the conversation so far) with no node yet, in
        closing order."""
        wins = summarizer.conversation_windows(self._conversation(cid))
        return [w for w in wins if (until is None or w.end <= until) and self.node_id(cid, w) not in self._nodes]

    def _children(self, cid: str, w: summarizer.Window) -> list[Node]:
        below = self.leaves(cid) if w.level == 2 else self.nodes(cid, (w.level - 1,))
        return [n for n in below if set(n.sessions) <= set(w.sessions)]

    def close(self, cid: str, write: Writer, until: dt.datetime | None = None, progress: bool = False) -> list[Node]:
        """Write every node whose window has closed (TiMem's scheduled consolidation), lower levels first."""
        from tqdm import tqdm

        conv, written = self._conversation(cid), []
        for w in tqdm(self.due(cid, until), desc=f"tree {cid}", unit="node", disable=not progress, leave=False):
            children = self._children(cid, w)
            if not children:
                self.skipped.append(f"{self.node_id(cid, w)}: no memories below it")
                continue
            same = [n for n in self.nodes(cid, (w.level,)) if n.end <= w.end]
            req = NodeRequest(cid, w, children, same[-summarizer.HISTORY :], summarizer.people(conv))
            text, profile = write(req)
            node = Node(
                self.node_id(cid, w),
                cid,
                w.level,
                w.name,
                min(c.start for c in children),
                max(c.end for c in children),
                text,
                [c.node_id for c in children],
                list(dict.fromkeys(t for c in children for t in c.sources)),
                w.sessions,
                profile,
            )
            with self._lock:
                if self.path:
                    append_jsonl(self.path, [node.to_json()], fsync=True)
                self._nodes[node.node_id] = node
            written.append(node)
        return written

    def _snapshot(self) -> list[Node]:
        with self._lock:  # other conversations may be closing in other threads
            return list(self._nodes.values())

    def parents(self, cid: str) -> dict[str, str]:
        return {c: n.node_id for n in self._snapshot() if n.conversation_id == cid for c in n.children}

    def ancestors(self, cid: str, *node_ids: str) -> list[Node]:
        """Every ancestor of these nodes, each once, nearest first per node (one parent map for all of them)."""
        up, out = self.parents(cid), {}
        for node_id in node_ids:
            while node_id in up:
                node_id = up[node_id]
                out.setdefault(node_id, self._nodes[node_id])
        return list(out.values())

    def save(self, path) -> None:
        write_jsonl(path, [n.to_json() for n in self._snapshot()])


# --- writers ------------------------------------------------------------------------------------------


def gold_writer(seed) -> Writer:
    """The gold corpus's node texts (data/seed/tree.jsonl), by node id: the upper bound of a writer."""
    rows = {r["node_id"]: r for r in seed.tree}

    def write(req: NodeRequest) -> tuple[str, list[dict] | None]:
        nid = f"{req.conversation_id}-{req.window.node_id}"
        if nid not in rows:
            raise TreeError(f"no gold node {nid} in tree.jsonl")
        row = rows[nid]
        if "profiles" in row:
            return summarizer.profile_text(row["profiles"]), row["profiles"]
        return row["summary"], None

    return write


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def lead_writer(words: int = 80) -> Writer:
    """No model: the children's texts, first sentence each, up to `words` words (a summary's trivial baseline)."""

    def write(req: NodeRequest) -> tuple[str, None]:
        out: list[str] = []
        for c in req.children:
            first = _SENTENCE.split(c.text.strip(), maxsplit=1)[0]
            if sum(len(x.split()) for x in out) + len(first.split()) > words and out:
                break
            out.append(first)
        return " ".join(out), None

    return write


def lm_writer(mm, prompt: str = "student") -> Writer:
    """A node written by an LM through the SDK (`MemoryModels.summarize`): the distilled summarizer, a
    teacher, or any OpenAI-compatible model."""

    def write(req: NodeRequest) -> tuple[str, list[dict] | None]:
        res = mm.summarize(req.to_json(), prompt=prompt)
        return res.text, res.profile

    return write


# --- recall -------------------------------------------------------------------------------------------


class TreeRecall:
    """TiMem's recall over a tree: activate the top leaves by 0.9 x cosine + 0.1 x BM25, add their ancestors
    at the levels the query's complexity reaches, cap each level (Table 7, pruned by the same score), let the
    gate keep what answers, and order what is kept by level, then by distance to the query time (eq. 11).
    `recall="flat"` instead ranks every node of `levels` together and keeps the top `flat_k`."""

    def __init__(
        self,
        tree: MemoryTree,
        embed,
        levels=(1, 2, 3, 4, 5),
        recall: str = "hierarchical",
        planner: Callable | None = None,
        gate: Callable | None = None,
        complexity: str = "hybrid",
        leaves: int = LEAVES,
        lam: float = LAMBDA,
        flat_k: int = 20,
    ):
        if recall not in RECALLS:
            raise ValueError(f"recall={recall!r}: expected one of {RECALLS}")
        if complexity not in SCOPES:
            raise ValueError(f"complexity={complexity!r}: expected one of {sorted(SCOPES)}")
        self.tree, self.embed, self.levels, self.mode = tree, embed, tuple(levels), recall
        self.planner, self.gate, self.complexity = planner, gate, complexity
        self.leaves, self.lam, self.flat_k = leaves, lam, flat_k
        self._cache: dict[str, tuple] = {}  # conversation -> (node count, nodes, vectors, BM25 index)

    def _index(self, cid: str):
        import bm25s

        nodes = self.tree.nodes(cid, self.levels)
        if self._cache.get(cid, (None,))[0] != len(nodes):  # nodes written or records added since
            bm25 = None
            if nodes:
                bm25 = bm25s.BM25()
                bm25.index(
                    bm25s.tokenize([n.text for n in nodes], return_ids=False, show_progress=False, stopwords="en"),
                    show_progress=False,
                )
            vecs = self.embed([n.text for n in nodes]) if nodes else np.zeros((0, 1))
            self._cache[cid] = (len(nodes), nodes, vecs, bm25)
        return self._cache[cid][1:]

    def scores(self, question: str, cid: str) -> tuple[list[Node], np.ndarray]:
        """Every node's score for the question: lambda x cosine + (1 - lambda) x BM25 scaled to [0, 1] over the
        conversation (the project's scaling: the paper does not say how the two ranges meet)."""
        import bm25s

        nodes, vecs, bm25 = self._index(cid)
        if not nodes:
            return [], np.zeros(0)
        cos = vecs @ self.embed([question])[0]
        toks = bm25s.tokenize([question], return_ids=False, show_progress=False, stopwords="en")[0]
        lex = np.asarray(bm25.get_scores(toks), dtype=float) if toks else np.zeros(len(nodes))
        lex = lex / lex.max() if lex.max() > 0 else lex
        return nodes, self.lam * cos + (1 - self.lam) * lex

    def candidates(self, question: str, cid: str, complexity: str) -> list[Hit]:
        nodes, score = self.scores(question, cid)
        by_score = sorted(range(len(nodes)), key=lambda i: (-score[i], i))
        if self.mode == "flat":
            return [Hit(nodes[i], float(score[i])) for i in by_score[: self.flat_k]]
        base = min(self.levels)
        at = {n.node_id: i for i, n in enumerate(nodes)}
        active = [i for i in by_score if nodes[i].level == base][: self.leaves]
        reach = set(SCOPES[complexity]) | {base}
        above = self.tree.ancestors(cid, *(nodes[i].node_id for i in active))
        pool = set(active) | {at[a.node_id] for a in above if a.level in reach and a.node_id in at}
        budget = {lvl: SCOPES[complexity].get(lvl, self.leaves if lvl == base else 0) for lvl in reach}
        kept, used = [], dict.fromkeys(reach, 0)
        for i in sorted(pool, key=lambda i: (-score[i], i)):
            if used[nodes[i].level] < budget[nodes[i].level]:
                used[nodes[i].level] += 1
                kept.append(Hit(nodes[i], float(score[i])))
        return kept

    def recall(
        self, question: str, conversation_id: str, query=None, route: bool = True, gate_complexity: str = "hybrid"
    ) -> Recall:
        """The runtime's `recall` interface: `hits` ranked by score (what recall@k reads), `kept` what the
        answer model reads, after the gate, in TiMem's order. The query time is the conversation's last turn; the
        complexity is the planner's or the fixed one, so `gate_complexity` is not needed here."""
        notes, complexity = [], self.complexity
        if self.planner is not None:
            planned = self.planner(question)
            if planned in SCOPES:
                complexity = planned
            else:
                notes.append(f"planner gave {planned!r}; {complexity} scope used")
        hits = self.candidates(question, conversation_id, complexity)
        kept = gated(self.gate, question, complexity, hits, notes)
        now = self.tree._conversation(conversation_id).turns[-1].timestamp
        kept = sorted(kept, key=lambda h: (h.item.level, abs((now - h.item.end).total_seconds())))
        return Recall(hits, kept, len(hits), complexity, notes=notes)

    def context(self, hits: list[Hit], assistant_replies: bool = False) -> str:
        return qa.render_memories([h.item.render() for h in hits])
