"""The ``Drafter`` protocol: what the speculative loop (``loop.py``) asks of anything that proposes tokens.

One generation, as the loop drives it (``history``: the prompt and every token committed so far, in order):

1. ``begin(prompt, hidden)`` once, after the target has prefilled the prompt. ``hidden`` maps each layer index the
   drafter named in ``hidden_layers`` to the target's hidden states of the prompt, float32 ``[len(prompt), H]``
   (row i: the residual stream after that decoder layer at prompt position i; ``{}`` when the drafter names none).
2. Then, per step: ``draft(history, k)`` proposes up to ``k`` next tokens (fewer or none is fine: an empty draft
   makes the step a plain decode step). It returns a list of ids, or a ``Draft`` that also carries the drafter's
   probabilities ``q`` of each proposed token's position (drafters that sample; a plain list means q is one-hot
   at the proposed token, which is what every deterministic drafter has).
3. The target scores ``[history[-1], *draft]`` in one forward pass (``Llm.verify``), accepts the longest prefix the
   acceptance rule allows (``accept.py``) and adds one token of its own. The loop then calls
   ``accept(n_accepted, tokens, hidden)``: ``tokens`` are the newly committed tokens (the ``n_accepted`` accepted
   drafts, then the target's token); ``hidden`` maps each layer in ``hidden_layers`` to ``[n_accepted + 1, H]``:
   the target's hidden states at the positions of ``[history[-1], *draft[:n_accepted]]`` (the tokens now in the
   target's cache, whose rows predict the next ones). After the first token, which comes from the prefill's own
   logits, ``accept(0, [token], rows)`` has zero rows. The arrays are views valid during the call only: copy
   what is kept.
   Steps the loop takes without asking for a draft (the policy has drafting off) are told at the next ``draft``,
   in one call, as though one step had committed them all: ``accept(len(tokens) - 1, tokens, hidden)`` with the
   rows of the positions before each token (one row fewer when the batch starts with the first token). A drafter
   that is off costs nothing per step.
4. ``reset()`` forgets everything (a new conversation, or the loop giving up on a broken state).

Rolling back is the drafter's own business: a drafter with a cache (a draft model, Eagle's layer) keeps only what
``accept`` confirmed; ``history`` passed to ``draft`` always extends what was confirmed.

``hidden_layers``: decoder layer indices (0-based, negative counts from the end as in Python) whose outputs the
drafter needs. The target exposes them as graph outputs (``Llm.expose_hidden``); the loop does it before ``begin``.
``max_draft``: the longest draft worth verifying (the loop's adaptive length stays at or below it).
``graded`` (optional, default False): the drafter's drafts cost nothing and carry a ``confidence`` class: the loop
then asks for ``max_draft`` tokens whenever it drafts and the policy cuts each draft to the length that pays for
its class (the lookahead drafter: the length of the n-gram match).
``one_pass`` (optional, default False): a draft of any length up to ``max_draft`` costs the drafter one pass (DFlash's
block): the policy prices a draft by the measured seconds of a drafting step instead of per draft token.
``numpy`` (optional, default True): the drafter may run numpy matmuls, so the loop holds numpy's OpenBLAS at one
thread around its calls (``one_blas_thread``); False (the lookahead) skips that toggle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

Hidden = Mapping[int, np.ndarray]


@dataclass
class Draft:
    """Proposed tokens and, for drafters that sample, ``probs[i]``: the drafter's distribution (float ``[vocab]``)
    at the position of ``tokens[i]``, from which it was drawn. ``confidence``: a class of how likely the draft is
    to be right (a small int, e.g. the lookahead match length; None: unclassed); the policy learns the acceptance
    of each class apart and sizes the draft by it (``policy.py``)."""

    tokens: list[int]
    probs: list[np.ndarray] | None = None
    confidence: int | None = None


@runtime_checkable
class Drafter(Protocol):
    hidden_layers: tuple[int, ...]
    max_draft: int

    def begin(self, prompt: Sequence[int], hidden: Hidden) -> None: ...

    def draft(self, history: Sequence[int], k: int) -> Draft | list[int]: ...

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Hidden) -> None: ...

    def reset(self) -> None: ...


def as_draft(proposal: Draft | Sequence[int], k: int, vocab: int) -> Draft:
    """A drafter's proposal, cut to ``k`` tokens; ids outside the target's vocabulary end it (a draft model whose
    embedding table is padded larger than the target's may propose them)."""
    draft = proposal if isinstance(proposal, Draft) else Draft([int(t) for t in proposal])
    tokens = []
    for t in draft.tokens[:k]:
        if not 0 <= int(t) < vocab:
            break
        tokens.append(int(t))
    probs = draft.probs[:len(tokens)] if draft.probs is not None else None
    return Draft(tokens, probs, draft.confidence)
