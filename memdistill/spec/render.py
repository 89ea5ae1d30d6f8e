"""The one rendering path from chat messages to a model's tokens, shared by training and serving.

Training rows are conversational prompt/completion pairs carrying CHAT_TEMPLATE_KWARGS; TRL renders
the prompt with `apply_chat_template(prompt, add_generation_prompt=True, **kwargs)`. Serving renders
the same messages the same way: vLLM is started with these kwargs as its default and the client
sends them again; in-process generation calls `prompt_ids` below. Tests prove that all three agree
token for token (tests/test_training.py: training rows against `prompt_ids`; tests/test_serving.py: the
live vLLM server against training rows).
"""

from __future__ import annotations

# Qwen3 thinks unless told not to; other templates ignore the variable.
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, **CHAT_TEMPLATE_KWARGS
    )
    return list(out["input_ids"])


def sft_row(messages: list[dict], completion: str, **meta) -> dict:
    """A TRL conversational prompt/completion row (completion-only loss) with its metadata."""
    return {
        "prompt": messages,
        "completion": [{"role": "assistant", "content": completion}],
        "chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS),
        **meta,
    }
