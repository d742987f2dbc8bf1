"""A local tokenizer folder in Hugging Face's layout, without ``transformers``.

``tokenizer.json`` is read by the ``tokenizers`` package (counting tokens for ``usage`` when a
model does not report its counts); ``tokenizer_config.json`` gives the ``chat_template`` and the
special tokens, and the template is rendered with ``jinja2`` in a sandbox the way
``transformers``' ``apply_chat_template`` renders it (``trim_blocks``, ``lstrip_blocks``,
``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text). Both packages
are the ``llm`` extra, imported only when a tokenizer is loaded.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

EXTRA = "pip install 'nursery[llm]'"


class TokenizerError(Exception):
    """A tokenizer that cannot be loaded or a template that cannot be rendered."""


def _require() -> tuple[Any, Any]:
    try:
        import jinja2.sandbox
        import tokenizers
    except ImportError as exc:
        raise TokenizerError(f"chat templates and token counts need the llm extra "
                             f"({exc.name} is missing): {EXTRA}") from None
    return jinja2.sandbox, tokenizers


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]  # an AddedToken written as a dict
    return None


class Tokenizer:
    """One tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``)."""

    def __init__(self, folder: Path, chat_template: str | None = None) -> None:
        sandbox, tokenizers = _require()
        self.folder = folder
        if not (folder / "tokenizer.json").is_file():
            raise TokenizerError(f"no tokenizer.json in the tokenizer folder '{folder}'")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:
            raise TokenizerError(f"cannot read {folder / 'tokenizer.json'}: {exc}") from None
        config: dict[str, Any] = {}
        path = folder / "tokenizer_config.json"
        if path.is_file():
            try:
                config = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise TokenizerError(f"cannot read {path}: {exc}") from None
        template = chat_template if chat_template is not None else config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        self.chat_template: str | None = template if isinstance(template, str) else None
        self.special = {key: text for key, value in config.items()
                        if key.endswith("_token") and (text := _token_text(value)) is not None}
        env = sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

        def raise_exception(message: str) -> None:
            raise TokenizerError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self._template = None
        if self.chat_template is not None:
            try:
                self._template = env.from_string(self.chat_template)
            except Exception as exc:
                raise TokenizerError(f"the chat template of '{folder}' does not compile: "
                                     f"{exc}") from None

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        if self._template is None:
            raise TokenizerError(
                "Cannot use chat template functions because tokenizer.chat_template is not "
                "set and no template argument was passed!")
        try:
            return str(self._template.render(messages=messages, tools=tools,
                                             add_generation_prompt=add_generation_prompt,
                                             **self.special))
        except TokenizerError:
            raise
        except Exception as exc:
            raise TokenizerError(f"cannot use chat template: {exc}") from None

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        return len(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)


def load_chat_template(path: str | None) -> str | None:
    """``--chat-template``: a file's text, or the argument itself when it is not a file (as
    Triton's frontend accepts)."""
    if not path:
        return None
    p = Path(path)
    try:
        if p.is_file():
            return p.read_text()
    except OSError:  # a template given inline can be longer than a file name may be
        pass
    if any(c in path for c in "{}\n"):
        return path
    raise TokenizerError(f"--chat-template: no such file '{path}'")


__all__ = ["EXTRA", "Tokenizer", "TokenizerError", "load_chat_template"]
