"""The speculative token source: prefill, then verify steps, each committing one or more tokens.

``Speculation`` (a drafter and its policy) is what ``Llm.generate(spec=...)`` takes; ``generate_stream`` pulls
tokens from ``Speculation.start`` one at a time and handles EOS, stop strings and the token limit as it does for
plain decoding (so a step's extra tokens past the end are simply never pulled; the cache may hold them, which the
next prompt's common-prefix check rolls back like any other difference).

A step with k drafts: ``Llm._verify`` runs ``[history[-1], *drafts]`` in one pass (k + 1 logits rows), the
acceptance rule keeps n drafts and adds the target's token, ``Llm._keep`` rolls the cache back to the
``len(history) + n`` tokens that are now history (the attention caches by position, the recurrent layers from
their block-start checkpoint), and the drafter hears what was kept. While the policy has drafting paused, the steps
are plain decoding's own (``_plain_steps``) until the pause's last few. The trial after a pause may run in the
shadow (``_shadow_trial``): the drafter drafts, plain decoding goes on, and the draft is scored against the tokens
it produces (the output cannot change; the trial costs the drafting only).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from contextlib import nullcontext
from typing import Any

from ...contract.errors import HeteroError
from ...runtime.blas_threads import one_blas_thread
from .. import steplog
from ..families.decoder import VERIFY_ROWS
from ..sampler import Sampler, greedy_hint
from .accept import accept
from .drafter import Draft, Drafter, Hidden, as_draft
from .policy import DraftPolicy
from .target import Target


class Speculation:
    """A drafter and how to use it. ``max_draft``: the longest draft (default: the drafter's ``max_draft``, at
    most 15: one verify step scores at most 16 tokens). ``adaptive``: adapt the draft length to acceptance and
    switch drafting off while it does not pay (``policy.py``); False drafts ``max_draft`` tokens every step
    (tests, measurements). ``shadow``: a trial of a drafter switched off may run in the shadow of plain decoding
    (drafted, then scored against plain decoding's next tokens, never verified: ``DraftPolicy.shadow_trial``);
    False verifies every trial."""

    def __init__(self, drafter: Drafter, *, max_draft: int | None = None, adaptive: bool = True,
                 shadow: bool = True) -> None:
        self.drafter = drafter
        self.shadow = shadow
        limit = VERIFY_ROWS - 1
        if max_draft is not None and not 1 <= max_draft <= limit:  # asked for: refused, not clamped in silence
            raise HeteroError(f"max_draft={max_draft} (--spec-draft); expected 1..{limit}: one verify step scores "
                              f"at most {VERIFY_ROWS} tokens")
        self.max_draft = max(1, min(int(max_draft if max_draft is not None else drafter.max_draft), limit))
        self.adaptive = adaptive
        self.policy = self._policy()

    def warm(self, llm: Target) -> list[int]:
        """Plan and record ``llm``'s verify step of every width this speculation may draft (1 .. ``max_draft``
        tokens) now, off the critical path (after loading, in a bench's warm-up): else each width's first two runs
        in the process are interpreted and cost 1-2 plain steps more each, charged to the first replies' drafts
        (``Llm.warm_verify``). Returns the widths warmed (none for a target without ``warm_verify``)."""
        warm = getattr(llm, "warm_verify", None)
        return list(warm(range(1, self.max_draft + 1))) if warm is not None else []

    def _policy(self, previous: DraftPolicy | None = None) -> DraftPolicy:
        policy = DraftPolicy(self.max_draft, adaptive=self.adaptive, start=self.max_draft if not self.adaptive else 1,
                             graded=bool(getattr(self.drafter, "graded", False)),
                             one_pass=bool(getattr(self.drafter, "one_pass", False)), shadow=self.shadow)
        # what the last generation (same model and drafter) measured: a drafter whose drafts cost time starts with
        # its step costs; graded (free) drafts with plain decoding's cost only: with the measured widths' costs
        # the lookahead drafted shorter (docs/speculative.md)
        if previous is not None and policy.graded:
            policy.carry_plain(previous)
        elif previous is not None:
            policy.carry_costs(previous)
        return policy

    def start(self, llm: Target, record: object, prompt: list[int], sampler: Sampler, stats: Any) -> Iterator[int]:
        """Prefill ``prompt`` now; returns the generation's tokens, computed as they are pulled."""
        drafter = self.drafter
        layers = llm.expose_hidden(drafter.hidden_layers) if drafter.hidden_layers else ()
        logits = llm._advance(record, prompt, stats)
        drafter.reset()
        started = time.perf_counter()
        with one_blas_thread():  # the drafter's numpy matmuls: spinning OpenBLAS workers slowed the next steps
            drafter.begin(prompt, {layer: llm.hidden(layer, 0, len(prompt)) for layer in layers})
        stats.prefill_seconds += time.perf_counter() - started  # the drafter's prompt work (a draft model's)
        self.policy = self._policy(self.policy)
        return self._tokens(llm, record, list(prompt), sampler, stats, logits[-1], layers)

    def _tokens(self, llm: Target, record: object, history: list[int], sampler: Sampler, stats: Any, first: Any,
                layers: tuple[int, ...]) -> Iterator[int]:
        drafter, policy = self.drafter, self.policy
        # a drafter without numpy work (the lookahead: a dictionary lookup) skips the BLAS thread toggle, ~10 us
        # each of two a step, the largest single item of its ~0.15 ms of bookkeeping a step (issue 15, chat34b)
        blas = one_blas_thread if getattr(drafter, "numpy", True) else nullcontext
        hint = greedy_hint(llm, sampler)  # each row's argmax from the LM head's native call (greedy only)
        token = sampler.sample(first, history, hint(first))
        prompt_length = told = len(history)  # history[:told]: the tokens the drafter has heard of
        history.append(token)
        produced = 1
        yield token
        vocab = llm.config.vocab_size
        log = steplog.active()
        while True:
            quiet = policy.quiet_steps(produced)
            if quiet:  # drafting is off for these: plain decoding's steps, their seconds told to the policy at once
                yield from _plain_steps(llm, record, history, sampler, policy, produced, quiet)
                produced += quiet
                continue
            started = time.perf_counter()
            k = min(policy.length(produced), llm.context - len(history))
            shadow = k > 0 and policy.shadow_trial(produced)
            if k > 0:
                with blas():
                    if told < len(history):  # the tokens committed since its last draft, in one call
                        drafter.accept(len(history) - told - 1, history[told:],
                                       _rows(llm, layers, max(told - 1, prompt_length), len(history) - 1))
                        told = len(history)
                    draft = as_draft(drafter.draft(history, k), k, vocab)
            else:
                draft = _NO_DRAFT
            drafted_at = time.perf_counter()
            # scored in the shadow unless empty (a plain step as below) or sampled from a q that is not one-hot:
            # plain sampling's token matches such a draft less often than speculative sampling accepts it
            if shadow and draft.tokens and (draft.probs is None or sampler.params.greedy):
                base = len(history)
                n = yield from _shadow_trial(llm, record, history, sampler, policy, produced, draft.tokens)
                with blas():  # told as a verify step that accepted n would tell it
                    drafter.accept(n, history[base:base + n + 1], _rows(llm, layers, base - 1, base + n))
                told = base + n + 1
                produced = len(history) - prompt_length
                policy.record_shadow(len(draft.tokens), n, produced, drafted_at - started, draft.confidence)
                if log:
                    steplog.write("spec", produced=base - prompt_length, asked=k, offered=len(draft.tokens),
                                  drafted=len(draft.tokens), confidence=draft.confidence, accepted=n, committed=0,
                                  seconds=drafted_at - started, draft_seconds=drafted_at - started, shadow=True,
                                  **policy.state())
                continue
            offered = len(draft.tokens)
            first = draft.tokens[0] if offered and (draft.probs is None or sampler.params.greedy) else None
            if draft.confidence is not None:  # a graded draft: as long as its class pays for
                draft = as_draft(draft, policy.cut(draft.confidence), vocab)
            rows = llm._verify(record, history, draft.tokens)
            # no draft: the sampler's own pick, as plain decoding's step (its logit bias and log-probabilities too)
            n, token = (accept(sampler, rows, draft, history, hint) if draft.tokens
                        else (0, sampler(rows[-1], history, hint(rows[-1]))))
            if first is not None and not draft.tokens and draft.confidence is not None:
                # cut to a plain step: its token says whether the draft's first would have been accepted (greedy,
                # or a one-hot draft, as in a shadow trial), so the class learns that without a verify
                policy.observe_first(draft.confidence, token == first)
            base = len(history)
            llm._keep(record, base + n)
            committed = [*draft.tokens[:n], token]
            if k > 0:  # the drafter was asked this step: it hears what was kept now, as the protocol says
                with blas():
                    drafter.accept(n, committed, _rows(llm, layers, base - 1, base + n))
                told = base + n + 1
            history.extend(committed)
            if draft.tokens:
                stats.verify_steps += 1
                stats.drafted_tokens += len(draft.tokens)
                stats.accepted_tokens += n
            seconds = time.perf_counter() - started
            policy.record(len(draft.tokens), n, len(committed), seconds, produced, draft.confidence,
                          drafted_at - started)
            if log:
                steplog.write("spec", produced=produced, asked=k, offered=offered, drafted=len(draft.tokens),
                              confidence=draft.confidence, accepted=n, committed=len(committed), seconds=seconds,
                              draft_seconds=drafted_at - started,
                              **policy.state())
            produced += len(committed)
            yield from committed


_NO_DRAFT = Draft([])


def _plain_steps(llm: Target, record: object, history: list[int], sampler: Sampler, policy: DraftPolicy,
                 produced: int, steps: int) -> Generator[int, None, None]:
    """``steps`` plain decode steps through plain decoding's own path (``Llm._advance``, then the sampler: the same
    native call and token as ``generate_stream`` without a drafter), one per token pulled, with nothing of the
    policy's or the drafter's between them (a paused Eagle-3 ran 1-token steps 3-5% slower than the plain run
    beside it, 2026-12-06). Their seconds go to the policy in one record, also when the generation stops amid
    them; the drafter hears their tokens at its next draft, as the protocol says."""
    done, seconds = 0, 0.0
    log = steplog.active()
    hint = greedy_hint(llm, sampler)
    try:
        for _ in range(steps):
            started = time.perf_counter()
            row = llm._advance(record, history)[-1]
            token = sampler(row, history, hint(row))
            history.append(token)
            done += 1
            step = time.perf_counter() - started
            seconds += step
            if log:
                steplog.write("spec", produced=produced + done - 1, asked=0, offered=0, drafted=0, confidence=None,
                              accepted=0, committed=1, seconds=step, draft_seconds=0.0, **policy.state())
            yield token
    finally:
        policy.record_quiet(produced, done, seconds)


def _shadow_trial(llm: Target, record: object, history: list[int], sampler: Sampler, policy: DraftPolicy,
                  produced: int, draft: list[int]) -> Generator[int, None, int]:
    """Plain decoding's steps (``_plain_steps``) scoring ``draft`` as they go: until the first token that is not the
    draft's, or the one after a whole draft (the token a verify step would add). Returns the number of draft
    tokens plain decoding produced first: greedy, what verifying the draft accepts; sampled, with the draft's q
    one-hot, a draw of it (plain sampling's token equals a draft token x with probability p(x), speculative
    sampling's chance of accepting it, and the context of the next position is then the same)."""
    steps = _plain_steps(llm, record, history, sampler, policy, produced, len(draft) + 1)
    matched = 0
    try:
        for token in steps:
            yield token
            if matched == len(draft) or token != draft[matched]:
                break
            matched += 1
    finally:
        steps.close()  # records the steps taken (also when the generation stops amid them)
    return matched


def _rows(llm: Target, layers: tuple[int, ...], start: int, end: int) -> Hidden:
    return {layer: llm.hidden(layer, start, end) for layer in layers}
