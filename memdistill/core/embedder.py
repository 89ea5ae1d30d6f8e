"""Sentence embeddings with all-MiniLM-L6-v2 (the model DimMem retrieves with, shipped in a PyPI package).

The memory runtime searches with it and the extraction metrics match records with it; it lives on the
ground floor so that both use the same vectors.
"""

from __future__ import annotations

import numpy as np

from memdistill.core.models import model_path


class Embedder:
    """MiniLM sentence embeddings (the package-shipped model), cached per text."""

    def __init__(self, model_dir: str | None = None):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir or model_path("embedded:minilm"), device="cpu")
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            for t, v in zip(todo, self.model.encode(todo, normalize_embeddings=True, batch_size=64)):
                self.cache[t] = v
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, 384))
