"""Draft model: a smaller model with the target's tokenizer drafts greedily with its own KV cache.

The draft model's cache follows the history: each ``draft`` call prefills the history against what the cache holds
(``Llm.prefill`` keeps the common prefix and rolls back the rest, recurrent state included), which after a verify
step is one or two tokens (the target's own token, and the last draft when all were accepted), then runs k - 1
one-token steps. Its drafts are greedy (q one-hot), which keeps sampled output exact (``accept.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...contract.errors import HeteroError
from ..generate import greedy_tokens
from .drafter import Hidden
from .target import Target


class DraftModel:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: Target, target: Target, *, max_draft: int = 6) -> None:
        check_same_vocabulary(model, target)
        self.model = model
        self.max_draft = max_draft

    def reset(self) -> None:
        pass  # the draft cache is matched against each history by prefill()

    def begin(self, prompt: Sequence[int], hidden: Hidden) -> None:
        pass

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Hidden) -> None:
        pass  # the next draft() prefill rolls the cache back to what was kept

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        model = self.model
        k = min(k, model.context - len(history))
        if k <= 0:
            return []
        return greedy_tokens(model, list(history), k)

def check_same_vocabulary(draft: Target, target: Target) -> None:
    """Refuse a draft model whose tokenizer maps any token to another id than the target's."""
    where = f"draft model {_where(draft)} and target {_where(target)}"
    a, b = draft.tokenizer, target.tokenizer
    if a is None or b is None:
        if a is not b or draft.config.vocab_size != target.config.vocab_size:
            raise HeteroError(f"{where}: cannot tell their vocabularies are the same (a tokenizer is missing and the "
                              f"vocabulary sizes are {draft.config.vocab_size} and {target.config.vocab_size})")
        return
    va, vb = a.vocabulary(), b.vocabulary()
    if va != vb:
        differ = sorted(set(va.items()) ^ set(vb.items()), key=lambda item: item[1])[:3]
        raise HeteroError(f"{where} have different vocabularies ({len(va)} and {len(vb)} tokens; e.g. "
                          f"{', '.join(f'{t!r} -> {i}' for t, i in differ)})",
                          hint="a draft model must use the target's tokenizer (same family and version)")


def _where(llm: Target) -> str:
    return str(llm.path) if llm.path is not None else repr(llm.name)
