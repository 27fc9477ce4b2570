"""Render a model's chat template: OpenAI-style messages into the prompt text the model was tuned on.

Templates are Jinja, shipped by the model (``tokenizer.chat_template`` in a GGUF,
``chat_template`` in ``tokenizer_config.json``). They run in Jinja's immutable sandbox, with the
same environment transformers' ``apply_chat_template`` gives them (trim_blocks, lstrip_blocks,
loop controls, ``raise_exception``, a ``tojson`` that keeps non-ASCII text, ``strftime_now``, a
``dict`` constructor, a ``namespace`` that refuses underscore names, a ``{% generation %}`` block
that renders its body) and the same variables (``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the special tokens), so a prompt renders here exactly as it does
there; tests/test_chat_template.py checks that.

    text = apply_chat_template(tokenizer, [{"role": "user", "content": "Hi"}])
    ids = tokenizer.encode(text, add_special_tokens=False)  # the text holds its special tokens
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_adapter.model.tokenizer import Tokenizer

__all__ = ["ChatMessage", "ChatTemplateError", "apply_chat_template", "parse_messages", "render_chat"]

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
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """The prompt text of `messages` under `template`.

    Args:
        template: The model's Jinja chat template.
        messages: The conversation (`parse_messages` checks raw JSON).
        add_generation_prompt: End with the header of an assistant turn, for the model to answer.
        bos_token: The text of the bos token (``Tokenizer.token_text``), as the template sees it.
        eos_token: The text of the eos token.
        tools: JSON schemas of tools, for templates that list them (None: no tools).
        documents: ``{"title", "text"}`` documents, for retrieval templates (None: none).
        **extra: Further template variables (``unk_token``, ``enable_thinking`` ...).

    Returns:
        The rendered text, special tokens included as text.

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
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **extra,
            )
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: Sequence[ChatMessage] | Any,
    *,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """The prompt text of a conversation under the tokenizer's own chat template.

    Args:
        tokenizer: A tokenizer with a `chat_template` (a GGUF's or a ``tokenizer_config.json``'s).
        messages: `ChatMessage` items, or raw OpenAI-style messages (checked by `parse_messages`).
        add_generation_prompt: End with the header of an assistant turn.
        **extra: Further template variables, as for `render_chat`.

    Raises:
        ChatTemplateError: The tokenizer has no chat template, the messages are malformed, or the
            template failed.
    """
    template = tokenizer.chat_template
    if template is None:
        raise ChatTemplateError("the model has no chat template (a base model): send a plain prompt")
    is_parsed = isinstance(messages, Sequence) and all(isinstance(m, ChatMessage) for m in messages)
    chat = list(messages) if is_parsed and messages else parse_messages(messages)
    return render_chat(
        template,
        chat,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokenizer.token_text(tokenizer.bos_token_id),
        eos_token=tokenizer.token_text(tokenizer.eos_token_id),
        **extra,
    )


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
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _namespace_class()
    return env.from_string(template)


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


@functools.cache
def _namespace_class() -> Any:
    """Jinja's ``namespace``, refusing underscore names (a way towards CPython internals)."""
    import jinja2
    from jinja2.utils import Namespace

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the attribute {name!r}")

    class TemplateNamespace(Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature: `self` may be a key
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            Namespace.__setitem__(self, name, value)

    return TemplateNamespace


@functools.cache
def _generation_extension() -> Any:
    import jinja2
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks the assistant's tokens for training
        masks in transformers): here it renders its body unchanged."""

        tags = {"generation"}  # noqa: RUF012 (Jinja reads the class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationBlock
