"""Render a model's chat template: OpenAI-style messages into the prompt text the model was tuned on.

Templates are Jinja, shipped by the model (``tokenizer.chat_template`` in a GGUF,
``chat_template`` in ``tokenizer_config.json``). They run in Jinja's immutable sandbox, with the
same environment transformers' ``apply_chat_template`` gives them (trim_blocks, lstrip_blocks,
loop controls, ``raise_exception``, a ``tojson`` that keeps non-ASCII text, ``strftime_now``), so
a prompt renders here exactly as it does there; tests/test_chat_template.py checks that.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["ChatMessage", "ChatTemplateError", "parse_messages", "render_chat"]

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(ValueError):
    """Messages a template cannot render: a bad role or content, or the template itself refused."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def parse_messages(raw: Any) -> list[ChatMessage]:
    """Check OpenAI-style messages: a non-empty list of ``{"role", "content"}``.

    Content is a string, or a list of ``{"type": "text", "text": ...}`` parts (joined); ``null``
    content is allowed for an assistant turn.

    Raises:
        ChatTemplateError: The list, a role or a content is not of that form; the message says
            which item and why.
    """
    if not isinstance(raw, list) or not raw:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    messages: list[ChatMessage] = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(item, Mapping):
            raise ChatTemplateError(f"{where} must be an object with role and content")
        role = item.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        messages.append(ChatMessage(str(role), _content(item.get("content"), role, where)))
    return messages


def _content(content: Any, role: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            is_text = isinstance(part, Mapping) and part.get("type") == "text"
            if not (is_text and isinstance(part.get("text"), str)):
                raise ChatTemplateError(f"{where}.content[{j}] must be {{'type': 'text', 'text': str}}")
            texts.append(part["text"])
        return "".join(texts)
    raise ChatTemplateError(f"{where}.content must be a string or a list of text parts")


def render_chat(
    template: str,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """The prompt text of `messages` under `template`.

    Raises:
        ChatTemplateError: The template does not compile, or raised (``raise_exception``), or
            failed while rendering these messages.
    """
    import jinja2

    try:
        compiled = _compiled(template)
        return str(
            compiled.render(
                messages=[m.as_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)
