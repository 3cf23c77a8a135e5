"""The "auto" drafter's gate (drafters/gate.py): a round drafts while drafted rounds have given more tokens a second
than undrafted ones, measured as the engine runs, and the output is the undrafted output whatever it decides."""
import os

import pytest

import tensorfold
from tensorfold.models import DEFAULT_MODEL
from tensorfold.drafters import DraftGate, NgramDrafter, make_drafter
from tensorfold.drafters.gate import FIRST_WAIT, LONGEST_WAIT, WATCH, tokens_mean
from tensorfold.engine import Engine, SamplingParams


class RoundClock:
    """A clock for the gate, read at a round's start and finish: a round takes `default` seconds unless `takes`
    says otherwise while it runs."""

    def __init__(self, default=1.0):
        self.now, self.end, self.default = 0.0, None, default

    def __call__(self):
        if self.end is None:  # a round starts
            self.end = self.now + self.default
            return self.now
        self.now, self.end = self.end, None  # it finishes
        return self.now

    def takes(self, seconds):
        self.end = self.now + seconds


def decisions(undrafted, drafted, tokens, rounds=600, recorded=(), paused=()):
    """What a gate decides over `rounds` rounds of one stream, drafted rounds giving `tokens` each; the rounds in
    `paused` take 400 times as long (the process paused in them)."""
    clock = RoundClock()
    gate, mean, made = DraftGate(clock), None, []
    for n in range(rounds):
        drafts = gate.drafts(1, [mean])
        gate.start()
        clock.takes((drafted if drafts else undrafted) * (400 if n in paused else 1))
        gate.finish(1, drafts, recorded=n in recorded)
        if drafts:
            mean = tokens_mean(mean, tokens, sum(made))
        made.append(drafts)
    return made


def test_drafting_that_pays_runs_every_round():
    made = decisions(undrafted=1.0, drafted=2.0, tokens=4)
    assert made[:4] == [False, False, True, True]  # undrafted timed (its first round is not), then drafted
    assert all(made[4:])


def test_drafting_that_does_not_pay_is_only_probed_ever_more_rarely():
    """Control of the test above: the same costs, a drafted round giving 1.5 tokens (less than the 2 it costs). A
    probe comes once the undrafted rounds since the last drafted one took `wait` drafted rounds' time (2 seconds
    each), the wait doubling from FIRST_WAIT after each probe up to LONGEST_WAIT."""
    made = decisions(undrafted=1.0, drafted=2.0, tokens=1.5, rounds=2000)
    probes = [n for n in range(4, len(made)) if made[n]]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    waits = [min(FIRST_WAIT * 2 ** n, LONGEST_WAIT) for n in range(1, 7)]
    assert gaps[:6] == [2 * wait + 1 for wait in waits]
    assert probes[0] == 4 + 2 * FIRST_WAIT  # the first after the first wait, counted from the last drafted round
    assert sum(made) < len(made) / 50


@pytest.mark.parametrize("control", [False, True])
def test_a_probe_and_the_watched_rounds_before_it_take_at_most_their_share(monkeypatch, control):
    """Drafting does not pay (1.5 tokens for 4 undrafted rounds' time), and an undrafted round whose kept rows the
    drafter is shown before a probe takes twice an undrafted one (its upkeep costs what the round does, as on a
    GPU). From one probe to the next, the probe and the watched rounds' upkeep take at most 1 / (1 + FIRST_WAIT) of
    the time. Control: a probe's cost counted without the upkeep of the WATCH rounds before it (the rule before),
    and they take more."""
    if control:
        monkeypatch.setattr(DraftGate, "probe", lambda self, streams, drafted: drafted)
    clock = RoundClock()
    gate, mean, measured, rounds = DraftGate(clock), None, 0, []
    for _ in range(3000):
        drafts = gate.drafts(1, [mean])
        gate.start()
        watched = not drafts and gate.watching(1)  # (the engine asks after the forward)
        clock.takes(4.0 if drafts else 2.0 if watched else 1.0)
        gate.finish(1, drafts, recorded=False)
        if drafts:
            mean, measured = tokens_mean(mean, 1.5, measured), measured + 1
        rounds.append((drafts, 4.0 if drafts else 2.0 if watched else 1.0))
    probes = [n for n, (drafts, _) in enumerate(rounds) if drafts and n > 20]
    shares = [sum(s if drafts else s - 1.0 for drafts, s in rounds[a + 1:b + 1]) /
              sum(s for _, s in rounds[a + 1:b + 1]) for a, b in zip(probes, probes[1:])]
    assert len(shares) >= 3
    assert (max(shares) > 1 / (1 + FIRST_WAIT)) if control else (max(shares) <= 1 / (1 + FIRST_WAIT)), shares


