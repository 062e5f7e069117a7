"""Drafters by name, as ``--spec`` and ``generate(spec="...")`` take them: ``KIND`` or ``KIND:ARGUMENT``.

Built in: ``lookahead`` (prompt lookup, no argument; ``lookahead:flat`` drafts ungraded, as before the
confidence classes, for comparisons) and ``draft:PATH`` (a smaller model with the target's
tokenizer: a Hugging Face folder or a GGUF file, loaded with the target's backends, threads, context and KV cache
type; ``draft:PATH,vocab=N`` drafts over the N lowest token ids, ``vocab=all`` over the whole vocabulary, default
``DRAFT_VOCAB``; ``,rank=freq`` keeps the N tokens most frequent on a local corpus instead of the lowest ids,
``,rank=PATH`` those most frequent by a ``.npy`` file of per-token counts; ``,p_min=X`` ends a draft after a token
drafted at a probability under X; ``,max=N``: the longest draft (``--spec-draft`` overrides it); ``,quant=FMT``
(default ``DRAFT_QUANT``, q4_sym_b128) re-quantizes the draft's matrices stored in wider formats (q5_0, q6_k, q8) to
FMT at load,
``,quant=none`` keeps them; ``,lookup=N`` (default ``LOOKUP``, 0: off): n-gram guesses of the draft model's own
next tokens checked in one step of it: ``draft_model.py``).
``eagle:PATH`` and ``dflash:PATH`` are registered by their modules (``hetero.llm.speculative.eagle`` /
``.dflash``), imported at their first use. A module adds a kind with ``register(kind, factory)``; the factory is
called as ``factory(argument, target)`` and returns a ``Drafter``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...contract.errors import HeteroError
from ...contract.quant import parse_quant
from ..families.decoder import VERIFY_ROWS
from .draft_model import (
    DRAFT_QUANT,
    DRAFT_RANK,
    DRAFT_VOCAB,
    LOOKUP,
    LOOKUP_MAX,
    MAX_DRAFT,
    P_MIN,
    DraftModel,
    draft_vocabulary,
    read_token_counts,
    token_counts,
)
from .drafter import Drafter
from .lookahead import Lookahead
from .loop import Speculation
from .target import Target

Factory = Callable[[str, Any], Drafter]  # (argument, the target Llm) -> drafter

_FACTORIES: dict[str, Factory] = {}
# kinds whose module registers them when imported
_MODULES = {"eagle": "hetero.llm.speculative.eagle", "dflash": "hetero.llm.speculative.dflash"}


def register(kind: str, factory: Factory) -> None:
    _FACTORIES[kind] = factory


def kinds() -> list[str]:
    return sorted({*_FACTORIES, *_MODULES})


def make_drafter(spec: str, target: Target) -> Drafter:
    """The drafter named by ``spec`` (``KIND`` or ``KIND:ARGUMENT``) for ``target``."""
    if not isinstance(spec, str) or not spec:
        raise HeteroError(f"spec={spec!r}; expected a drafter name: {', '.join(_usage())}")
    kind, _, argument = spec.partition(":")
    if kind not in _FACTORIES and kind in _MODULES:
        try:
            importlib.import_module(_MODULES[kind])
        except ModuleNotFoundError as exc:
            if exc.name != _MODULES[kind]:
                raise
            raise HeteroError(f"--spec {kind}: the {kind} drafter is not part of this build ({_MODULES[kind]} is "
                              "missing)") from None
    factory = _FACTORIES.get(kind)
    if factory is None:
        raise HeteroError(f"unknown drafter {spec!r}; expected one of {', '.join(_usage())}")
    return factory(argument, target)


def speculation(spec: Any, target: Target, *, max_draft: int | None = None) -> Speculation:
    """``spec`` (a ``Speculation``, a ``Drafter`` or a name) as a ``Speculation`` for ``target``."""
    if isinstance(spec, Speculation):
        return spec
    if isinstance(spec, str):
        return Speculation(make_drafter(spec, target), max_draft=max_draft)
    if isinstance(spec, Drafter):
        return Speculation(spec, max_draft=max_draft)
    raise HeteroError(f"spec={spec!r}; expected a drafter name ({', '.join(_usage())}), a Drafter or a Speculation")


def _usage() -> list[str]:
    return [f"{kind}:PATH" if kind != "lookahead" else kind for kind in kinds()]


def _lookahead(argument: str, target: Target) -> Drafter:
    if argument == "flat":  # the drafter before confidence classes (n-grams of 2-4, one acceptance): comparisons
        return Lookahead(min_ngram=2, graded=False)
    if argument:
        raise HeteroError(f"--spec lookahead takes no argument (or 'flat': ungraded drafts), got {argument!r}")
    return Lookahead()


def _draft_model(argument: str, target: Target) -> Drafter:
    path, options = _draft_options(argument)
    if not path:
        raise HeteroError("--spec draft:PATH needs the draft model's path (a Hugging Face folder or a GGUF file)")
    # the loader imports the model, which resolves drafter names here: taken at call time, not imported
    load = importlib.import_module("hetero.llm.loader").load
    vocab, size, rank = target.config.vocab_size, int(options["vocab"]), options["rank"]
    counts = None
    if rank != "bpe" and 0 < size < vocab:
        if rank != "freq":
            counts = read_token_counts(rank, vocab)
        elif target.tokenizer is None:
            raise HeteroError(f"--spec draft:{argument}: rank=freq counts tokens with the target's tokenizer, and the "
                              "target has none (give rank=COUNTS.npy or rank=bpe)")
        else:
            counts = token_counts(target.tokenizer, vocab)
    rows = draft_vocabulary(target.tokenizer, vocab, size, counts)  # the draft's: checked
    model = load(path, threads=target.threads, context=target.context, kv_cache=target.kv_cache, head_rows=rows,
                 requantize=options["quant"] or None,
                 **{k: v for k, v in target._session_args.items() if k in ("backends", "on_fallback")})
    return DraftModel(model, target, p_min=float(options["p_min"]), max_draft=int(options["max"]),
                      lookup=int(options["lookup"]))


def _draft_options(argument: str) -> tuple[str, dict[str, Any]]:
    """``PATH[,vocab=N|all][,rank=bpe|freq|COUNTS.npy][,p_min=X][,max=N][,quant=FMT|none][,lookup=N]`` -> (path,
    {"vocab": draft vocabulary size (0: all), "rank": which ids it keeps, "p_min": ..., "max": the longest draft,
    "quant": the format its wider matrices are re-quantized to ("": none), "lookup": the shortest n-gram match whose
    continuation the draft model checks in one step (0: off)})."""
    path = argument
    options: dict[str, Any] = {"vocab": float(DRAFT_VOCAB), "p_min": P_MIN, "max": float(MAX_DRAFT),
                               "quant": DRAFT_QUANT or "", "lookup": float(LOOKUP), "rank": DRAFT_RANK}
    while True:
        head, _, tail = path.rpartition(",")
        key, eq, value = tail.partition("=")
        if not head or not eq or key not in options:
            return path, options
        if key == "rank":  # bpe, freq or a counts file (read, and checked, when the drafter is made)
            if not value:
                raise HeteroError(f"--spec draft:{argument}: rank=''; expected bpe, freq or a .npy file of counts")
            options[key], path = value, head
            continue
        if key == "quant":
            if value != "none":
                parse_quant(value)  # a clear error for a bad format
            options[key], path = "" if value == "none" else value, head
            continue
        try:
            number = 0.0 if key == "vocab" and value == "all" else float(value)
        except ValueError:
            number = -1.0
        if key == "vocab" and number != 0 and (number < 256 or not value.isdigit()):
            raise HeteroError(f"--spec draft:{argument}: vocab={value!r}; expected a number of tokens (at least 256) "
                              "or 'all'")
        if key == "max" and not (value.isdigit() and 1 <= number <= VERIFY_ROWS - 1):
            raise HeteroError(f"--spec draft:{argument}: max={value!r}; expected 1 to {VERIFY_ROWS - 1} tokens")
        if key == "lookup" and not (value.isdigit() and 0 <= number <= LOOKUP_MAX):
            raise HeteroError(f"--spec draft:{argument}: lookup={value!r}; expected 0 (off) to {LOOKUP_MAX} tokens")
        if key == "p_min" and not 0 <= number < 1:
            raise HeteroError(f"--spec draft:{argument}: p_min={value!r}; expected a probability in [0, 1)")
        options[key], path = number, head


register("lookahead", _lookahead)
register("draft", _draft_model)
