"""An exported encoder in process: what vLLM's `/classify` or `/score` answers for the same input.

Training (dev figures, threshold tuning), evaluation and the in-process runtime hooks use it; the served
path is `memdistill.serve.client.MemoryModels`, and tests/test_encoder_serving.py proves the two agree."""

from __future__ import annotations

from pathlib import Path

from memdistill.spec import MODELS, consolidator, gate, planner, querytyper, router, segmenter


class Encoder:
    """An exported encoder in process: `scores` returns what vLLM's `/classify` (router, planner) or
    `/score` (gate) returns for the same input: sigmoid (router, gate) or softmax (planner) outputs of
    the exported head, thresholds already folded in."""

    def __init__(self, model_dir: str, batch_size: int = 64, model=None, tok=None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.dir = Path(model_dir) if model_dir else None
        self.model = (
            model or AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
        ).eval()
        self.tok = tok or AutoTokenizer.from_pretrained(model_dir)
        self.meta = getattr(self.model.config, "memdistill", None) or {}
        self.task = self.meta.get("task") or _task_of(self.model.config)
        self.batch_size = batch_size
        self.device = next(self.model.parameters()).device

    def scores(self, inputs: list[tuple]) -> list[list[float]]:
        """One score vector per input; an input is (text,) or, for the gate, (query, candidate)."""
        import torch

        out = []
        for i in range(0, len(inputs), self.batch_size):
            cols = list(zip(*inputs[i : i + self.batch_size]))
            enc = self.tok(
                *[list(c) for c in cols],
                truncation=True,
                padding=True,
                return_tensors="pt",
                max_length=self.tok.model_max_length if self.tok.model_max_length < 10**6 else 512,
            )
            enc = {k: v.to(self.device) for k, v in enc.items() if k in self.tok.model_input_names}
            with torch.no_grad():
                logits = self.model(**enc).logits.float()
            act = torch.softmax(logits, -1) if MODELS[self.task].softmax else torch.sigmoid(logits)
            out += act.cpu().tolist()
        return out

    # decisions, as the SDK makes them from served scores
    def classify_types(self, snippets: list[str]) -> list[list[str]]:
        return [router.from_probs(p) for p in self.scores([(router.encoder_text(s),) for s in snippets])]

    def complexity(self, questions: list[str]) -> list[str]:
        return [planner.complexity_of(p) for p in self.scores([(" ".join(q.split()),) for q in questions])]

    def keep_scores(self, question: str, complexity: str, candidates: list[str]) -> list[float]:
        q = gate.pair_query(question, complexity)
        return [s[0] for s in self.scores([(q, c) for c in candidates])]

    def changes(self, texts: list[str]) -> list[bool]:
        """`segmenter.encoder_text` texts -> whether each utterance opens a topic."""
        return [segmenter.label_of(p) == "CHANGE" for p in self.scores([(t,) for t in texts])]

    def query_types(self, questions: list[str]) -> list[str]:
        """Questions -> MemoType query type (EM / PM / GM / none), as the query typer learnt the vote."""
        return [querytyper.label_of(p) for p in self.scores([(querytyper.encoder_text(q),) for q in questions])]

    def actions(self, pairs) -> list[str]:
        """(new, existing) StoredRecord pairs -> MERGE / SUPERSEDE / KEEPBOTH."""
        return [consolidator.action_of(p) for p in self.scores([(consolidator.encoder_text(n, o),) for n, o in pairs])]


def _task_of(config) -> str:
    """The model an exported head belongs to, by its id2label (for models exported without metadata)."""
    labels = tuple(config.id2label[i] for i in range(config.num_labels))
    for name, m in MODELS.items():
        if m.encoder and m.labels == labels:
            return name
    raise ValueError(f"id2label {labels} matches no memdistill encoder")