@pytest.mark.parametrize("control", [False, True])
def test_a_paused_undrafted_round_does_not_make_drafting_look_as_if_it_paid(monkeypatch, control):
    """Drafting does not pay (1.5 tokens for twice an undrafted round's time); one undrafted round is paused 400
    times its time (a garbage collection). It counts as at most OUTLIER times the mean, so the gate goes on probing
    only. Control: counted whole, it makes drafting look as if it paid, and since no undrafted round then runs to
    correct the mean, every round after it drafts."""
    if control:
        monkeypatch.setattr("tensorfold.drafters.gate.OUTLIER", float("inf"))
    made = decisions(undrafted=1.0, drafted=2.0, tokens=1.5, rounds=400, paused={100})
    assert not made[100]
    assert (sum(made[101:]) == 299) if control else (sum(made[101:]) < 20), sum(made[101:])


def test_a_round_that_recorded_is_not_timed():
    """A drafted round that made a recording (1000 s) would make drafting look ruinous; it is not timed. Control:
    the same round counted stops the drafting."""
    clock = RoundClock()
    for counted, expect in ((False, True), (True, False)):
        gate = DraftGate(clock)
        for drafts, seconds, recorded in ((False, 1, False), (False, 1, False), (True, 2, False),
                                          (True, 1000, not counted), (True, 2, False)):
            gate.start()
            clock.takes(seconds)
            gate.finish(1, drafts, recorded)
        assert gate.drafts(1, [4.0]) is expect


@pytest.fixture(scope="module")
def shakespeare():
    return tensorfold.load(DEFAULT_MODEL, backend="numpy")


def test_the_engine_drafts_when_it_pays_and_the_output_never_changes(shakespeare):
    """On repeating text the n-gram drafter's rounds give several tokens each: with drafted rounds costing 1.5
    undrafted ones the gate drafts most rounds (not all: a round in which the drafter found no match gave one token,
    and counts), at 5 it drafts only to probe; both outputs are the undrafted output bit for bit."""
    prompt = shakespeare.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\n" * 3)
    params = SamplingParams(max_tokens=96)
    undrafted = Engine(shakespeare).generate(prompt, SamplingParams(max_tokens=96, draft=False))
    asked = {}
    for cost in (1.5, 5.0):
        clock = RoundClock()
        engine = Engine(shakespeare, drafter=NgramDrafter(), gate=DraftGate(clock))
        proposed, asked[cost] = engine.drafter.propose_tree, 0

        def timed_proposal(*args, proposed=proposed, clock=clock, cost=cost):
            asked[cost] += 1
            drafts = proposed(*args)
            if drafts[0]:  # (the n-gram drafter finds no match in some rounds: those cost an undrafted round)
                clock.takes(cost)
            return drafts

        engine.drafter.propose_tree = timed_proposal
        request = engine.submit(prompt, params)
        while engine.run_round():
            pass
        assert request.output == undrafted, cost
        asked[cost] /= request.stats.rounds
    assert asked[1.5] > 0.7 and asked[5.0] < 0.2, asked


