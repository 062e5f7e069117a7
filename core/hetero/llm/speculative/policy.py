"""How many tokens to draft next, from what drafting has measurably paid so far.

Two things are measured as the generation runs: the cost of a step by the number of tokens it scores (a plain
decode step is 1; a verify step of k drafts is k + 1; on this CPU, where a step of a 0.6B model is partly
compute-bound, 4 tokens cost ~1.8x one and 8 ~2-3x: benchmarks/speculative.py), and the drafter's acceptance
α (accepted drafts / (accepted drafts + rejections): each draft token is a trial until the first rejection). A step
of k drafts commits (1 - α^(k+1)) / (1 - α) tokens on average, so the next k is the one with the most tokens per
second by that estimate (unmeasured step sizes are interpolated, optimistically at first so they get tried), or 0
when no k beats a plain step.

The first ``COLD_RUNS`` steps of each size are not steady-state (the executor plans that shape, then records its
replay: ``runtime/executor.py``): they do not price their size (it counts as unmeasured until a warm step:
interpolated, or the prior) and do not count towards judging drafting. Priced at a cold step's time (~2x a plain
step at 2 threads), a graded draft was cut to nothing, its size never timed warm, and the generation stayed in
plain steps.

What is really measured also decides: plain decoding's cost is re-sampled at the start and every ``PROBE_EVERY``
speculative steps, and when the recent speculative steps' seconds per committed token (their summed seconds over
their summed tokens, decayed) exceed plain decoding's, drafting is switched off for ``backoff`` tokens (doubling
each time it fails again, reset when it pays). So a drafter that is rarely right costs a few probe steps, not a
slowdown. Both sides of that comparison are taken in the same stretch of time: plain steps are summed with the
same decay, step by step, as the speculative ones; when the recent stretch has fewer than ``PROBE_STEPS`` (2)
plain steps the policy takes them (probes) before it judges, and every periodic probe is such a judgement. A
shared machine's speed moves 2x within a second (a neighbour taking the second core doubles a 2-thread step); a
plain cost measured before such a change made drafting look like a loss after it (or a win where it lost), and so
did a single probe that met a fast moment.

The step costs of the sizes are kept relative to plain decoding's cost when they were measured (a verify width
timed while the machine was slow is not dear once it is fast again), and scaled by the current plain cost when
drafts are cut: a width measured in a noisy moment does not keep drafts short (or long) for the rest of the
generation.

Graded drafters (``Drafter.graded``: free drafts with a ``confidence`` class, the lookahead's match length): the
loop asks for ``max_draft`` tokens and ``cut(confidence)`` keeps the k with the largest expected gain. Each class
keeps the acceptance of each draft position apart (p_i: the chance that draft token i is right once tokens 0 .. i-1
were; decayed counts; a position not seen yet starts at the one before it, the first at the nearest lower class's,
at least 1/2): a draft that has run on for a few tokens usually runs on further, which one α per class cannot say.
The first position is also scored when the class is cut to a plain step (its token is what verifying the draft's
first would have accepted: ``observe_first``), and cut by its lower bound (``_first_bound``). A
step of k drafts commits E(k) = 1 + p_0 + p_0 p_1 + ... + p_0 .. p_(k-1) tokens and costs C(k + 1) seconds (the
measured step costs, never below a smaller step's); its gain is E(k) - λ C(k + 1), where λ is the tokens per second
the generation reaches (decayed over its recent steps, never below plain decoding's 1 / C(1)). Maximizing that gain
step by step maximizes the tokens per second of the whole generation (the renewal-reward / Dinkelbach argument),
where maximizing each step's own E(k) / C(k + 1) would cut strong drafts too short: the k-th draft token is worth
scoring while p_0 .. p_(k-1) > λ (C(k + 1) - C(k)), i.e. while the chance it is committed pays for its row of the
verify step at the rate the generation already reaches. k = 0 (a plain step) wins when no draft has a positive gain
over it.

Shadow trials: the trial after a pause may draft without being verified (``shadow_trial``; the loop runs plain
decoding's steps and scores the draft against the tokens they produce: greedy, exactly what verifying it accepts;
sampled with a one-hot draft, a draw of speculative sampling's acceptance, since plain sampling's token equals a
draft token x with probability p(x), the chance of accepting it). It costs the drafting only, never a verify, and
cannot change the output. It is taken where the 2-token verify's extra seconds exceed the plain seconds a verified
trial's expected accepted token would save (a weak drafter; a good one paused on a bad stretch is verified), and
its evidence is judged as a verified trial's (``record_shadow``).
"""

from __future__ import annotations

import math
from typing import Any

