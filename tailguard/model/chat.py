"""Chat messages to one prompt string, with the served model's own chat template.

Why here and not in vLLM: tailguard costs and routes a request in the API
before any engine sees it, and the cost is counted on the prompt text, so the
API must render the conversation itself, exactly as vLLM's chat endpoint would.
That means Hugging Face's rules (``apply_chat_template``): a sandboxed jinja2
environment with ``trim_blocks``/``lstrip_blocks``, a ``raise_exception``
global, a ``tojson`` filter that does not escape HTML, ``strftime_now`` and
loop controls. transformers is not imported: it would pull torch into the API.

The template comes from the model (operator-controlled), the messages from the
client. So a template that does not compile, or that tries to leave the
sandbox, is a ``ConfigError`` (the served model is broken); a template that
rejects the conversation (``raise_exception``, a missing key) is the client's
``InvalidField`` on ``messages``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from tailguard.errors import ConfigError, InvalidField

#: Where transformers >= 4.47 saves a model's template when not inline in tokenizer_config.json.
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class _TemplateRaised(jinja2.TemplateError):
    """What the template's own ``raise_exception(msg)`` raises: it refuses the conversation."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson: jinja's own escapes <, >, & and ' for HTML, which templates do not want."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}…{% endgeneration %}`` and renders its body unchanged.

    Training-oriented templates mark assistant turns with it (transformers uses
    it for assistant masks); without the tag they would not even compile here.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

    def _passthrough(self, caller: Any) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=8)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per template; call it at startup to fail early on a broken model template."""
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"the model's chat template does not compile: {exc} (line {exc.lineno})",
                          field="chat_template") from exc


def render_chat(messages: list[dict], template: str, *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    """The prompt the model sees for ``messages`` (already validated and normalized by the caller).

    ``add_generation_prompt`` defaults to True, as in vLLM's chat endpoint: the
    prompt ends where the assistant's reply should begin.
    """
    compiled = compile_chat_template(template)
    try:
        return compiled.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt)
    except SecurityError as exc:
        raise ConfigError(f"the model's chat template tried to leave its sandbox: {exc}",
                          field="chat_template") from exc
    except _TemplateRaised as exc:
        raise InvalidField(f"the model's chat template rejected the messages: {exc}",
                           field="messages") from exc
    except jinja2.TemplateError as exc:  # e.g. UndefinedError: a key the template needs is missing
        raise InvalidField(f"the model's chat template cannot render these messages: {exc}",
                           field="messages") from exc


def chat_template_for(model_dir: Path, tokenizer_config: dict) -> str | None:
    """The model's chat template, looked up where transformers looks; None if it has none.

    Inline in tokenizer_config.json first (a string, or a list of named
    templates of which "default" is the chat one), then ``chat_template.jinja``.
    """
    inline = tokenizer_config.get("chat_template")
    if isinstance(inline, str):
        return inline
    if isinstance(inline, list):
        for entry in inline:
            if isinstance(entry, dict) and entry.get("name") == "default" \
                    and isinstance(entry.get("template"), str):
                return entry["template"]
    path = Path(model_dir) / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return None


def special_token(tokenizer_config: dict, name: str) -> str:
    """The text of a special token (``bos_token``, ``eos_token``) for the template, or "".

    tokenizer_config.json stores it as a string or as an AddedToken dict ``{"content": ...}``.
    """
    value = tokenizer_config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