class ProposesNothing(NgramDrafter):
    """The n-gram drafter on text that never repeats: asked every drafted round, it finds nothing."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def propose_tree(self, *args):
        self.asked += 1
        return [], []


@pytest.mark.parametrize("control", [False, True])
def test_a_drafter_that_finds_nothing_is_asked_ever_more_rarely(shakespeare, monkeypatch, control):
    """A round that let its stream draft gave one token when the drafter found nothing, and the gate counts it so:
    asking costs what an undrafted round costs and gives what it gives, so it does not pay and the drafter is only
    probed. Control: a stream whose tokens a draft are never counted (the gate never learns what asking gives) is
    asked every round."""
    if control:
        monkeypatch.setattr("tensorfold.drafters.gate.tokens_mean", lambda mean, tokens, measured: None)
    engine = Engine(shakespeare, drafter=ProposesNothing(), gate=DraftGate(RoundClock()))
    request = engine.submit(shakespeare.tokenizer.encode("ROMEO:\n"), SamplingParams(max_tokens=96))
    while engine.run_round():
        pass
    asked = engine.drafter.asked / request.stats.rounds
    assert (asked > 0.9) if control else (asked < 0.1), asked


class Watched(NgramDrafter):
    """The n-gram drafter with a tap: it records the positions of the rows the engine shows it."""

    taps = (0,)

    def new_stream(self):
        return []

    def observe(self, state, features, position, kept=None):
        state.extend(range(position, position + (features[0].shape[0] if kept is None else len(kept))))


def shown_only_drafted_rounds(monkeypatch):
    """Plant the rule the engine had before `DraftGate.watching`: behind a gate, only windows of more than one row (a
    prompt chunk, a drafted round) are shown to the drafter, so its context has a gap wherever a round did not draft,
    just before every probe among them."""
    observe = Engine._observe
    monkeypatch.setattr(Engine, "_observe", lambda self, stream, window, rows: observe(self, stream, window, rows)
                        if len(window.ids) > 1 else None)


@pytest.mark.parametrize("control", [False, True])
def test_behind_a_gate_the_drafter_sees_the_rows_before_each_drafted_round(shakespeare, monkeypatch, control):
    """With drafted rounds costing 5 undrafted ones the gate only probes. The drafter is shown the rows of the
    undrafted rounds before the first drafted one and of the WATCH rounds before each probe, so every drafted round
    guesses from a context that holds the WATCH rows before its root; the rounds between probes are not shown, so
    its upkeep is paid in under half the rounds. Control: `shown_only_drafted_rounds`."""
    if control:
        shown_only_drafted_rounds(monkeypatch)
    prompt = shakespeare.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\n" * 3)
    clock = RoundClock()
    engine = Engine(shakespeare, drafter=Watched(), gate=DraftGate(clock), chunk=256)
    proposed, missing = engine.drafter.propose_tree, []

    def proposal(tokens, max_rows, state):
        clock.takes(5.0)
        root = len(tokens) - 1  # the root's position: the rows before it are the ones a drafter guesses from
        missing.append(sorted(set(range(root - WATCH, root)) - set(state)))
        return proposed(tokens, max_rows, state)
    engine.drafter.propose_tree = proposal
    request = engine.submit(prompt, SamplingParams(max_tokens=96))
    engine.run_round()  # the prompt, in one chunk
    stream = engine.active[0]
    while engine.run_round():
        pass
    shown, decode_rounds = len(stream.draft_state) - len(prompt), request.stats.rounds - 1
    assert 3 <= len(missing) < decode_rounds / 4, len(missing)  # the gate only probed
    assert shown < decode_rounds / 2, (shown, decode_rounds)
    assert any(missing) if control else not any(missing), missing


@pytest.mark.parametrize("control", [False, True])
def test_the_gate_drafts_with_a_block_drafter_whose_drafting_pays(shakespeare, monkeypatch, control):
    """The block drafter guesses from the target's features at its context's last rows. With drafted rounds costing
    4 undrafted ones, its greedy chains pay on this prompt, and the gate finds so and drafts most of the request's
    rounds. Control: `shown_only_drafted_rounds`. Each drafted round then follows a gap, its guesses are poor, and the
    gate measures those: it finds that drafting does not pay and stays with one-row rounds."""
    if control:
        shown_only_drafted_rounds(monkeypatch)
    clock = RoundClock()
    engine = Engine(shakespeare, drafter=make_drafter(os.path.join(shakespeare.path, "drafter"), shakespeare),
                    gate=DraftGate(clock))
    proposed = engine.drafter.propose_tree
    engine.drafter.propose_tree = lambda *args: clock.takes(4.0) or proposed(*args)
    request = engine.submit(shakespeare.tokenizer.encode("KING HENRY:\n"), SamplingParams(max_tokens=96))
    while engine.run_round():
        pass
    tokens_a_second = len(request.output) / clock.now
    assert (tokens_a_second < 1.1) if control else (tokens_a_second > 2.0), (tokens_a_second, request.stats.rounds)


@pytest.mark.parametrize("prior", [True, False])
def test_a_new_stream_starts_from_the_streams_before_it(prior):
    """A stream whose drafted rounds gave 1.5 tokens (drafting does not pay) ends; the next stream, not measured
    yet, is expected to give what the last did, so its first round does not draft. Control: a gate that forgets
    what the streams before gave drafts the new stream's first round, to try it."""
    clock = RoundClock()
    gate, mean, measured = DraftGate(clock), None, 0
    for _ in range(40):  # the first stream: the gate learns the round costs and its 1.5 tokens
        drafts = gate.drafts(1, [mean])
        gate.start()
        clock.takes(2.0 if drafts else 1.0)
        gate.finish(1, drafts, recorded=False)
        if drafts:
            mean, measured = tokens_mean(mean, 1.5, measured), measured + 1
    gate.since_draft = 0  # (not a probe's turn)
    if not prior:  # planted: the gate forgets
        gate.prior = float("inf")
    assert gate.drafts(1, [None]) is not prior


@pytest.mark.parametrize("control", [False, True])
def test_a_new_streams_first_poor_round_is_weighed_against_the_streams_before_it(control):
    """The streams before gave 8 tokens a drafted round (drafting pays); a new stream's first drafted round gives 1
    (a request's first guess comes from the prompt's end alone). Its mean starts from theirs, counted as one round,
    so its next round drafts again. Control: a mean that starts from its own first round alone stops drafting."""
    clock = RoundClock()
    gate, mean, measured = DraftGate(clock), None, 0
    for _ in range(40):  # the first stream: drafted rounds cost 2, undrafted 1, and give 8 tokens
        drafts = gate.drafts(1, [mean])
        gate.start()
        clock.takes(2.0 if drafts else 1.0)
        gate.finish(1, drafts, recorded=False)
        if drafts:
            mean, measured = gate.tokens_after(mean, 8, measured)
    assert gate.drafts(1, [None])  # the new stream starts from the streams before it
    gate.start()
    clock.takes(2.0)
    gate.finish(1, True, recorded=False)
    mean, measured = (tokens_mean(None, 1, 0), 1) if control else gate.tokens_after(None, 1, 0)
    assert gate.drafts(1, [mean]) is not control, mean