PROBE_EVERY = 24  # speculative steps between two plain steps that re-measure plain decoding
PROBE_STEPS = 2  # plain steps of the recent stretch (decayed count, at least this - 1/2) drafting is judged against
MIN_SPEC_STEPS = 4  # speculative steps measured before drafting is judged
BACKOFF_START, BACKOFF_MAX = 16, 512  # tokens decoded plainly after drafting did not pay
SMOOTHING = 0.25  # weight of the newest step in the running costs
COLD_RUNS = 2  # steps of a new size that plan and record it (slower than its steady state)
DECAY = 0.9  # weight of the past in the acceptance counts
FIRST_DECAY = 0.97  # the same for a graded class's first draft position (also scored when cut: ``observe_first``)
PRIOR_SLOPE = 0.15  # assumed extra cost per extra token in a step, until steps of that size are measured
MAX_SLOPE = 0.6  # the carried slope's ceiling (the 1.5B's verify tokens cost 0.24-0.47 plain steps; more is a
# neighbour's burst: carried at 1.0, every class was cut and no width timed again, docs/speculative.md)
PRIOR_ACCEPT, PRIOR_WEIGHT = 0.5, 2.0  # a class's first draft position starts at 1/2 with the weight of 2 drafts
RATE_DECAY = 0.95  # weight of the past in the generation's tokens per second (λ)
SPEC_DECAY = 0.8  # weight of the past in the speculative steps' seconds per token (judging drafting)
COST_MEMORY = 0.98  # per step: how a step size's cost above the prior fades back towards the prior
DRAFT_WINDOW = 9  # warm drafting steps whose seconds per draft token price drafting (their median)
CARRIED_ACCEPTANCE = 2.0  # the last generation's acceptance counts start the next one with the weight of 2 drafts
MIN_EVIDENCE = 2.0  # decayed accepted drafts + rejections before an acceptance may switch drafting off (estimate)
LASTING_DECAY = 0.9  # per drafting step: the drafter's lasting first-token acceptance (carried whole)
TRIAL_WINDOW = 3  # warm one-draft-token steps whose seconds (their median) price a trial
TRIAL_SHARE = 0.005  # a drafter the estimate switched off is tried again after plain decoding spent 1/this times
# the seconds a trial costs beyond a plain step (trials then cost at most ~0.5% of the time)
PAUSE_MAX = 2 * BACKOFF_MAX  # tokens: the longest pause in drafting (a trial priced in a slow moment, or cold)
QUIET_CHUNK = 16  # plain steps of a pause recorded at once (their mean seconds): the plain cost keeps up with them
QUIET_TAIL = 4  # the last plain steps of a pause, recorded one by one: the trial is judged against steps of now


