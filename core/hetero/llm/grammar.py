"""Constrained decoding: only tokens that keep the output valid under a JSON schema (or a Lark grammar) are sampled.

The grammar engine is llguidance (``pip install llguidance``, or ``hetero[serve]``): a Rust library with no Python
dependencies (3 MB wheel) that computes each step's token mask lazily from the model's own ``tokenizer.json``, so a
schema costs milliseconds to compile, not an index over the vocabulary. (xgrammar pulls torch, transformers and
triton; outlines-core builds a full automaton per schema up front.)
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import numpy as np

from ..contract.errors import HeteroError

# One line, separators as json.dumps writes them: a model may not pad its output with unbounded whitespace.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise HeteroError("constrained decoding (response_format with a JSON schema) needs the llguidance package",
                          hint="pip install 'hetero[serve]' (or pip install llguidance)") from exc
    return llguidance


def _grammar_tokenizer(llm: Any) -> Any:
    """llguidance's view of the model's tokenizer, built once per tokenizer (~50 ms for a 150k vocabulary)."""
    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise HeteroError(f"model {llm.name!r} has no tokenizer: constrained decoding needs one")
    with _tokenizers_lock:
        built = _tokenizers.get(tokenizer)
        if built is None:
            llg = _llguidance()
            built = llg.LLTokenizer(tokenizer.backend.to_str(), n_vocab=llm.config.vocab_size,
                                    eos_token=list(llm.eos_ids))
            _tokenizers[tokenizer] = built
        return built


class GrammarConstraint:
    """One generation's grammar state: the mask of allowed tokens, advanced by each token chosen (``Sampler``'s
    ``constraint``). Once the grammar is complete only the end-of-sequence tokens are allowed."""

    def __init__(self, llm: Any, grammar: str) -> None:
        llg = _llguidance()
        self._matcher = llg.LLMatcher(_grammar_tokenizer(llm), grammar, log_level=0)
        if self._matcher.is_error():
            raise HeteroError(f"the grammar cannot be used: {self._matcher.get_error()}")

    @classmethod
    def json_schema(cls, llm: Any, schema: dict[str, Any] | None) -> GrammarConstraint:
        """Output that is a JSON value matching ``schema`` (None: any JSON object)."""
        if schema is not None and not isinstance(schema, dict):
            raise HeteroError(f"a JSON schema must be an object, got {type(schema).__name__}")
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(
                json.dumps(schema if schema is not None else {"type": "object"}), defaults=JSON_LAYOUT)
        except (ValueError, RuntimeError) as exc:  # llguidance's refusal of a schema it does not support
            raise HeteroError(f"the JSON schema cannot be used: {str(exc)[:300]}") from None
        return cls(llm, grammar)

    def allowed(self, vocab_size: int) -> np.ndarray:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[:vocab_size].astype(bool)
        if self._matcher.is_error():
            raise HeteroError(f"grammar: {self._matcher.get_error()}")
        return mask

    def advance(self, token: int) -> None:
        if not self._matcher.consume_token(token) and not self._matcher.is_stopped():
            raise HeteroError(f"grammar: token {token} was not allowed: {self._matcher.get_error()}")

    @property
    def accepting(self) -> bool:
        """Whether the output so far is complete under the grammar."""
        return bool(self._matcher.is_accepting())
