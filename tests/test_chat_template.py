"""Chat templates render exactly as transformers renders them, in a sandbox, with checked messages.

Three kinds of check:

- message validation and the sandbox, with no model;
- small templates that use what real ones use (a default system turn, ``raise_exception`` on
  role order, ``namespace``, loop controls, ``tojson``, ``tools``, ``{% generation %}``),
  rendered here and by transformers' own renderer;
- SmolLM2-135M-Instruct's template against its transformers tokenizer's ``apply_chat_template``.
"""

from __future__ import annotations

from typing import Any

import pytest
from model_fixtures import (  # noqa: F401 (fixtures: tests ask for them by name)
    needs_smollm2,
    needs_transformers,
    one_thread_fixture,
    reference_tokenizer_fixture,
    smollm2_fixture,
)

from engine_adapter.model.chat_template import (
    ChatMessage,
    ChatTemplateError,
    apply_chat_template,
    parse_messages,
    render_chat,
)
from engine_adapter.model.config import ModelConfig
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.tokenizer import ByteTokenizer, Tokenizer

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ALTERNATING = """{{ bos_token }}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ '[INST] ' + message['content'] | trim + ' [/INST]' }}
    {% else %}
        {{ ' ' + message['content'] | trim + ' ' + eos_token }}
    {% endif %}
{% endfor %}"""
FEATURES = """{% set ns = namespace(system='', turns=0) %}
{% for m in messages %}
    {% if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}{% endgeneration %}
    {% else %}U{{ ns.turns }}: {{ m.content | tojson }}
    {% endif %}
{% endfor %}
{% if tools is not none %}TOOLS {{ tools | tojson(indent=1) }}{% endif %}
{% if documents is none %}no documents{% endif %}
[{{ ns.system }}] {{ dict(a=1) | tojson }} {{ extra_flag | default('unset') }}
{% if add_generation_prompt %}A:{% endif %}"""
TEMPLATES = {"chatml": CHATML, "alternating": ALTERNATING, "features": FEATURES}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about caches, «naïvely» 🎉."},
    ],
]
CONVERSATION_IDS = ["user", "system", "multi-turn"]


# ---- messages ---------------------------------------------------------------------------------------


def test_messages_parse_into_chat_messages() -> None:
    parsed = parse_messages(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ]
    )
    assert parsed == [ChatMessage("system", "s"), ChatMessage("user", "ab"), ChatMessage("assistant", "")]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, r"messages must be a non-empty list"),
        ([], r"messages must be a non-empty list"),
        ("hi", r"messages must be a non-empty list"),
        (["hi"], r"messages\[0\] must be an object with role and content"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\]\.role must be one of .*got 'robot'"),
        ([{"content": "x"}], r"messages\[0\]\.role must be one of .*got None"),
        (
            [{"role": "user", "content": 3}],
            r"messages\[0\]\.content must be a string or a list of text parts",
        ),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content must be a string"),
        (
            [{"role": "user", "content": "ok"}, {"role": "user", "content": [{"type": "image_url"}]}],
            r"messages\[1\]\.content\[0\] must be \{'type': 'text', 'text': str\}",
        ),
    ],
)
def test_malformed_messages_are_a_chat_template_error_naming_the_item(raw: Any, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message) as err:
        parse_messages(raw)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


# ---- rendering and the sandbox ------------------------------------------------------------------


def test_a_template_that_raises_is_a_chat_template_error_with_its_message() -> None:
    messages = parse_messages([{"role": "assistant", "content": "first"}])
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        render_chat(ALTERNATING, messages)


def test_a_template_that_does_not_compile_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="the chat template failed"):
        render_chat("{% for m in messages %}", parse_messages(CONVERSATIONS[0]))


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the classic escape towards os/subprocess
        "{% set xs = [] %}{{ xs.append(1) }}",  # immutable sandbox: no mutation of values
        "{% set ns = namespace() %}{% set ns._secret = 1 %}",  # no underscore names on a namespace
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",  # reaching os through a global
    ],
)
def test_the_sandbox_refuses_what_a_template_must_not_do(template: str) -> None:
    with pytest.raises(
        ChatTemplateError, match=r"the chat template failed: .*(unsafe|not safely|cannot|underscore)"
    ):
        render_chat(template, parse_messages(CONVERSATIONS[0]))


def test_extra_variables_tools_and_special_tokens_reach_the_template() -> None:
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ date_string }}|{{ messages[0].content }}"
    )
    text = render_chat(
        template,
        parse_messages([{"role": "user", "content": "é"}]),
        bos_token="<s>",
        eos_token="</s>",
        tools=[{"name": "f"}],
        date_string="1 Jan",
    )
    assert text == '<s>|</s>|[{"name": "f"}]|1 Jan|é'


def test_apply_chat_template_uses_the_tokenizers_template_and_checks_raw_messages() -> None:
    class ChatTokenizer(ByteTokenizer):
        @property
        def chat_template(self) -> str | None:
            return (
                "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ add_generation_prompt }}"
            )

    tokenizer = ChatTokenizer()
    raw = [{"role": "user", "content": "hi"}]
    assert apply_chat_template(tokenizer, raw) == "user=hi;True"
    assert apply_chat_template(tokenizer, parse_messages(raw), add_generation_prompt=False) == "user=hi;False"
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.role"):
        apply_chat_template(tokenizer, [{"role": "bot", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        apply_chat_template(ByteTokenizer(), raw)


# ---- the same text as transformers ----------------------------------------------------------------


@needs_transformers
@pytest.mark.slow  # transformers' import alone is ~3 s of the quick loop; the full run holds us to it
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=CONVERSATION_IDS)
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_render_as_transformers_renders_them(
    name: str, messages: list[dict[str, str]], generation_prompt: bool
) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = TEMPLATES[name]
    if name == "alternating" and messages[0]["role"] == "system":
        messages = messages[1:]
    extra = {"extra_flag": "set"} if name == "features" else {}
    theirs, _ = render_jinja_template(
        conversations=[messages],
        chat_template=template,
        add_generation_prompt=generation_prompt,
        bos_token="<s>",
        eos_token="</s>",
        **extra,
    )
    ours = render_chat(
        template,
        parse_messages(messages),
        add_generation_prompt=generation_prompt,
        bos_token="<s>",
        eos_token="</s>",
        **extra,
    )
    assert ours == theirs[0]


@needs_smollm2
@needs_transformers
@pytest.mark.slow
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=CONVERSATION_IDS)
def test_smollm2_chat_template_renders_as_transformers(
    smollm2: tuple[Decoder, Tokenizer, ModelConfig],
    reference_tokenizer: Any,
    messages: list[dict[str, str]],
    generation_prompt: bool,
) -> None:
    _decoder, tokenizer, _config = smollm2
    ours = apply_chat_template(tokenizer, messages, add_generation_prompt=generation_prompt)
    theirs = reference_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    assert ours == theirs
    # The ids too: the rendered text holds its special tokens, so it is encoded without adding any.
    assert tokenizer.encode(ours, add_special_tokens=False) == reference_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    if messages[0]["role"] != "system":  # SmolLM2's template adds its default system turn
        assert ours.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
