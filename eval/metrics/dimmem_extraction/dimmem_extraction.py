"""DimMem extraction metric as a local `evaluate` module (loads offline):

    import evaluate
    m = evaluate.load("eval/metrics/dimmem_extraction")
    m.compute(predictions=[raw_model_output, ...], references=[gold_json, ...], similarity="token_f1")

`predictions` are raw model outputs (parsed with memspec, so wrappers and truncation are handled the
way serving handles them); `references` are gold outputs `{"memories": [...]}`. The scores are those
of eval.extraction_metrics.ExtractionScores (see its docstring for the matching rule).
"""

import datasets
import evaluate

from eval.extraction_metrics import ExtractionScores
from memspec import extraction


class DimmemExtraction(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__, citation="", inputs_description=__doc__,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}))

    def _compute(self, predictions, references, similarity="embedding", threshold=None):
        scores = ExtractionScores(threshold=threshold, similarity=similarity)
        for raw, ref in zip(predictions, references):
            pred = extraction.parse(raw)
            gold = extraction.ExtractionOutput.model_validate_json(ref).memories
            scores.add(raw, pred.records, gold, pred.ok)
        return scores.summary()
