"""The ``draft:PATH`` drafter kind: loads the draft model with the target's options. Registered when the registry
first meets the kind (it imports the loader, which imports the model, which reaches the registry: kept out of the
registry's own imports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...contract.errors import HeteroError
from ..loader import load
from .draft_model import DraftModel
from .drafter import Drafter
from .registry import register

if TYPE_CHECKING:
    from ..model import Llm


def _draft_model(argument: str, target: Llm) -> Drafter:
    if not argument:
        raise HeteroError("--spec draft:PATH needs the draft model's path (a Hugging Face folder or a GGUF file)")
    model = load(argument, threads=target.threads, context=target.context, kv_cache=target.kv_cache,
                 **{k: v for k, v in target._session_args.items() if k in ("backends", "on_fallback")})
    return DraftModel(model, target)


register("draft", _draft_model)
