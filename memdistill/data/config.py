"""The data job's config (`memdistill data`, configs/data/*.yaml): read by the gold build, the teacher
labelling jobs and dialogue synthesis, so it lives apart from all three."""

from __future__ import annotations

from dataclasses import dataclass, field

from memdistill.spec import NAMES, TRAINING_SETS, consolidator
from memdistill.spec.dialogue import WINDOW_PRESETS


@dataclass
class DataConfig:
    output_dir: str = "data/built"
    seed_dir: str = "data/seed"
    # Window settings per conversation style; each (W, O) pair yields one pass over every conversation,
    # so several pairs multiply extraction rows (the first pair is also the evaluation setting).
    windows: dict = field(default_factory=lambda: {k: [list(v)] for k, v in WINDOW_PRESETS.items()})
    tasks: list = field(default_factory=lambda: list(TRAINING_SETS))  # the training sets to build
    # Extra (W, O) pairs applied to train conversations only (augmentation).
    train_extra_windows: list = field(default_factory=list)
    # Extraction completions as the student writes them: compact records (no source_speaker, no empty
    # dimension; `extractor.parse` restores both) or, false, the full DimMem record (the schema-1.0 format).
    compact_completions: bool = True
    # The extraction student prompt rows are rendered with (a name in `extractor.STUDENT_PROMPTS`); rows
    # carry it and training writes it into the model's metadata, so serving and eval send the same one.
    student_prompt: str = "student"
    # Share of the gold train split's extraction windows with no record that are kept (chosen by hash):
    # they teach the model to answer an empty list, but each costs a whole prompt for a 6-token answer.
    keep_empty_windows: float = 1.0
    # Consolidator: KEEPBOTH rows for the cascade's pairs that no gold pair names, this many per gold pair of
    # the split (train and dev; the test split stays the gold pairs). The runtime asks the consolidator
    # about every pair the cascade (pair_cascade) lets through, most of them unrelated records, while the
    # gold pairs are hand-picked changes, restatements and hard negatives; without these rows the model
    # never sees the pairs it is asked about most. 0 turns them off (configs/data/seed.yaml says why it is off).
    consolidator_negatives: float = 0.0
    # --- teacher labelling (memdistill.data.label); with teacher null the gold corpus alone is used ---
    teacher: dict | None = (
        None  # memdistill.data.teacher.TeacherSettings as a mapping (base_urls, model, api_key_env, ...)
    )
    sources: list = field(default_factory=list)  # [{format, path, name?, style?, max_conversations?}]
    jobs: list = field(default_factory=lambda: list(NAMES))  # teacher jobs: model names
    label_dir: str | None = None  # labels.jsonl / rejects.jsonl per job; default <output_dir>/labels
    cache_dir: str = ".cache/teacher"  # teacher replies (sqlite), shared by every run against the same teacher
    type_mode: str = "binary"  # router: one yes/no request per label (binary) or one multi-label request (single)
    gate_candidates: int = 20  # BM25 top-N memories per gate question
    gate_min_candidates: int = 5
    # consolidation pairs: the candidate cascade over the extractor job's records (spec.consolidator.candidates)
    # (also the cascade whose unlabelled pairs become the consolidator's KEEPBOTH rows offline)
    pair_cascade: dict = field(default_factory=lambda: dict(consolidator.WIDE))
    retry_transport: bool = False  # ask again for items whose retries ran out in an earlier run
    # a job with fewer ok labels than this share of its items stops the build (exit 1; a rerun resumes)
    min_ok_share: float = 0.5
    # where the eval configs live whose data a teacher build may not train on (memdistill.data.hygiene)
    eval_configs: str = "configs/eval"
    # a sentence saying why this build may overlap an evaluated set anyway; written into every card
    allow_eval_overlap: str | None = None
    max_items: dict = field(default_factory=dict)  # job -> at most this many items (chosen by hash, spread out)
    include_seed: bool = True  # add the gold corpus's train/dev rows to the teacher rows
    dev_fraction: float = 0.05
    near_dup_threshold: float = 0.9
    test_overlap_threshold: float = 0.8
    progress: bool = True