class DraftPolicy:
    def __init__(self, max_draft: int, *, adaptive: bool = True, start: int = 4, graded: bool = False,
                 one_pass: bool = False, shadow: bool = True) -> None:
        """``one_pass``: a draft of any length costs one pass of the drafter (DFlash's block), so a draft is priced
        by the measured seconds of a drafting step, not per draft token (``Drafter.one_pass``). ``shadow``: trials
        may run in the shadow of plain decoding (``shadow_trial``); False verifies every trial."""
        self.max_draft = max(int(max_draft), 0)
        self.k = min(start, self.max_draft)
        self.adaptive = adaptive
        self.graded = graded and adaptive
        self.one_pass = one_pass
        # confidence class -> per draft position, decayed [right, tried] (tried: every earlier position was right)
        self.classes: dict[int, list[list[float]]] = {}
        self.tokens_done = self.seconds_done = 0.0  # decayed, warm steps: the generation's rate λ
        self.cost: dict[int, float] = {}  # tokens scored in a step -> seconds (running)
        self.cost_at: dict[int, float] = {}  # tokens scored in a step -> the plain cost its seconds were taken at
        self.measured_at: dict[int, int] = {}  # tokens scored in a step -> ``steps`` when last timed
        self.steps = 0
        self.runs: dict[int, int] = {}  # tokens scored in a step -> steps of that size so far
        self.spec_tokens = self.spec_seconds = 0.0  # decayed, warm speculative steps since the last judgement
        self.plain_steps = self.plain_seconds = 0.0  # decayed alike: the warm plain steps of the same stretch
        self.probe_now = False  # judging drafting waits for a plain step in the recent stretch
        self.accepted = 0.0  # decayed counts of accepted drafts and of rejections
        self.rejected = 0.0
        # decayed [drafting steps whose first draft token was right, drafting steps], carried whole across
        # generations: the drafter's acceptance, not the text's (counted per step, so a good drafter's many
        # accepted tokens do not outweigh its misses for dozens of steps once it turns bad)
        self.lasting = [0.0, 0.0]
        self.spec_steps = 0  # since the last judgement
        self.since_probe = 0
        self.off_until = 0  # decoded-token count until which drafting is off
        self.produced = 0  # tokens of the generation so far (after the last recorded step)
        self.backoff = BACKOFF_START
        self.switched_off = 0  # how many times drafting was switched off (reported)
        self.draft_times: list[float] = []  # seconds per draft token of the last DRAFT_WINDOW warm drafting steps
        self.draft_steps = 0
        self.trial_times: list[float] = []  # seconds beyond a plain step of the last warm steps of one draft token
        self.draft_step_times: list[float] = []  # drafting seconds of the last DRAFT_WINDOW warm drafting steps
        self.cold_drafting: float | None = None  # the cheapest drafting step's seconds before one was warm
        self.shadow = shadow
        self.trial_due = False  # drafting was switched off: its next draft is a trial
        # extra cost per extra token of a verify step (in plain steps) for sizes not measured yet: the prior, or
        # what the last generation measured (``carried_slope``)
        self.prior_slope = PRIOR_SLOPE

    def carry_costs(self, previous: DraftPolicy) -> None:
        """Start with the step costs ``previous`` measured (the last generation's policy: the same model, drafter
        and threads): the seconds of each step size, of a draft token, and how often each was timed (so sizes
        already warm need no cold steps and no plain steps first), and the draft length it settled at (its first
        step drafts that). The rate reached and the judging of drafting start afresh: they belong to the text. A
        new generation of a served conversation (``hetero chat``, ``hetero bench``'s repetitions) then drafts from
        its first step instead of paying ~3 plain steps and a short draft to measure what it already knows (~5-10%
        of a 64-token reply at 100% acceptance).

        Acceptance belongs to the text too, but the drafter's last acceptance is a better first guess than none:
        its counts start the generation scaled to the weight of ``CARRIED_ACCEPTANCE`` drafts, so the text's own
        drafts outweigh it within a few steps. (Started empty, a good drafter's first fully accepted draft read as
        100% and the next drafts ran long into the tile-dear verify widths: the draft model on chat replayed at
        1.43-1.48x against 1.57x with the guess, at the same 3.87 tokens per verify; docs/speculative.md.) The
        drafter's lasting acceptance (``lasting``: decayed slowly, carried whole) is what it is known for: a
        drafter that accepts too little to pay (a DFlash drafter trained for minutes: 6-20%, on a 0.5B target
        whose drafting step costs 1.7 plain steps) is switched off after its first drafting step of a generation
        (``_estimate_loses``) instead of after the ~12 steps of measured judging a generation used to pay again
        and again (0.84-0.89x of plain decoding, 2026-12-04). A drafter switched off stays off for the rest of its
        pause across generations (the next starts with the tokens left of it, and the backoff reached), so a run
        of short replies tries it once in a while rather than ~3 times in each.

        The length too: each generation used to start at ``start`` (4), so 5-token steps were timed at generation
        starts only, warm from the third generation on; from then on lengths were priced by interpolating between
        5 and 11 tokens, and whether that said 4 or 10 hung on a few per cent of cost: later generations of the
        same text could flip to drafts of 4 (replayed with step costs like the quiet machine's: 7.7-8.8 tokens per
        verify instead of 10.14, as the 2-thread draft-model run at 1.95x against 2.22x; docs/speculative.md,
        2026-12-04)."""
        self.cost, self.cost_at, self.runs = dict(previous.cost), dict(previous.cost_at), dict(previous.runs)
        self.prior_slope = previous.carried_slope()
        self.measured_at = dict.fromkeys(self.cost, 0)
        self.draft_times, self.draft_steps = list(previous.draft_times), previous.draft_steps
        self.trial_times, self.draft_step_times = list(previous.trial_times), list(previous.draft_step_times)
        self.trial_due = previous.trial_due
        self.cold_drafting = previous.cold_drafting
        self.k = previous.k
        self.off_until = max(previous.off_until - previous.produced, 0)
        self.backoff = previous.backoff
        self.lasting = list(previous.lasting)
        seen = previous.accepted + previous.rejected
        if seen > 0:
            scale = min(1.0, CARRIED_ACCEPTANCE / seen)
            self.accepted, self.rejected = previous.accepted * scale, previous.rejected * scale

    def carry_plain(self, previous: DraftPolicy) -> None:
        """Start with plain decoding's cost as ``previous`` measured it, and its warm count (graded drafts: their
        step sizes start afresh, ``carry_costs`` drafted them shorter). The generation then drafts from its first
        step instead of taking ~3 plain steps to time what the last one knew: 3 of a 64-token reply's ~25 steps,
        ~4% of its time on code, where the first tokens after the prompt already repeat it. A plain step of the
        generation (a draft cut to nothing, a probe) times it again.

        The acceptance of each confidence class too, its decayed counts whole (at most ~10 drafts' weight, ~33 at
        the first position: a class's own drafts outweigh them within ~7, as fast as they leave the prior of 1/2
        behind; its first position is scored at most steps, ``observe_first``): started at the
        prior in each generation, the lookahead on the chat prompt re-learnt in every reply that its 1-token matches
        are right ~15% of the time (9-15 verify steps of them a 64-token reply) and drafted 4 tokens after its first
        5-7-token match, none right, every time (2026-12-06, branch spec24)."""
        if 1 in previous.cost:
            self.cost[1], self.runs[1], self.measured_at[1] = previous.cost[1], previous.runs[1], 0
        self.prior_slope = previous.carried_slope()
        self.classes = {c: [list(position) for position in counts] for c, counts in previous.classes.items()}

    def carried_slope(self) -> float:
        """The extra cost per extra token of a verify step, in plain steps, that the next generation prices its
        unmeasured sizes by: the median over the sizes this one timed warm (each its running cost against plain
        decoding's: (C(T) / C(1) - 1) / (T - 1)), never below the prior, or this generation's own prior when it
        timed none. The widths' own costs start afresh for graded drafts (``carry_plain``), but their slope is the
        model's and the machine's, not the text's: priced at the prior's 0.15 while the 1.5B's verify tokens cost
        0.25-0.45 plain steps each at 1 and 2 threads (2026-12-07, chat30), every chat reply's first drafts of the
        lookahead were drafted too long and lost, ~8-10 verify steps a 64-token reply (0.88-0.92x of plain)."""
        plain = self.plain_cost
        if plain is None or plain <= 0:
            return self.prior_slope
        slopes = [(self._scaled(size, fade=False) / plain - 1) / (size - 1) for size in self.cost
                  if size > 1 and self.runs.get(size, 0) > COLD_RUNS]
        if not slopes:  # none timed: what it started with, half-way back to the prior (a slope carried from a
            # burst cut every draft, so no later reply timed a width to correct it: plain steps for good)
            return PRIOR_SLOPE + (self.prior_slope - PRIOR_SLOPE) / 2
        return min(max(_median(slopes), PRIOR_SLOPE), MAX_SLOPE)

    @property
    def draft_cost(self) -> float | None:
        """Seconds per draft token: the (lower) median of the last ``DRAFT_WINDOW`` warm drafting steps (None
        before one). A median, not a running mean: a drafting step that runs a shape of the draft model's own for
        the first times (planned, recorded: 2-3x a warm step) or meets a neighbour's burst prices itself only,
        where a running mean (carried to the next generation) priced the next drafts by it."""
        return _median(self.draft_times) if self.draft_times else None

    @property
    def pass_cost(self) -> float | None:
        """Seconds of a drafting step: the (lower) median of the last ``DRAFT_WINDOW`` warm ones (None before one).
        What a draft of any length costs a ``one_pass`` drafter."""
        return _median(self.draft_step_times) if self.draft_step_times else None

    def drafting_cost(self, k: int) -> float | None:
        """Seconds to draft ``k`` tokens by the warm drafting steps measured (None before one): a drafting step's
        seconds for a ``one_pass`` drafter (DFlash's block pass: priced per draft token, a draft of 4 looked 4x
        cheaper than a draft of 1, and long drafts dearer than they are), ``k`` draft tokens' otherwise."""
        if self.one_pass:
            return self.pass_cost if k > 0 else 0.0
        cost = self.draft_cost
        return None if cost is None else k * cost

    @property
    def plain_cost(self) -> float | None:
        return self.cost.get(1)

    @property
    def never_right(self) -> bool:
        """Whether the drafter has drafted and never had a first draft token right (its lasting count of right
        ones is exactly 0: counts only decay by a factor, so one right token ever makes it positive)."""
        right, steps = self.lasting
        return steps > 0 and right == 0

    def state(self) -> dict[str, Any]:
        """What the policy decides by, for the step log (``hetero.llm.steplog``)."""
        return {"plain_cost": self.plain_cost, "spec_cost": self.spec_cost, "recent_plain": self.recent_plain,
                "rate": self.rate, "draft_cost": self.draft_cost, "pass_cost": self.pass_cost,
                "off_until": self.off_until, "switched_off": self.switched_off, "trial_due": self.trial_due,
                "lasting": self.lasting[0] / self.lasting[1] if self.lasting[1] else None,
                "costs": {str(size): round(c, 6) for size, c in sorted(self.cost.items())}}

    def length(self, produced: int) -> int:
        """Tokens to draft for the next step (0: a plain step), ``produced`` tokens into the generation."""
        if not self.adaptive:
            return self.k
        if (produced < self.off_until or self.runs.get(1, 0) <= COLD_RUNS or self.since_probe >= PROBE_EVERY
                or self.probe_now):
            return 0  # (plain steps first until one is warm: its cost is what drafting must beat)
        return self.max_draft if self.graded else self.k

    def quiet_steps(self, produced: int) -> int:
        """Plain steps from ``produced`` on that need no bookkeeping step by step (0: none): drafting is off for
        them, plain decoding is warm and nothing is being judged, so ``length`` would say 0 at each and ``record``
        only fold their seconds into the running costs. The loop runs them as plain decoding does and hands their
        seconds over at once (``record_quiet``): at most ``QUIET_CHUNK`` of them, and not the pause's last
        ``QUIET_TAIL`` (those are recorded one by one, as every step was)."""
        if not self.adaptive or self.spec_steps or self.probe_now or self.runs.get(1, 0) <= COLD_RUNS + 1:
            return 0
        return min(max(self.off_until - produced - QUIET_TAIL, 0), QUIET_CHUNK)

    def record_quiet(self, produced: int, steps: int, seconds: float) -> None:
        """``steps`` warm plain steps (``quiet_steps``) from ``produced`` on, ``seconds`` in all: what ``record``
        makes of them one by one when each takes their mean time (the decayed sums in closed form)."""
        if steps < 1:
            return
        mean = seconds / steps
        self.produced = produced + steps
        self.runs[1] = self.runs.get(1, 0) + steps
        self.steps += steps
        self.measured_at[1] = self.steps
        old = self.cost.get(1, mean)
        self.cost[1] = mean + (old - mean) * (1 - SMOOTHING) ** steps
        self.tokens_done, self.seconds_done = _decayed(self.tokens_done, 1.0, RATE_DECAY, steps), \
            _decayed(self.seconds_done, mean, RATE_DECAY, steps)
        fade = SPEC_DECAY ** steps
        self.spec_tokens *= fade
        self.spec_seconds *= fade
        self.plain_steps = _decayed(self.plain_steps, 1.0, SPEC_DECAY, steps)
        self.plain_seconds = _decayed(self.plain_seconds, mean, SPEC_DECAY, steps)
        self.since_probe = 0

    def cut(self, confidence: int | None) -> int:
        """The draft length with the largest expected gain for a graded draft of class ``confidence`` (0: a plain
        step)."""
        if not self.graded or confidence is None:
            return self.max_draft
        plain = self.plain_cost
        if plain is None:
            return self.max_draft
        rate = max(self.rate, 1.0 / plain)
        best, best_gain = 0, 1.0 - rate * plain
        kept, expected = 1.0, 1.0  # P(draft tokens 0 .. k-1 all right), E(k)
        ps = self.acceptance(confidence)
        ps[0] = self._first_bound(confidence, ps[0])
        measured = self._measured_costs()  # once, not per length: cut runs every graded step (issue 15, chat34b)
        for k, p in enumerate(ps, 1):
            kept *= p
            expected += kept
            gain = expected - rate * self._step_cost(k, plain, measured)
            if gain > best_gain:
                best, best_gain = k, gain
        return best

    def _first_bound(self, confidence: int, p: float) -> float:
        """``p`` (class ``confidence``'s first-position acceptance) less one standard error of its decayed counts:
        what a class is drafted by. Its counts are scored at every step it is offered (``observe_first``), so a
        class near the price of the 2-token verify (24% at 1 thread on the 1.5B) would otherwise be drafted after
        each lucky streak of its counts and lose on the next drafts, which are right as rarely as before (replayed:
        a class right 15-20% of the time, 8-13 verify steps a reply at ~0.99x of plain decoding); with the bound
        it is drafted where its acceptance is known to pay (40%: 1.07x), and a class not seen yet at its prior."""
        counts = self.classes.get(confidence)
        if not counts:
            return p  # a class not seen yet: tried at its prior (the nearest lower class's, or 1/2)
        return max(p - math.sqrt(p * (1 - p) / (counts[0][1] + PRIOR_WEIGHT)), 0.0)

    def acceptance(self, confidence: int) -> list[float]:
        """p_i for draft positions 0 .. max_draft - 1 of class ``confidence``: the chance that draft token i is
        right when tokens 0 .. i-1 were. Classes are ordered (a longer match is a higher class), so a class's first
        position starts at the estimate of the nearest lower class seen (at least ``PRIOR_ACCEPT``): a strong class
        seen for the first time is not taken for a coin toss."""
        first = PRIOR_ACCEPT
        for c in (*sorted(c for c in self.classes if c < confidence), confidence):
            out, prior = [], first
            counts = self.classes.get(c, [])
            for i in range(self.max_draft):
                right, tried = counts[i] if i < len(counts) else (0.0, 0.0)
                prior = (right + PRIOR_WEIGHT * prior) / (tried + PRIOR_WEIGHT)
                out.append(prior)
            first = max(PRIOR_ACCEPT, out[0])
        return out

    @property
    def spec_cost(self) -> float | None:
        """Seconds per committed token of the recent warm speculative steps (a ratio of decayed sums: one long
        draft rejected at once weighs by its seconds, not as one of a few equal votes), None before one."""
        return self.spec_seconds / self.spec_tokens if self.spec_tokens > 0 else None

    @property
    def recent_plain(self) -> float | None:
        """Seconds of the warm plain steps taken in the stretch the speculative steps are judged over (decayed
        alike), None when it has none recent enough: their decayed count under that of one plain step
        ``MIN_SPEC_STEPS`` steps ago (a ratio of decayed sums keeps an old step's time however old it is)."""
        if self.plain_steps < SPEC_DECAY ** MIN_SPEC_STEPS:
            return None
        return self.plain_seconds / self.plain_steps

    @property
    def rate(self) -> float:
        """The generation's recent committed tokens per second (0 before a warm step)."""
        return self.tokens_done / self.seconds_done if self.seconds_done > 0 else 0.0

    def record(self, drafted: int, accepted: int, committed: int, seconds: float, produced: int,
               confidence: int | None = None, draft_seconds: float = 0.0) -> None:
        """One step: ``drafted`` tokens proposed, ``accepted`` kept, ``committed`` tokens out, in ``seconds``
        (``confidence``: the draft's class, for graded drafters; ``draft_seconds``: the part of ``seconds`` spent
        drafting: a step size is priced by its verify pass, the drafting by its seconds per draft token)."""
        size = drafted + 1
        self.produced = produced + committed
        self._time_drafting(drafted, draft_seconds)
        total, seconds = seconds, seconds - min(draft_seconds, seconds)
        runs = self.runs[size] = self.runs.get(size, 0) + 1
        self.steps += 1
        self.measured_at[size] = self.steps
        warm = runs > COLD_RUNS
        if drafted == 1 and warm and self.draft_steps > COLD_RUNS and self.plain_cost is not None:
            self.trial_times = [*self.trial_times[1 - TRIAL_WINDOW:], total - self.plain_cost]
        # a cold step's time is kept (the first warm one replaces it) but prices nothing (``_estimated_cost``);
        # sizes other than 1 are kept at the plain cost of their time (``_scaled``)
        plain = self.plain_cost
        previous = self._scaled(size, fade=False) if size in self.cost else None
        self.cost[size] = _smooth(previous, seconds) if runs > COLD_RUNS + 1 else seconds
        if size > 1 and plain is not None:
            self.cost_at[size] = plain
        if warm:
            self.tokens_done = RATE_DECAY * self.tokens_done + committed
            self.seconds_done = RATE_DECAY * self.seconds_done + total
            self._decay_stretch()
        if drafted == 0:
            if warm:
                self.plain_steps += 1
                self.plain_seconds += seconds
                # a probe (asked for, or the periodic one): drafting is judged against it, once the stretch holds
                # PROBE_STEPS plain steps (one step of a machine whose speed moves 2x within a second switched
                # drafting off on code: a single fast probe)
                judging = (self.probe_now or self.since_probe >= PROBE_EVERY) and self.spec_steps >= MIN_SPEC_STEPS
                enough = self.plain_steps >= PROBE_STEPS - 0.5
                if judging and enough:
                    self._judge(produced)
                self.probe_now = judging and not enough
            self.since_probe = 0
            return
        self.since_probe += 1
        self.trial_due = False
        self._count_acceptance(drafted, accepted, confidence)
        if warm:
            self.spec_tokens += committed
            self.spec_seconds += total
            self.spec_steps += 1
        if not self.adaptive:
            return
        alpha = self.accepted / max(self.accepted + self.rejected, 1e-9)
        self.k, best_rate = self._best_length(alpha)
        if not self.graded and self._estimate_loses(best_rate):
            # after the drafter's very first drafting step, the backoff's short pause: one miss is little
            # evidence (a draft model right 80% of the time misses its first token one time in five; a priced pause
            # of ~110 tokens cost it 1.5% of later generations, replayed), and the next trial runs the 2-token
            # verify for its second (recording) time, which falls in this generation then instead of a later one
            self._switch_off(produced, self._trial_pause() if self.lasting[1] > 1 else 0)
            return
        if not self.graded and self.lasting[1] < MIN_EVIDENCE:
            # a drafter seen for fewer drafting steps drafts one token: one right draft read as 100% acceptance,
            # and the next drafts of 4, 2, 3 tokens each ran a verify width for its first (planned, recorded)
            # times, ~3 plain steps apiece, before the evidence said the drafter does not pay (a DFlash drafter
            # at ~20%: 4 drafting steps, 15-18% of a 64-token generation, 2026-12-05)
            self.k = 1
        spec = self.spec_cost
        if self.spec_steps < MIN_SPEC_STEPS or plain is None or spec is None:
            return
        if spec > (self.recent_plain or plain) or self._plain_is_stale(seconds, warm):
            if self.plain_steps < PROBE_STEPS - 0.5:
                self.probe_now = True  # judged against plain steps of this stretch, not of another moment
            else:
                self._judge(produced)
        elif self.spec_steps >= 4 * MIN_SPEC_STEPS:
            self.backoff = BACKOFF_START  # it pays: a later bad stretch starts with a short pause again

    def _time_drafting(self, drafted: int, draft_seconds: float) -> None:
        """A drafting step's ``draft_seconds`` for ``drafted`` tokens: the drafter's first ``COLD_RUNS`` calls plan
        and record its shapes (the cheapest of them kept apart), the warm ones price drafting."""
        if not drafted or draft_seconds <= 0:
            return
        self.draft_steps += 1
        if self.draft_steps > COLD_RUNS:
            self.draft_times = [*self.draft_times[1 - DRAFT_WINDOW:], draft_seconds / drafted]
            self.draft_step_times = [*self.draft_step_times[1 - DRAFT_WINDOW:], draft_seconds]
        else:
            self.cold_drafting = min(self.cold_drafting or draft_seconds, draft_seconds)

    def observe_first(self, confidence: int, right: bool) -> None:
        """A graded draft of class ``confidence`` cut to a plain step (``cut`` said 0): whether its first token was
        the one the plain step produced (the loop tells only when that is what verifying it would have accepted:
        greedy, or a one-hot draft). Counted as a verified draft's position 0 (the class's later positions and
        the drafter's acceptance are not seen): a class cut to plain steps still learns its first-token
        acceptance, at no verify's cost. Without it a class's counts changed only when it was drafted, so once cut
        it was never drafted again, whatever it was worth: a class right 40% of the time (a 1-token draft pays above
        24% at 1 thread on the 1.5B) stayed cut after its first drafts missed (replayed: 1.04x where it is worth
        1.07x; the lookahead's 2-token matches on chat are right 32-38%). The first position decays slower
        (``FIRST_DECAY``: ~33 steps' memory, it is scored at most steps) and is drafted by its lower bound
        (``_first_bound``)."""
        if not self.graded:
            return
        counts = self.classes.setdefault(confidence, [])
        if not counts:
            counts.append([0.0, 0.0])
        counts[0][0] = FIRST_DECAY * counts[0][0] + right
        counts[0][1] = FIRST_DECAY * counts[0][1] + 1

    def _count_acceptance(self, drafted: int, accepted: int, confidence: int | None) -> None:
        """A draft of ``drafted`` tokens whose first ``accepted`` were right, into the decayed counts the length
        and the switching off are decided by."""
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (accepted < drafted)
        self.lasting = [LASTING_DECAY * self.lasting[0] + (accepted > 0), LASTING_DECAY * self.lasting[1] + 1]
        if confidence is not None:
            counts = self.classes.setdefault(confidence, [])
            for i in range(min(accepted + 1, drafted)):  # positions tried: up to the first wrong one
                if i == len(counts):
                    counts.append([0.0, 0.0])
                decay = FIRST_DECAY if i == 0 else DECAY
                counts[i][0] = decay * counts[i][0] + (i < accepted)
                counts[i][1] = decay * counts[i][1] + 1

    def shadow_trial(self, produced: int) -> bool:
        """Whether the step at ``produced`` is a trial to run in the shadow (the loop's ``_shadow_trial``): drafting
        was switched off, its pause is over, and the drafter is better judged by scoring its draft against the
        tokens plain decoding then produces than by verifying it (``_shadow_pays``)."""
        return self.trial_due and produced >= self.off_until and self._trial_in_shadow()

    def _trial_in_shadow(self) -> bool:
        """Whether the next trial would run in the shadow (shadow trials allowed, and they pay)."""
        return self.shadow and self.adaptive and not self.graded and self._shadow_pays()

    def _shadow_pays(self) -> bool:
        """Whether a trial costs less in the shadow than verified: both pay the drafting; a verified trial (one
        draft token) also runs the 2-token verify instead of a plain step, and commits the draft token when it is
        right. So the shadow pays while that verify's extra seconds exceed the plain seconds its expected
        accepted token saves, at the drafter's lasting first-token acceptance: a weak drafter's trials always
        (Eagle-3 at 3%: a 17-20 ms trial against a 13 ms plain step), a draft model paused on a bad stretch
        (right ~70% before) not. Not after a single drafting step: a drafter whose very first draft was wrong is
        verified at its first trial (a draft model right 80% of the time lost that trial's token in the
        shadow: 1.427x -> 1.418x of plain decoding on later replayed generations, 200 seeds)."""
        plain = self.plain_cost
        right, steps = self.lasting
        if plain is None or steps <= 1:
            return False
        # the verify's extra at least the prior's: on a busy machine the 2-token verify was often timed below a
        # plain cost measured in a slower moment (0.03 s against 0.05: the extra read as 0, no trial shadowed)
        extra = max(self._estimated_cost(2, plain) - plain, PRIOR_SLOPE * plain)
        return extra > right / steps * plain

    def record_shadow(self, drafted: int, accepted: int, produced: int, draft_seconds: float,
                      confidence: int | None = None) -> None:
        """A shadow trial that ended at ``produced``: ``drafted`` tokens drafted in ``draft_seconds``, of which the
        first ``accepted`` were what plain decoding produced next (its steps are recorded as plain ones). Its
        acceptance counts as a verified trial's would; drafting resumes when by that evidence a draft length beats
        plain decoding (``_estimate_loses``, the rule after a verified trial), else it is off again for a pause
        priced as a verified trial (``_trial_pause``): shadow trials come no more often than verified ones did,
        so the resumptions a lucky trial causes (several losing drafting steps each, the verify widths cold) do
        not either. Pauses priced by the shadow's drafting alone (~3x shorter) cost a weak block drafter's worst
        replayed generations 0.890x -> 0.824x of plain decoding, and a 30% draft model's 0.981x -> 0.931x
        (benchmarks/spec_policy_replay.py, 100 seeds)."""
        self.trial_due = False
        self._time_drafting(drafted, draft_seconds)
        self._count_acceptance(drafted, accepted, confidence)
        self._fresh_stretch()
        alpha = self.accepted / max(self.accepted + self.rejected, 1e-9)
        self.k, best_rate = self._best_length(alpha)
        loses = self._estimate_loses(best_rate)
        if loses and not accepted:
            self._switch_off(produced, self._trial_pause())
        elif loses or self.lasting[1] < MIN_EVIDENCE:
            # right, but not enough to pay by the estimate: a verified one-token step next, as after a verified
            # trial that was right; its verify times the width the estimate priced by the prior (no verify ran in
            # the shadow), and the estimate judges again. Switched off here, a draft model right 80% of the time
            # whose first drafts missed stayed off (its replayed later generations 1.31x -> 1.15x in those seeds)
            self.k = 1

    def _plain_is_stale(self, verify_seconds: float, warm: bool) -> bool:
        """Whether a warm verify pass of several tokens (``verify_seconds``) just took less than the plain cost
        drafting would be judged against, with no plain step in the recent stretch: a step of more tokens is not
        cheaper than one token at the same moment, so the plain cost was timed in a slower moment (carried from the
        bench's warm-up in a neighbour's burst: 0.38 s against 0.2 s plain steps after it) and drafting is judged
        against plain steps of now instead (probes). Judged against the stale cost, an Eagle-3 head right on 2 of 15
        first tokens drafted on for 17 steps, +16% of its generation at 1 thread (2026-12-06)."""
        plain = self.plain_cost
        return warm and self.recent_plain is None and plain is not None and verify_seconds < plain

    def _decay_stretch(self) -> None:
        """One warm step later: the speculative and the plain steps of the judged stretch fade alike."""
        self.spec_tokens *= SPEC_DECAY
        self.spec_seconds *= SPEC_DECAY
        self.plain_steps *= SPEC_DECAY
        self.plain_seconds *= SPEC_DECAY

    def _judge(self, produced: int) -> None:
        """Drafting against plain decoding over the same recent stretch: off for ``backoff`` tokens when it loses,
        and a fresh stretch either way."""
        spec, plain = self.spec_cost, self.recent_plain
        if spec is not None and plain is not None and spec > plain:
            self._switch_off(produced)
        else:
            self._fresh_stretch()

    def _switch_off(self, produced: int, pause: int = 0) -> None:
        """Drafting off for the backoff, or ``pause`` tokens when longer (a trial's price: ``_trial_pause``),
        and the next pause twice that; never more than ``PAUSE_MAX`` tokens (a trial timed in a neighbour's
        burst, or priced by a cold drafting step, would otherwise keep a drafter off for thousands of tokens,
        and a drafter that pays on another text is found by its trials only). Except for a drafter never right
        (``never_right``): its pauses double on without a cap, so in n tokens it is tried O(log n) times and its
        trials' share of the time falls towards 0 (capped, one trial every 512-1024 tokens for good: ~0.2-0.5%
        of the time for a DFlash drafter that accepts nothing); a single right draft token ends that."""
        if self.never_right:
            pause = max(self.backoff, min(pause, PAUSE_MAX))
            self.backoff = 2 * pause
        else:
            pause = min(max(self.backoff, pause), PAUSE_MAX)
            self.backoff = max(min(2 * pause, BACKOFF_MAX), self.backoff)
        self.k = 1  # the next draft (a trial) at the cheapest length, whatever switched drafting off
        self.trial_due = True
        self.off_until = produced + pause
        self.switched_off += 1
        self._fresh_stretch()

    def _fresh_stretch(self) -> None:
        self.spec_steps = 0
        self.spec_tokens = self.spec_seconds = 0.0
        self.plain_steps = self.plain_seconds = 0.0

    def _estimate_loses(self, best_rate: float) -> bool:
        """Whether, by the acceptance seen (at least ``MIN_EVIDENCE``) and the measured costs of drafting and of
        the step sizes, no draft length commits tokens faster than plain decoding: drafting is switched off then
        without waiting for the measured judging (4 warm drafting steps and 2 plain ones, each drafting step a
        loss). ``best_rate``: ``_best_length``'s tokens per second at the recent acceptance. Not before a drafting
        step was timed warm: an unmeasured draft cost would price drafting at 0.

        Each acceptance with at least ``MIN_EVIDENCE`` behind it must say so: the recent one (the text's, decaying
        0.9 a step; the carried guess weighs 2 drafts) and the drafter's lasting one (``lasting``: the share of its
        drafting steps whose first token was right, carried whole across generations). So a drafter known not to
        pay stops after one drafting step of a new generation, and a good drafter (the draft model, ~70% on chat)
        missing a stretch of text is left to the measured judging, as before the estimate: on the recent counts
        alone three misses at a reply's start switched it off. A good drafter that turns useless (another kind of
        text) loses its lasting acceptance in ~10 drafting steps.

        Until a drafter has been right once (its lasting count of right first tokens is 0), it is taken to accept
        nothing, and at acceptance 0 no draft length beats plain decoding whatever drafting costs (a step of k
        drafts commits one token and costs a verify pass of k + 1 tokens plus the drafting): so it loses after its
        first drafting step, cold costs or none. Waiting for a warm drafting time and 2 drafts' evidence, a
        useless drafter paid 3 drafting steps in the first generation of a process, the first two cold (~4 plain
        steps beyond plain decoding on the 0.5B target: 7% of a 64-token reply, 2026-12-05); now it pays 2 (both
        cold: the 2-token verify is planned, then recorded, whatever drafter runs it), the second after the
        backoff's short pause (``record``), and a good drafter whose very first draft token is wrong loses that
        pause."""
        if self.never_right:
            return True
        right, steps = self.lasting
        plain = self.plain_cost
        if plain is None or self.drafting_cost(1) is None:
            return False
        if len(self.draft_times) < 2 and right >= steps / 2:
            # one drafting time (a neighbour's burst: a draft model at 100% switched off for 577 tokens, 2026-12-06)
            # does not switch off a drafter right half the time; the measured judging still may
            return False
        recent = self.accepted + self.rejected >= MIN_EVIDENCE
        lasting = steps >= MIN_EVIDENCE
        if not (recent or lasting) or (recent and best_rate >= 1 / plain):
            return False
        return not lasting or self._best_length(right / steps)[1] < 1 / plain

    def _trial_pause(self) -> int:
        """Tokens to decode plainly before a drafter the estimate switched off is tried again: enough that its
        trials (a step of one draft token: drafting it and verifying 2 tokens) cost at most ``TRIAL_SHARE`` of
        plain decoding's time. A trial is what finds a drafter paying again on another text; on the 0.5B target a
        DFlash trial costs ~0.5-1 plain step more than a plain step, so the backoff's 16, 32, 64 ... tokens spent
        3-6%, 1.5-3%, ... on trials; its pauses are 100-200 tokens from the first now. A trial's seconds are
        measured (the median of the last ``TRIAL_WINDOW`` warm ones; before those, the cheapest drafting step
        seen), not priced per draft token: a DFlash draft is one pass over its block whatever its length, so one
        token costs what four do (priced per token, a trial came out at half its seconds). Each switch-off doubles
        the pause from there (``_switch_off``), up to ``PAUSE_MAX`` tokens (a drafter never right: on without a cap).

        Before a warm drafting step (a drafter switched off after its first drafting step: ``_estimate_loses``)
        the cheapest cold one prices it, with the 2-token verify at its warm estimate: cold drafting (the
        drafter's shapes planned, ~1.8x a warm DFlash pass) makes the pause longer, not shorter."""
        plain = self.plain_cost
        if plain is None or plain <= 0:
            return 0
        if self.trial_times:
            extra = _median(self.trial_times)
        else:  # none timed warm yet: the cheapest drafting step seen (a block drafter's any, a draft model's shortest)
            drafting = min(self.draft_step_times, default=self.cold_drafting or 0.0)
            extra = drafting + self._estimated_cost(2, plain) - plain
        return max(math.ceil(extra / (TRIAL_SHARE * plain)), 0)

    def _best_length(self, alpha: float) -> tuple[int, float]:
        """The k (at least 1) with the most tokens per second at acceptance ``alpha``, and that rate (the current
        k and infinity before plain decoding is timed)."""
        plain = self.plain_cost
        if plain is None:
            return self.k, float("inf")
        best, best_rate = 1, 0.0
        measured = self._measured_costs()
        for k in range(1, self.max_draft + 1):
            rate = expected_tokens(alpha, k) / self._step_cost(k, plain, measured)
            if rate > best_rate:
                best, best_rate = k, rate
        return best, best_rate

    def _step_cost(self, drafted: int, plain: float, measured: dict[int, float] | None = None) -> float:
        """The seconds of a step of ``drafted`` drafts: drafting them and verifying ``drafted + 1`` tokens
        (``measured``: ``_measured_costs()``, when the caller prices several lengths at once)."""
        return (self.drafting_cost(drafted) or 0.0) + self._estimated_cost(drafted + 1, plain, measured)

    def _measured_costs(self) -> dict[int, float]:
        """The current seconds of each step size timed warm."""
        # sizes timed only cold (planned, recorded) count as unmeasured: priced at those times, a graded draft was
        # cut to nothing from then on and the size never timed warm (the generation locked into plain steps)
        return {s: self._scaled(s) for s in self.cost if s == 1 or self.runs.get(s, COLD_RUNS + 1) > COLD_RUNS}

    def _estimated_cost(self, size: int, plain: float, measured: dict[int, float] | None = None) -> float:
        """The seconds of a step of ``size`` tokens: measured, interpolated or extrapolated, and never below a
        smaller step's (a size whose few timings came out low on a noisy machine would otherwise be drafted for
        exactly that noise). ``measured``: ``_measured_costs()`` if the caller has it."""
        cost = self._measured_costs() if measured is None else measured
        floor = max((c for s, c in cost.items() if s < size), default=0.0)
        if size in cost:
            return max(cost[size], floor)
        below = max((s for s in cost if s < size), default=1)
        above = min((s for s in cost if s > size), default=None)
        low = cost.get(below, plain)
        if above is not None:  # between two measured sizes: linear
            return max(low + (cost[above] - low) * (size - below) / (above - below), floor)
        # past the largest measured size: at the prior's slope, or the measured one's when steeper (a step of T
        # tokens costs at least as much more per token as a smaller one: on the 1.5B at 1 thread ~0.35 plain steps
        # a token at 3-4 tokens, ~0.45 at 9; priced at 0.15, a width of 9 looked half its cost)
        slope = self.prior_slope * plain
        if below > 1 and 1 in cost:
            slope = max(slope, (low - cost[1]) / (below - 1))
        return max(low + slope * (size - below), floor)

    def _scaled(self, size: int, fade: bool = True) -> float:
        """The running seconds of a step of ``size`` tokens at the current plain cost: measured at another plain
        cost (the machine slower or faster then), they are scaled by the ratio. ``fade``: as an estimate to draft
        by (below); not when a new timing is averaged in."""
        at, plain = self.cost_at.get(size), self.plain_cost
        if at is None or plain is None or at <= 0:
            return self.cost[size]
        cost = self.cost[size] * plain / at
        # dearer than the prior: the estimate fades back towards the prior as it ages, so a size timed in a bad
        # moment (a neighbour's burst on one step) is tried again rather than never drafted again
        prior = plain * (1 + self.prior_slope * (size - 1))
        if fade and cost > prior:
            warm = max(self.runs.get(size, 0) - COLD_RUNS, 1)  # timed often: trusted longer
            memory = COST_MEMORY ** ((self.steps - self.measured_at.get(size, self.steps)) / warm)
            cost = memory * cost + (1 - memory) * prior
        return cost


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step of k drafts commits when each draft is accepted with probability alpha until one is not."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def _decayed(total: float, added: float, decay: float, steps: int) -> float:
    """``total`` after ``steps`` times ``total = decay * total + added``."""
    return decay ** steps * total + added * (1 - decay ** steps) / (1 - decay)


def _median(values: list[float]) -> float:
    """The lower median (a measured time, not between two)."""
    return sorted(values)[(len(values) - 1) // 2]


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
