"""When drafting pays: with the drafter "auto", a round drafts only while drafted rounds give more tokens a second.

A drafted round costs more than a one-row round (more rows, the drafter's proposal, the walk and the keep) and
yields, for each stream, the tokens it accepted plus the model's own. Whether that pays depends on the backend, the
model, the drafter and the text, so the engine measures it as it runs. `DraftGate` keeps, for each number of streams
in a round, the mean seconds of its drafted rounds and of its undrafted ones, and for each stream the mean tokens a
drafted round gave it. Before a round it drafts when the drafted round's expected tokens a second beat the undrafted
round's:

    sum over the streams of tokens_s / seconds_drafted  >  streams / seconds_undrafted

with tokens_s = 1 for a stream that does not draft (its request turned drafting off). A round that let its streams
draft counts as drafted even where the drafter found nothing to propose (the n-gram drafter on text that does not
repeat): it gave one token, at the cost of asking and of not going ahead, and the gate learns so. Only decode rounds
are timed (a round with a prompt chunk costs what its chunk costs), and neither a round that made a recording nor the
first round of a kind (compiles, first uploads) is, since no later round costs what they did; and an undrafted round
counts at most OUTLIER times its kind's mean, since a pause of the process (a garbage collection) is not what the
round costs, and a paused undrafted round would otherwise make drafting look as if it paid for as long as it drafts
(no undrafted round then runs to correct the mean). Drafted rounds are not capped: their costs differ by more than
that (a round whose drafter found nothing costs an undrafted one), and one that ran long only brings the next probe.
What the gate has not measured yet it tries: a kind of round not yet timed runs next, and a new stream's tokens a
draft start at the mean of the streams it last saw that had drafted (`prior`: a request after another on the same
engine does not explore again), or before any at the most a drafted round can give. While drafting does not pay, a
round drafts anyway (a probe) once the undrafted rounds since the last drafted one have taken `wait` times what a
probe costs, so that a stretch of text that repeats, or an emptier round, is seen at a bounded cost: probes take at
most 1 / (1 + wait) of the time. A probe that finds drafting still does not pay doubles the wait, up to
LONGEST_WAIT, and drafting that pays sets it back to FIRST_WAIT.

Behind a gate the drafter is shown the rows a stream keeps (`Drafter.observe`: the block drafter extends its
context with them) in every round that drafts, and in the undrafted rounds that come while drafting is still
untried or in the WATCH rounds before a probe is due (`watching`). The block drafter guesses from the target's
features at its context's last rows: a context that lacked the rows just before a drafted round would guess poorly
there, and the gate would measure that, not what drafting gives, and stop drafting where drafting pays. Between
probes, while drafting does not pay, its upkeep costs nothing; the rows it missed then leave a gap further back.
A probe's cost is therefore its drafted round and the upkeep of the WATCH rounds before it: the gate keeps `upkeep`,
the mean seconds a watched undrafted round takes beyond the undrafted mean (on a GPU the drafter's update can cost
almost what the round does), and counts a watched round there, not in the undrafted mean.

Drafting never changes what is generated (the engine accepts only the model's own tokens), so the gate changes the
speed alone.
"""
import time

WATCH = 8  # undrafted rounds before a probe whose kept rows the drafter is shown: the last rows it guesses from
FIRST_WAIT = 8  # the time between probes, in drafted rounds' time, at first: probes take at most a ninth of it
LONGEST_WAIT = 256  # and at most
WEIGHT = 0.25  # a new measurement's share of a running mean (older rounds fade: context and text change)
OUTLIER = 2  # an undrafted round counts at most this many times its kind's mean (a pause is not its cost)


