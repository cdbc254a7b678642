"""Chat templates: where they come from, and the sandbox they run in.

Why its own module: a template is data, often from the internet (a model's
``tokenizer_config.json``), and it runs at build time on every record. Loading and
compiling it safely is one concern; using it to locate the trained turns is another
(:class:`~shardwise.writer.chat.ChatProcessor`).

A conversation is rendered with a Jinja chat template (a string, a file, a
``tokenizer_config.json`` holding ``chat_template``, or :data:`BUILTIN_TEMPLATE`) in
jinja2's ``ImmutableSandboxedEnvironment``: templates cannot reach Python internals or
mutate their inputs; a template that tries is refused with :class:`ConfigError`, both
by a static scan for ``_``-prefixed attributes and by the sandbox while rendering.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from shardwise.errors import ConfigError

BUILTIN_TEMPLATE = (
    r"{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message. Register
``<|im_start|>`` and ``<|im_end|>`` as special tokens of the tokenizer
(``tokenizer.add_special_tokens([...])``) so each is one token."""


def load_template(template: str | os.PathLike[str] | None) -> str:
    """The template source: ``None`` → built-in; Jinja text; or a file (``.jinja`` text,
    or a ``tokenizer_config.json`` whose ``chat_template`` is used)."""
    if template is None:
        return BUILTIN_TEMPLATE
    if isinstance(template, str) and ("{{" in template or "{%" in template):
        return template
    path = Path(template)
    if not path.is_file():
        raise ConfigError(f"chat template {str(template)[:80]!r} is neither Jinja text "
                          "(no '{{' or '{%') nor an existing file")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text
    value = json.loads(text).get("chat_template")
    if isinstance(value, list):  # named templates: take "default"
        value = next((t.get("template") for t in value if t.get("name") == "default"), None)
    if not isinstance(value, str):
        raise ConfigError(f"{path} has no 'chat_template' string")
    return value


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def compile_template(source: str) -> Any:
    """Compile in the immutable sandbox; refuse syntax errors and ``_``-attribute access."""
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as e:
        raise ConfigError(f"chat template syntax error at line {e.lineno}: {e.message}"
                          ) from None
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = (node.attr if isinstance(node, nodes.Getattr)
                else getattr(getattr(node, "arg", None), "value", ""))
        if isinstance(name, str) and name.startswith("_"):
            raise ConfigError(f"chat template line {node.lineno} accesses {name!r}: "
                              "templates may not reach Python internals (sandbox)")
    return env.from_string(source)


__all__ = ["BUILTIN_TEMPLATE", "compile_template", "load_template"]
