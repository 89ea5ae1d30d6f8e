"""DimMem extraction metric as a local `evaluate` module (loads offline):

    import evaluate
    m = evaluate.load("memdistill/metrics/dimmem_extraction")
    m.compute(predictions=[raw_model_output, ...], references=[gold_json, ...], similarity="token_f1")
    m.compute(..., prompt_tokens=[n, ...], output_tokens=[n, ...])   # per-window token counts, optional

`predictions` are raw model outputs (parsed with the spec, so wrappers and truncation are handled the
way serving handles them); `references` are gold outputs `{"memories": [...]}`. The scores are those
of memdistill.metrics.extraction.ExtractionScores (see its docstring for the matching rule).
"""

import datasets
import evaluate

from memdistill.metrics.extraction import ExtractionScores
from memdistill.spec import extractor


class DimmemExtraction(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=__doc__,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(
        self, predictions, references, similarity="embedding", threshold=None, prompt_tokens=None, output_tokens=None
    ):
        n = len(predictions)
        for name, counts in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
            if counts is not None and len(counts) != n:
                raise ValueError(f"{name}: {len(counts)} counts for {n} predictions")
        scores = ExtractionScores(threshold=threshold, similarity=similarity)
        for k, (raw, ref) in enumerate(zip(predictions, references)):
            pred = extractor.parse(raw)
            try:
                gold = extractor.ExtractionOutput.model_validate_json(ref).memories
            except ValueError as e:
                raise ValueError(
                    f'references[{k}] is not a valid {{"memories": [...]}} document: {str(e).splitlines()[0]}'
                ) from None
            scores.add(
                raw,
                pred.records,
                gold,
                pred.ok,
                prompt_tokens=prompt_tokens[k] if prompt_tokens else 0,
                output_tokens=output_tokens[k] if output_tokens else 0,
            )
        return scores.summary()
