"""Generating from a model in-process (HF transformers), through the shared rendering path.

The served path (vLLM behind the OpenAI-compatible endpoint) renders the same prompts; both return
the raw text plus prompt and output token counts so metrics can charge tokens per window.
"""

from __future__ import annotations

from dataclasses import dataclass

from memspec.render import prompt_ids


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    output_tokens: int


class HFGenerator:
    def __init__(self, model: str, dtype: str = "float32", threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from training.base_models import model_path

        if threads:
            torch.set_num_threads(threads)
        path = model_path(model)
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    def __call__(self, conversations: list[list[dict]], max_new_tokens: int = 512, batch_size: int = 8,
                 progress=None) -> list[Generation]:
        """Greedy generation for each chat (system + user messages), batched by prompt length."""
        import torch

        ids = [prompt_ids(self.tok, msgs) for msgs in conversations]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[Generation | None] = [None] * len(ids)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(ids[i]) for i in batch)
            # left padding keeps every prompt's last token at the same position for generation
            input_ids = torch.tensor([[self.pad] * (width - len(ids[i])) + ids[i] for i in batch])
            attn = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in batch])
            with torch.no_grad():
                gen = self.model.generate(input_ids=input_ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                                          do_sample=False, pad_token_id=self.pad, eos_token_id=self.tok.eos_token_id)
            for row, i in zip(gen[:, width:], batch):
                toks = row.tolist()
                n = next((k + 1 for k, t in enumerate(toks) if t == self.tok.eos_token_id), len(toks))
                out[i] = Generation(self.tok.decode(toks[:n], skip_special_tokens=True), len(ids[i]), n)
            if progress is not None:
                progress.update(len(batch))
        return out
