"""Tokenizer and chat template of a Hugging Face folder: ``tokenizer.json`` through the ``tokenizers`` package,
the jinja2 chat template from ``tokenizer_config.json`` (or ``chat_template.jinja``), EOS ids from the configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contract.errors import HeteroError, ModelFormatError
from . import files
from .fields import Fields
from .template import ChatTemplate, TemplateError

__all__ = ["TemplateError", "Tokenizer", "TokenizerPanic", "guarded"]


class TokenizerPanic(ModelFormatError):
    """The ``tokenizers`` library panicked (a Rust panic: ``pyo3_runtime.PanicException``, which is not an
    ``Exception``) on this model's tokenizer."""


def guarded(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` with the tokenizers library's panics turned into ``TokenizerPanic``."""
    try:
        return call(*args, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise TokenizerPanic(f"{what}: the tokenizers library panicked: {str(exc)[:300]}") from None


class Tokenizer:
    def __init__(self, folder: str | Path, extra_eos: tuple[int, ...] = (), *, root: Path | None = None) -> None:
        folder = Path(folder)
        root = root or files.model_root(folder)
        path = folder / "tokenizer.json"
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:  # a core dependency, but say what to do if it is gone
            raise HeteroError("the 'tokenizers' package is needed to read tokenizer.json",
                              hint="pip install tokenizers") from exc
        if not path.exists():
            raise ModelFormatError(f"{path} does not exist: the model folder has no tokenizer")
        text = files.read_text(path, files.MAX_TOKENIZER_BYTES, root)
        files.parse_json(text, str(path))  # its nesting and numbers bounded before the Rust parser sees it
        try:
            self._tok = guarded(str(path), HfTokenizer.from_str, text)
        except TokenizerPanic:
            raise
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ModelFormatError(f"{path}: cannot load the tokenizer: {str(exc)[:300]}") from None
        guarded(str(path), self._tok.encode, "Hello, world!")  # a tokenizer that panics on every text fails here
        config_path = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = files.read_json(config_path, root=root) if config_path.exists() else {}
        self.chat_template = _find_template(folder, self.config, root)
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        eos = list(extra_eos)
        gen_path = folder / "generation_config.json"
        self.generation_config: dict[str, Any] = files.read_json(gen_path, root=root) if gen_path.exists() else {}
        eos += Fields(self.generation_config, gen_path).token_ids("eos_token_id")
        if self.eos_token is not None and (eos_id := self.token_id(self.eos_token)) is not None:
            eos.append(eos_id)
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
    def backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` underneath (grammar libraries read its JSON form)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocabulary(self) -> dict[str, int]:
        """Every token (added tokens included) -> its id."""
        return dict(self._tok.get_vocab(with_added_tokens=True))

    @property
    def concatenates(self) -> bool:
        """Whether decoding a list of ids joins their texts whenever each part decodes to whole characters (a
        byte-level BPE decoder alone: each token's bytes joined, then one lossy UTF-8 decode; GPT-2, Qwen, Llama 3).
        Not so for SentencePiece's Metaspace (a first token's leading space is dropped) or decoder sequences."""
        cached = getattr(self, "_concatenates", None)
        if cached is None:
            from tokenizers import decoders

            cached = self._concatenates = type(getattr(self._tok, "decoder", None)) is decoders.ByteLevel
        return cached

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest token: a text longer than ``context x`` this cannot fit a context."""
        if getattr(self, "_max_token_chars", None) is None:
            self._max_token_chars = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        return self._max_token_chars

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise HeteroError(f"text to tokenize must be a str, got {type(text).__name__}")
        return list(guarded("encoding", self._tok.encode, text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return guarded("decoding", self._tok.decode, list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """The chat template applied to ``messages``, as transformers' ``apply_chat_template(tokenize=False)``."""
        if self.chat_template is None:
            raise ModelFormatError("the model has no chat template (tokenizer_config.json 'chat_template' or "
                                   "chat_template.jinja)")
        template = ChatTemplate(self.chat_template, bos_token=self.bos_token, eos_token=self.eos_token)
        return template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _find_template(folder: Path, config: dict[str, Any], root: Path) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    jinja = folder / "chat_template.jinja"  # transformers 5 saves the template beside the config
    return files.read_text(jinja, files.MAX_TEMPLATE_BYTES, root) if jinja.exists() else None