class DraftGate:
    """Measures drafted and undrafted decode rounds and says whether the next one drafts (`drafts`, then `start`
    and `finish` around the round)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.seconds = {}  # (streams, drafted) -> mean seconds of such a round
        self.seen = set()  # kinds of round run at least once (the first is not timed)
        self.wait, self.since_draft = FIRST_WAIT, 0
        self.probed = False  # the last drafted round was a probe
        self.upkeep = {}  # streams -> mean seconds a watched undrafted round takes beyond the undrafted mean
        self.watched = False  # the round being timed showed its kept rows to the drafter
        self.started = None
        self.prior = float("inf")  # a new stream's tokens a drafted round: the mean of the last known ones

    def drafts(self, streams: int, tokens: list) -> bool:
        """Whether a decode round of `streams` streams drafts, given each drafting stream's mean tokens a drafted
        round (None: not measured yet, `prior` taken)."""
        known = [t for t in tokens if t is not None]
        if known:
            self.prior = sum(known) / len(known)
        drafted, plain = self.seconds.get((streams, True)), self.seconds.get((streams, False))
        if plain is None or drafted is None:  # try what is not measured yet, undrafted first
            return plain is not None
        expected = sum(self.prior if t is None else t for t in tokens) + streams - len(tokens)
        probed, self.probed = self.probed, False
        if expected / drafted > streams / plain:
            self.wait = FIRST_WAIT
            return True
        if probed:  # the probe found that drafting still does not pay
            self.wait = min(2 * self.wait, LONGEST_WAIT)
        if self.since_draft * plain >= self.wait * self.probe(streams, drafted):
            self.probed = True
            return True
        return False

    def watching(self, streams: int) -> bool:
        """Whether an undrafted round of `streams` streams shows its kept rows to the drafter: while drafted or
        undrafted rounds are unmeasured (the first drafted round follows), or when a probe is due within WATCH
        rounds."""
        drafted, plain = self.seconds.get((streams, True)), self.seconds.get((streams, False))
        shown = plain is None or drafted is None or (
            (self.since_draft + WATCH) * plain >= self.wait * self.probe(streams, drafted))
        self.watched |= shown
        return shown

    def probe(self, streams: int, drafted: float) -> float:
        """Seconds a probe costs: its drafted round, and the upkeep of the WATCH rounds before it."""
        return drafted + WATCH * self.upkeep.get(streams, 0.0)

    def tokens_after(self, mean: float | None, tokens: int, measured: int) -> tuple:
        """A stream's (mean tokens a drafted round, rounds that mean is over) after a drafted round that gave it
        `tokens`. Before its own first round, its mean is the streams' before it (`prior`), counted as one round: a
        request's first drafted round guesses from the prompt's end alone, and where it gives little, the streams
        before it keep it drafting until its own rounds say otherwise."""
        if mean is None and self.prior != float("inf"):
            mean, measured = self.prior, 1
        return tokens_mean(mean, tokens, measured), measured + 1

    def start(self) -> None:
        """A decode round begins (after `drafts`)."""
        self.started, self.watched = self.clock(), False

    def finish(self, streams: int, drafted: bool, recorded: bool) -> None:
        """The round `start` began is done; `recorded`: it made a recording, so its time is not its kind's."""
        seconds = self.clock() - self.started
        kind = (streams, drafted)
        if kind in self.seen and not recorded:
            mean = self.seconds.get(kind)
            if mean is not None and not drafted:  # while drafting pays no undrafted round runs to correct a pause
                seconds = min(seconds, OUTLIER * mean)
            if mean is not None and not drafted and self.watched:  # beyond the undrafted mean: the probe's cost
                upkeep, extra = self.upkeep.get(streams), max(0.0, seconds - mean)
                self.upkeep[streams] = extra if upkeep is None else upkeep + WEIGHT * (extra - upkeep)
            else:
                self.seconds[kind] = seconds if mean is None else mean + WEIGHT * (seconds - mean)
        self.seen.add(kind)
        self.since_draft = 0 if drafted else self.since_draft + 1


def tokens_mean(mean: float | None, tokens: int, measured: int) -> float:
    """A stream's running mean of tokens a drafted round, after a drafted round that gave it `tokens`, `measured`
    rounds measured before it. Until 1 / WEIGHT rounds are measured it is their plain mean: a request's first
    drafted rounds guess from a short context and vary the most, so the first of them must not decide alone
    (docs/drafting.rst, "Using it")."""
    return tokens if mean is None else mean + max(WEIGHT, 1 / (measured + 1)) * (tokens - mean)
