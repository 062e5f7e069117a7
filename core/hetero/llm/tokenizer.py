"""Tokenizer and chat template of a Hugging Face folder: ``tokenizer.json`` through the ``tokenizers`` package,
the jinja2 chat template from ``tokenizer_config.json`` (or ``chat_template.jinja``), EOS ids from the configs."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..contract.errors import HeteroError, ModelFormatError
from .config import read_json


class TemplateError(HeteroError):
    """The chat template refused the messages (its ``raise_exception``) or failed to render."""


class Tokenizer:
    def __init__(self, folder: str | Path, extra_eos: tuple[int, ...] = ()) -> None:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:  # a core dependency, but say what to do if it is gone
            raise HeteroError("the 'tokenizers' package is needed to read tokenizer.json",
                              hint="pip install tokenizers") from exc
        if not path.is_file():
            raise ModelFormatError(f"{path} does not exist: the model folder has no tokenizer")
        try:
            self._tok = HfTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ModelFormatError(f"{path}: cannot load the tokenizer: {exc}") from None
        config_path = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = read_json(config_path) if config_path.is_file() else {}
        self.chat_template = _find_template(folder, self.config)
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        eos = list(extra_eos)
        gen_path = folder / "generation_config.json"
        self.generation_config: dict[str, Any] = read_json(gen_path) if gen_path.is_file() else {}
        gen_eos = self.generation_config.get("eos_token_id")
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos] if isinstance(gen_eos, int) else []
        if self.eos_token is not None and self.token_id(self.eos_token) is not None:
            eos.append(self.token_id(self.eos_token))  # type: ignore[arg-type]
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos))

    @classmethod
    def from_parts(cls, tokenizer: Any, *, chat_template: str | None = None, bos_token: str | None = None,
                   eos_token: str | None = None, eos_ids: tuple[int, ...] = (),
                   generation_config: dict[str, Any] | None = None, config: dict[str, Any] | None = None) -> Tokenizer:
        """A Tokenizer from a ready ``tokenizers.Tokenizer`` and its parts (GGUF files carry no tokenizer.json)."""
        self = cls.__new__(cls)
        self._tok = tokenizer
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.generation_config = dict(generation_config or {})
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
        return self

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """The chat template applied to ``messages``, as transformers' ``apply_chat_template(tokenize=False)``."""
        if self.chat_template is None:
            raise ModelFormatError("the model has no chat template (tokenizer_config.json 'chat_template' or "
                                   "chat_template.jinja)")
        return render_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _find_template(folder: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"  # transformers 5 saves the template beside the config
    return jinja.read_text(encoding="utf-8") if jinja.is_file() else None


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV_CACHE: dict[str, Any] = {}


def render_template(template: str, messages: list[dict[str, Any]], **context: Any) -> str:
    """Render a chat template in a sandbox with the names Hugging Face templates use (``raise_exception``,
    ``tojson``, ``strftime_now``), blocks trimmed as transformers does."""
    compiled = _ENV_CACHE.get(template)
    if compiled is None:
        from jinja2 import TemplateError as JinjaError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            compiled = env.from_string(template)
        except JinjaError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from None
        _ENV_CACHE[template] = compiled
    try:
        return compiled.render(messages=messages, **context)
    except TemplateError:
        raise
    except Exception as exc:  # jinja2 errors and template type errors alike
        raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
