"""The memory system built from the compact models: a memory bank with source pointers, tri-path
retrieval with DimMem's dimension route, assistant-reply recall, and hooks for the type router, the
recall planner and the recall gate.

    from memdistill.runtime import MemoryBank, MemoryRuntime, hooks_from_models
    bank = MemoryBank.from_extracted(mm.extract(conversation).memories)
    rt = MemoryRuntime(bank, **hooks_from_models(mm))          # router, planner and gate from the endpoint
    recall = rt.recall("When did Tom adopt his dog?", conversation.conversation_id, query=mm.parse_query(...).query)
    print(rt.context(recall.kept))                             # the memory block an answer model reads

Memory update as records arrive (never deleting; see memdistill.runtime.consolidate):
    cons = Consolidator(mm.consolidate_pairs)                  # the served consolidator, or any decider
    for item in new_items:
        cons.add(bank, item)                                   # current records rank first afterwards

TiMem's temporal memory tree over the bank (memdistill.runtime.tree), and its hierarchical recall:
    tree = MemoryTree(bank, {conversation.conversation_id: conversation}, path="tree.jsonl")
    tree.close(conversation.conversation_id, lm_writer(summarizer_mm))  # nodes whose window closed
    recall = TreeRecall(tree, Embedder(), **hooks_from_models(mm, ("planner", "gate"))).recall(question, cid)
"""

from memdistill.core.embedder import Embedder
from memdistill.runtime.bank import BankError, MemoryBank, MemoryItem
from memdistill.runtime.consolidate import Consolidator
from memdistill.runtime.retrieval import (
    DIM_WEIGHTS,
    Hit,
    MemoryRuntime,
    Recall,
    dimension_score,
    hooks_from_models,
    score_gate,
    types_from_trimem,
)
from memdistill.runtime.tree import MemoryTree, Node, TreeRecall, gold_writer, lead_writer, lm_writer

__all__ = [
    "BankError",
    "Consolidator",
    "DIM_WEIGHTS",
    "Embedder",
    "Hit",
    "MemoryBank",
    "MemoryItem",
    "MemoryRuntime",
    "MemoryTree",
    "Node",
    "TreeRecall",
    "Recall",
    "dimension_score",
    "gold_writer",
    "lead_writer",
    "lm_writer",
    "hooks_from_models",
    "score_gate",
    "types_from_trimem",
]
