"""How many tokens to draft next, from what drafting has measurably paid so far.

Each step's cost is timed per committed token. A speculative step (verify of a draft) is compared with plain
steps (no draft): plain decoding's cost is sampled at the start and then every ``PROBE_EVERY`` speculative steps.
When the speculative steps cost more per token than plain ones, drafting is switched off for ``backoff`` tokens
(doubling each time it fails again, reset when it pays): so a drafter that is rarely right costs a few probe steps,
not a slowdown. The draft length follows acceptance: one longer after a fully accepted draft, down to what was
accepted plus one after a rejection.
"""

from __future__ import annotations

PROBE_EVERY = 24  # speculative steps between two plain steps that re-measure plain decoding
MIN_SPEC_STEPS = 4  # speculative steps measured before drafting is judged
BACKOFF_START, BACKOFF_MAX = 16, 512  # tokens decoded plainly after drafting did not pay
SMOOTHING = 0.25  # weight of the newest step in the running costs


class DraftPolicy:
    def __init__(self, max_draft: int, *, adaptive: bool = True, start: int = 4) -> None:
        self.max_draft = max(int(max_draft), 0)
        self.k = min(start, self.max_draft)
        self.adaptive = adaptive
        self.plain_cost: float | None = None  # seconds per committed token
        self.spec_cost: float | None = None
        self.spec_steps = 0  # since the last judgement
        self.since_probe = 0
        self.off_until = 0  # decoded-token count until which drafting is off
        self.backoff = BACKOFF_START
        self.switched_off = 0  # how many times drafting was switched off (reported)

    def length(self, produced: int) -> int:
        """Tokens to draft for the next step (0: a plain step), ``produced`` tokens into the generation."""
        if not self.adaptive:
            return self.k
        if produced < self.off_until or self.plain_cost is None or self.since_probe >= PROBE_EVERY:
            return 0
        return self.k

    def record(self, drafted: int, accepted: int, committed: int, seconds: float, produced: int) -> None:
        """One step: ``drafted`` tokens proposed, ``accepted`` kept, ``committed`` tokens out, in ``seconds``."""
        cost = seconds / max(committed, 1)
        if drafted == 0:
            self.plain_cost = _smooth(self.plain_cost, cost)
            self.since_probe = 0
            return
        self.spec_cost = _smooth(self.spec_cost, cost)
        self.since_probe += 1
        self.spec_steps += 1
        self.k = min(self.k + 1, self.max_draft) if accepted == drafted else max(1, min(self.k, accepted + 1))
        if not self.adaptive or self.spec_steps < MIN_SPEC_STEPS or self.plain_cost is None:
            return
        if self.spec_cost > self.plain_cost:
            self.off_until = produced + self.backoff
            self.backoff = min(2 * self.backoff, BACKOFF_MAX)
            self.switched_off += 1
            self.spec_steps = 0
            self.spec_cost = None
        elif self.spec_steps >= 4 * MIN_SPEC_STEPS:
            self.backoff = BACKOFF_START  # it pays: a later bad stretch starts with a short pause again


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
