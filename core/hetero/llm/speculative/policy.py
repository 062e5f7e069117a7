"""How many tokens to draft next, from what drafting has measurably paid so far.

Two things are measured as the generation runs: the cost of a step by the number of tokens it scores (a plain
decode step is 1; a verify step of k drafts is k + 1; on this CPU, where a step of a 0.6B model is partly
compute-bound, 4 tokens cost ~1.8x one and 8 ~2-3x: benchmarks/speculative.py), and the drafter's acceptance
α (accepted drafts / (accepted drafts + rejections): each draft token is a trial until the first rejection). A step
of k drafts commits (1 - α^(k+1)) / (1 - α) tokens on average, so the next k is the one with the most tokens per
second by that estimate (unmeasured step sizes are interpolated, optimistically at first so they get tried), or 0
when no k beats a plain step.

The first ``COLD_RUNS`` steps of each size are not steady-state (the executor plans that shape, then records its
replay: ``runtime/executor.py``): they stand in for the size's cost only until a warm step replaces them, and do not
count towards judging drafting.

What is really measured also decides: plain decoding's cost is re-sampled at the start and every ``PROBE_EVERY``
speculative steps, and when the speculative steps' seconds per committed token exceed plain decoding's, drafting is
switched off for ``backoff`` tokens (doubling each time it fails again, reset when it pays). So a drafter that is
rarely right costs a few probe steps, not a slowdown.

Graded drafters (``Drafter.graded``: free drafts with a ``confidence`` class, the lookahead's match length) get
one acceptance α per class: the loop asks for ``max_draft`` tokens and ``cut(confidence)`` keeps the k that pays
for that class — none for a class rarely right (the step is then a plain step), long drafts for a class that is
nearly always right. A class not seen yet starts at α = 1/2.
"""

from __future__ import annotations

PROBE_EVERY = 24  # speculative steps between two plain steps that re-measure plain decoding
MIN_SPEC_STEPS = 4  # speculative steps measured before drafting is judged
BACKOFF_START, BACKOFF_MAX = 16, 512  # tokens decoded plainly after drafting did not pay
SMOOTHING = 0.25  # weight of the newest step in the running costs
COLD_RUNS = 2  # steps of a new size that plan and record it (slower than its steady state)
DECAY = 0.9  # weight of the past in the acceptance counts
PRIOR_SLOPE = 0.15  # assumed extra cost per extra token in a step, until steps of that size are measured


PRIOR_CLASS = (1.0, 1.0)  # (accepted, rejected) counts a confidence class starts with


class DraftPolicy:
    def __init__(self, max_draft: int, *, adaptive: bool = True, start: int = 4, graded: bool = False) -> None:
        self.max_draft = max(int(max_draft), 0)
        self.k = min(start, self.max_draft)
        self.adaptive = adaptive
        self.graded = graded and adaptive
        self.classes: dict[int, tuple[float, float]] = {}  # confidence class -> decayed (accepted, rejected)
        self.cost: dict[int, float] = {}  # tokens scored in a step -> seconds (running)
        self.runs: dict[int, int] = {}  # tokens scored in a step -> steps of that size so far
        self.spec_cost: float | None = None  # seconds per committed token of speculative steps (running)
        self.accepted = 0.0  # decayed counts of accepted drafts and of rejections
        self.rejected = 0.0
        self.spec_steps = 0  # since the last judgement
        self.since_probe = 0
        self.off_until = 0  # decoded-token count until which drafting is off
        self.backoff = BACKOFF_START
        self.switched_off = 0  # how many times drafting was switched off (reported)

    @property
    def plain_cost(self) -> float | None:
        return self.cost.get(1)

    def length(self, produced: int) -> int:
        """Tokens to draft for the next step (0: a plain step), ``produced`` tokens into the generation."""
        if not self.adaptive:
            return self.k
        if produced < self.off_until or self.runs.get(1, 0) <= COLD_RUNS or self.since_probe >= PROBE_EVERY:
            return 0  # (plain steps first until one is warm: its cost is what drafting must beat)
        return self.max_draft if self.graded else self.k

    def cut(self, confidence: int | None) -> int:
        """The longest draft worth scoring for a graded draft of class ``confidence`` (0: a plain step)."""
        if not self.graded or confidence is None:
            return self.max_draft
        accepted, rejected = self.classes.get(confidence, PRIOR_CLASS)
        return self._best_length(accepted / (accepted + rejected), plain_wins=True)

    def record(self, drafted: int, accepted: int, committed: int, seconds: float, produced: int,
               confidence: int | None = None) -> None:
        """One step: ``drafted`` tokens proposed, ``accepted`` kept, ``committed`` tokens out, in ``seconds``
        (``confidence``: the draft's class, for graded drafters)."""
        size = drafted + 1
        runs = self.runs[size] = self.runs.get(size, 0) + 1
        warm = runs > COLD_RUNS
        # a cold step's time stands for the size until its first warm step replaces it
        self.cost[size] = _smooth(self.cost.get(size), seconds) if runs > COLD_RUNS + 1 else seconds
        if drafted == 0:
            self.since_probe = 0
            return
        self.since_probe += 1
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (accepted < drafted)
        if confidence is not None:
            a, r = self.classes.get(confidence, PRIOR_CLASS)
            self.classes[confidence] = (DECAY * a + accepted, DECAY * r + (accepted < drafted))
        if warm:
            self.spec_cost = _smooth(self.spec_cost, seconds / max(committed, 1))
            self.spec_steps += 1
        if not self.adaptive:
            return
        self.k = self._best_length(self.accepted / max(self.accepted + self.rejected, 1e-9))
        plain = self.plain_cost
        if self.spec_steps < MIN_SPEC_STEPS or plain is None or self.spec_cost is None:
            return
        if self.spec_cost > plain:
            self.off_until = produced + self.backoff
            self.backoff = min(2 * self.backoff, BACKOFF_MAX)
            self.switched_off += 1
            self.spec_steps = 0
            self.spec_cost = None
        elif self.spec_steps >= 4 * MIN_SPEC_STEPS:
            self.backoff = BACKOFF_START  # it pays: a later bad stretch starts with a short pause again

    def _best_length(self, alpha: float, plain_wins: bool = False) -> int:
        """The k with the most tokens per second at acceptance ``alpha``; at least 1 unless ``plain_wins`` (then
        0 when no k beats a plain step)."""
        plain = self.plain_cost
        if plain is None:
            return self.k
        best, best_rate = (0, 1.0 / plain) if plain_wins else (1, 0.0)
        for k in range(1, self.max_draft + 1):
            rate = expected_tokens(alpha, k) / self._estimated_cost(k + 1, plain)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def _estimated_cost(self, size: int, plain: float) -> float:
        if size in self.cost:
            return self.cost[size]
        below = max((s for s in self.cost if s < size), default=1)
        above = min((s for s in self.cost if s > size), default=None)
        low = self.cost.get(below, plain)
        if above is not None:  # between two measured sizes: linear
            return low + (self.cost[above] - low) * (size - below) / (above - below)
        return low + plain * PRIOR_SLOPE * (size - below)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step of k drafts commits when each draft is accepted with probability alpha until one is not."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
