"""Chat templates rendered as transformers would, inside jinja2's sandbox."""

import json

import pytest

from tailguard.errors import ConfigError, InvalidField
from tailguard.model.chat import (
    chat_template_for,
    compile_chat_template,
    render_chat,
    special_token,
)
from tailguard.model.demo import CHAT_TEMPLATE, build_demo_model


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("demo") / "tiny", size="tiny")


@pytest.fixture(scope="module")
def demo_template(demo_dir):
    config = json.loads((demo_dir / "tokenizer_config.json").read_text())
    template = chat_template_for(demo_dir, config)
    assert template is not None
    return template


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "解释KV Cache"}]


def test_demo_model_template_is_found(demo_dir, demo_template):
    assert demo_template == CHAT_TEMPLATE
    # transformers 5 also writes it next to the weights: the fallback finds the same text
    assert chat_template_for(demo_dir, {}) == CHAT_TEMPLATE


def test_render_with_demo_template(demo_template):
    assert render_chat(MESSAGES, demo_template) == \
        "<|system|>\nbe brief</s>\n<|user|>\n解释KV Cache</s>\n<|assistant|>\n"
    assert render_chat(MESSAGES, demo_template, add_generation_prompt=False) == \
        "<|system|>\nbe brief</s>\n<|user|>\n解释KV Cache</s>\n"


def test_template_lookup_order(tmp_path):
    assert chat_template_for(tmp_path, {}) is None
    (tmp_path / "chat_template.jinja").write_text("from file")
    assert chat_template_for(tmp_path, {}) == "from file"
    assert chat_template_for(tmp_path, {"chat_template": "inline"}) == "inline"
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]
    assert chat_template_for(tmp_path, {"chat_template": named}) == "chat"
    assert chat_template_for(tmp_path, {"chat_template": named[:1]}) == "from file"


def test_hugging_face_environment():
    # trim_blocks and lstrip_blocks: block tags leave no newline or indentation behind
    template = ("{{ bos_token }}{% for m in messages %}\n"
                "    {% if m.role == 'user' %}\n"
                "[{{ m.content | tojson }}]{{ eos_token }}\n"
                "    {% endif %}\n"
                "{% endfor %}")
    out = render_chat([{"role": "user", "content": "<b>é</b>"}, {"role": "system", "content": "x"}],
                      template, bos_token="<s>", eos_token="</s>")
    # tojson keeps HTML characters and non-ASCII as they are, unlike jinja's own filter
    assert out == '<s>["<b>é</b>"]</s>\n'


def test_transformers_extensions_and_globals():
    template = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
                "{{ strftime_now('%Y') | length }}")
    assert render_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                       template) == "a4"


def test_raise_exception_rejects_the_conversation():
    template = ("{% if messages[0]['role'] != 'user' %}"
                "{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok")
    assert render_chat([{"role": "user", "content": "hi"}], template) == "ok"
    with pytest.raises(InvalidField, match="must start with a user message") as err:
        render_chat([{"role": "assistant", "content": "hi"}], template)
    assert err.value.field == "messages"


def test_missing_key_needed_by_template_is_the_clients_error():
    with pytest.raises(InvalidField) as err:
        render_chat([{"role": "user", "content": "hi"}], "{{ messages[0].tool_calls.name }}")
    assert err.value.field == "messages"


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set _ = messages.append({'role': 'user'}) %}x",  # immutable: no mutating methods
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_sandbox_escape_fails(template):
    with pytest.raises(ConfigError) as err:
        render_chat([{"role": "user", "content": "hi"}], template)
    assert err.value.field == "chat_template"


def test_broken_template_is_a_config_error():
    with pytest.raises(ConfigError, match="does not compile") as err:
        compile_chat_template("{% for m in messages %}")
    assert err.value.field == "chat_template"


@pytest.mark.parametrize("config,expected", [
    ({"bos_token": "<s>"}, "<s>"),
    ({"bos_token": {"content": "<s>", "lstrip": False}}, "<s>"),
    ({"bos_token": None}, ""),
    ({}, ""),
])
def test_special_token(config, expected):
    assert special_token(config, "bos_token") == expected
