"""The chat-completions request every memdistill call is made with: the SDK, the teacher jobs, the
end-to-end evaluation and the adapters for stacks that bring their own OpenAI client all build it here,
so a student and its teacher are asked the same way (greedy, thinking off, structured output)."""

from __future__ import annotations

from memdistill.spec.render import CHAT_TEMPLATE_KWARGS


def chat_request(
    messages: list[dict], model: str, max_tokens: int, schema: dict | None = None, name: str = "output"
) -> dict:
    """Keyword arguments for `openai.OpenAI().chat.completions.create`: greedy, thinking off, and
    structured output with `schema` when given. Every memdistill request is built here."""
    body = {
        "model": model,
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "extra_body": {"chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS)},
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    return body
