"""Acceptance rules: which drafted tokens the target keeps, and the token it adds.

``rows[i]`` are the target's logits after ``history + draft[:i]``; the sampler's settings (penalties, temperature,
top-k/p, min-p) turn each row into the distribution plain decoding would draw from at that point.

* Greedy: keep drafts while each equals the target's own choice; the first mismatch is replaced by that choice,
  and a fully accepted draft earns the choice after it. The output is exactly plain greedy decoding's.
* Sampled (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): keep draft token x drawn from the
  drafter's q with probability min(1, p(x) / q(x)); on the first rejection draw from norm(max(0, p - q)) and stop.
  Every committed token is then distributed as p, whatever q is. A deterministic drafter has q one-hot at its
  token: accept with probability p(x), else draw from p with x removed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..sampler import Hint, Sampler, apply_penalties, filtered_probs, no_hint
from .drafter import Draft


def target_probs(sampler: Sampler, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
    """The distribution the sampler draws from after ``history`` (float64 ``[vocab]``; sampling settings only)."""
    x = apply_penalties(np.array(logits, dtype=np.float64).reshape(-1), history, sampler.params)
    return filtered_probs(x, sampler.params)


def accept(sampler: Sampler, rows: np.ndarray, draft: Draft, history: list[int],
           hint: Hint = no_hint) -> tuple[int, int]:
    """(number of drafts accepted, the target's next token) for ``draft`` scored as ``rows`` (``len(draft) + 1``
    logits rows) after ``history``. ``hint``: ``greedy_hint``'s (sampler.py), used by greedy acceptance only."""
    if sampler.params.greedy:
        return _accept_greedy(sampler, rows, draft.tokens, history, hint)
    return _accept_sampled(sampler, rows, draft, history)


def _accept_greedy(sampler: Sampler, rows: np.ndarray, tokens: list[int], history: list[int],
                   hint: Hint) -> tuple[int, int]:
    context = list(history)
    for i, token in enumerate(tokens):
        row = rows[i]
        # greedy: argmax after penalties, no randomness
        choice = sampler.sample(row, context, hint(row))
        if choice != token:
            return i, choice
        context.append(token)
    row = rows[len(tokens)]
    return len(tokens), sampler.sample(row, context, hint(row))


def _accept_sampled(sampler: Sampler, rows: np.ndarray, draft: Draft, history: list[int]) -> tuple[int, int]:
    context = list(history)
    rng = sampler.rng
    for i, token in enumerate(draft.tokens):
        p = target_probs(sampler, rows[i], context)
        q = draft.probs[i] if draft.probs is not None else None
        q_token = 1.0 if q is None else float(q[token])
        if q_token > 0 and rng.random() < min(1.0, p[token] / q_token):
            context.append(token)
            continue
        if q is None:
            residual = p.copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p - np.asarray(q, dtype=np.float64), 0.0)
        total = residual.sum()
        # p == q on the support (or p one-hot at the token): the residual is empty; p itself is then the answer
        dist = residual / total if total > 0 else p
        return i, int(rng.choice(dist.size, p=dist))
    p = target_probs(sampler, rows[len(draft.tokens)], context)
    return len(draft.tokens), int(rng.choice(p.size, p=p))
