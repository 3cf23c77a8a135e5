"""Recordings that outlive requests and tree shapes (tensorfold/model/replay.py): a lane's cache is reset in place
for its next request, so that request replays the recordings made on the lane's buffers, and a tree's index maps
are round data, so trees of one row count replay one recording whatever their shape. Both compute the bits a fresh
stream and an eager round compute (the references run on the twins: `conftest.twin_of`); the planted controls show
a stale lane and stale maps give other bits.

Under --gpu the graphs are real on the lane tests' 0.8B-shaped model; without it the `cuda` backend runs in numba's
CUDA simulator at the micro config, where a recorded argument is fixed as on a GPU (see tests/test_graphs.py).
"""

import numpy as np
import pytest
from conftest import twin_of

from tensorfold.drafters import Drafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import StreamState
from tensorfold.model.replay import DecodeGraphs
from tensorfold.model.rows import Window
from tensorfold.prompt_cache import PromptCache


@pytest.fixture(scope="module")
def graph_model(request, on_gpu, tmp_path_factory):
    from conftest import graph_model_for
    return graph_model_for(request, on_gpu, tmp_path_factory, "reuse", seed=5)


# --- a lane's cache, reused by its next request ----------------------------------------------------------------
#
# A simulated forward of the micro model takes seconds, so every request here is as short as its point allows.

FIRST, SECOND = [5, 17, 99, 3, 42, 7], [250, 8, 61]
TOKENS = 2  # a request's: one eager prompt round, then one decode round (recorded, or replayed)


def finished(engine, prompt, tokens: int = TOKENS):
    """A greedy request of `tokens` tokens with their logprobs, run to its end round by round on this thread."""
    request = engine.submit(prompt, SamplingParams(max_tokens=tokens, stop_ids=(), logprobs=2))
    while request.finish_reason is None:
        engine.run_round()
    return request


def one_lane(model, **options) -> Engine:
    return Engine(model, parallel=1, context=64, graphs=True, ahead=True, **options)


def outcome(request) -> tuple:
    """A request's tokens and their logprobs (floats of its logits)."""
    return request.output, request.logprobs


@pytest.fixture(scope="module")
def alone(graph_model):
    """SECOND on a fresh lane: what it must give after another request."""
    return outcome(finished(one_lane(graph_model, chunk=8), SECOND))


def test_the_next_request_replays_the_lanes_recordings(graph_model, alone):
    engine = one_lane(graph_model, chunk=8)
    finished(engine, FIRST)
    before = engine.graphs.recorded
    second = finished(engine, SECOND)
    assert before == 1 and engine.graphs.recorded == before  # FIRST's decode round recorded, SECOND's replays it
    assert outcome(second) == alone


def test_a_round_that_recorded_settles_the_collector_and_a_replay_does_not(graph_model, monkeypatch):
    """The round after one that made a recording settles the garbage collector (device/collector.py: what a
    recording makes lives as long as the process), once per such round; a request whose rounds only replay (the
    lane's next) settles nothing, and the real `settle` leaves the objects that survive out of later scans. A
    frozen engine is still freed when dropped (no reference cycle holds it or its lanes)."""
    import gc
    import weakref

    import tensorfold.engine as engine_module
    from tensorfold.device.collector import settle
    engine = Engine(graph_model, parallel=1, context=64, graphs=True)
    settled = []
    monkeypatch.setattr(engine_module, "settle", lambda: settled.append(engine._recordings()))
    finished(engine, FIRST, tokens=4)
    engine.run_round()  # (a round with nothing to run still settles what the last one recorded)
    assert settled and settled == sorted(set(settled)) and settled[-1] == engine._recordings() > 0
    recorded, calls = engine._recordings(), len(settled)
    finished(engine, SECOND, tokens=4)
    engine.run_round()
    assert engine._recordings() == recorded and len(settled) == calls
    survivor = [engine]
    try:
        settle()
        assert gc.get_freeze_count() > 0 and not any(o is survivor for o in gc.get_objects())
        dropped = [weakref.ref(engine)] + [weakref.ref(lane) for lane in engine.lanes]
        monkeypatch.undo()  # (the patched settle refers to the engine)
        del engine, survivor
        assert all(ref() is None for ref in dropped)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("left", ["DeltaNet state", "conv tail"])
def test_control_a_reset_that_leaves_the_last_request_is_caught(graph_model, alone, left, monkeypatch):
    """Control: a reset that leaves the previous request's DeltaNet states or conv tails in the lane's buffers
    changes the next request's first token's logprobs (one prompt round each: the reset is the same for any
    round after it)."""
    reset, part = StreamState.reset, 0 if left == "DeltaNet state" else 1

    def leaky_reset(self):
        self.settle()  # the last request's states and tails in the lane's own buffers
        stale = {i: self.ops.to_host(buffers[part]).copy() for i, buffers in self.home.items()}
        reset(self)
        for i, buffers in self.home.items():
            self.ops.copy_into(buffers[part], self.ops.upload(stale[i]))
    monkeypatch.setattr(StreamState, "reset", leaky_reset)
    engine = one_lane(graph_model, chunk=8)
    finished(engine, FIRST, tokens=1)
    assert outcome(finished(engine, SECOND, tokens=1))[1][0] != alone[1][0]


# A temperature at which the draws are not the argmax: under --gpu the lane model's random weights (a tied embedding
# of spread 1) give logits of spread about sqrt(hidden) = 32, so at 0.8 every draw would be the argmax, and a draw
# from parameters never written (greedy, at temperature 0) would give the same tokens.
SAMPLED = SamplingParams(max_tokens=4, stop_ids=(), temperature=32.0, seed=3)


@pytest.fixture(scope="module")
def sampled_eager(graph_model):
    return Engine(twin_of(graph_model), parallel=1, context=64, graphs=False).generate(FIRST, SAMPLED)


def test_rounds_replayed_ahead_draw_in_the_replay_and_read_their_ids_on_the_device(graph_model, sampled_eager,
                                                                                   monkeypatch):
    """A one-row round whose stream draws on the device draws inside its replay (no `sample_rows` call but the
    prompt round's), and replays ahead of its tokens: the first decode round with the ids the host wrote, then two
    recordings in turn whose ids are the tokens the round before drew, one round more than the request needs (its
    row computed, never kept). Seeded sampling gives the eager rounds' tokens."""
    calls, real = [], graph_model.backend.sample_rows
    monkeypatch.setattr(graph_model.backend, "sample_rows", lambda *args: calls.append(1) or real(*args))
    engine = one_lane(graph_model, chunk=8)
    assert engine.generate(FIRST, SAMPLED) == sampled_eager
    assert len(calls) == 1 and (engine.graphs.recorded, engine.graphs.replayed) == (3, 4)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # unwritten: whatever they held
def test_control_draw_parameters_never_written_are_caught(graph_model, sampled_eager, monkeypatch):
    """Control: replays that draw with parameters never written (only the prompt round's draw writes its own) give
    other tokens."""
    from tensorfold.backends.cuda_backend import DrawSlots
    write, written = DrawSlots.write, []

    def first_only(slots, *values):
        if not written:
            written.append(slots)
            write(slots, *values)

    monkeypatch.setattr(DrawSlots, "write", first_only)
    assert one_lane(graph_model, chunk=8).generate(FIRST, SAMPLED) != sampled_eager


def test_a_stream_that_ends_while_its_round_runs_ahead_leaves_the_others_exact(graph_model):
    """Two streams ahead of their tokens, the first ending after two tokens while its next round already runs: the
    second waits for that round, then goes on alone (a round of one stream, then ahead again); both give the eager
    engine's tokens."""
    prompts, lengths = [FIRST, SECOND], [2, 4]

    def outputs(graphs):
        # both prompts in the first round (a chunk of 16 rows), so the streams decode together
        engine = Engine(graph_model if graphs else twin_of(graph_model), parallel=2, context=64, chunk=16,
                        graphs=graphs, ahead=graphs)
        requests = [engine.submit(p, SamplingParams(max_tokens=n, stop_ids=(), temperature=0.8, seed=9))
                    for p, n in zip(prompts, lengths)]
        while engine.run_round():
            pass
        return [r.output for r in requests], engine

    eager, _ = outputs(False)
    ahead, engine = outputs(True)
    assert ahead == eager and [len(o) for o in ahead] == lengths
    assert engine.graphs.recorded == 4  # two streams: drawn, then one ahead; one stream: drawn, then one ahead


def test_rounds_go_ahead_while_the_gate_finds_drafting_does_not_pay(graph_model):
    """With "auto"'s gate, a round the gate does not draft goes ahead of its tokens like any undrafted round: here
    drafted rounds cost ten undrafted ones, so after measuring both the gate stops drafting and the rounds go
    ahead. The tokens are the eager undrafted rounds'."""
    from test_draft_gate import RoundClock

    from tensorfold.drafters import DraftGate

    class Repeats(Drafter):  # two guesses every round, made at no cost: the last token again
        def propose(self, tokens, max_rows, state=None):
            return [tokens[-1]] * max_rows

    params = SamplingParams(max_tokens=8, stop_ids=(), temperature=0.8, seed=3)
    eager = Engine(twin_of(graph_model), parallel=1, context=64, graphs=False).generate(FIRST, params)
    clock, drafter = RoundClock(), Repeats()
    propose = drafter.propose_tree
    drafter.propose_tree = lambda *args: clock.takes(10.0) or propose(*args)
    engine = one_lane(graph_model, chunk=8, drafter=drafter, max_draft=2, gate=DraftGate(clock))
    request = engine.submit(FIRST, params)
    while engine.run_round():
        pass
    assert request.output == eager and 0 < request.stats.draft_rounds < 4
    assert any(key[-1] is not None for key in engine.graphs.recordings)  # a recording of a round replayed ahead


def test_control_a_round_ahead_with_the_hosts_ids_is_caught(graph_model, sampled_eager, monkeypatch):
    """Control: rounds replayed ahead whose ids stay the host's placeholder (their copy of the tokens before them
    left out of the recording) give other tokens."""
    record = DecodeGraphs._record
    monkeypatch.setattr(DecodeGraphs, "_record", lambda self, windows, taps, drawn, feed=None, ahead=False: record(
        self, windows, taps, drawn, feed, False))
    assert one_lane(graph_model, chunk=8).generate(FIRST, SAMPLED) != sampled_eager


def test_a_resumed_request_restores_into_the_lane(graph_model, alone):
    """A request resumed from the prompt cache on a reused lane: the snapshot is copied into the lane's own
    buffers (the ones its recordings are keyed by), and it gives a fresh prompt pass's tokens."""
    engine = one_lane(graph_model, chunk=2, prompt_cache=PromptCache(64 << 20, 2))
    finished(engine, SECOND[:2] + [9], tokens=1)  # leaves a snapshot of SECOND[:2] (the mark of 2-row chunks)
    (lane,) = engine.lanes
    buffers = [id(buffer) for buffer in lane.settled_buffers()]
    resumed = finished(engine, SECOND)
    assert resumed.stats.cached_tokens == 2 and [id(buffer) for buffer in lane.settled_buffers()] == buffers
    assert outcome(resumed) == alone


# --- trees of one row count, one recording ---------------------------------------------------------------------

# Two 4-row trees: two levels, and a spine with a fork at its tip (path_slots 3 columns wide, padded to 4, in
# different places), each round's keep a path of that round's tree.
TREES = ([-1, 0, 0, 1], [-1, 0, 1, 1])
PATHS = ([0, 1, 3], [0, 1])


def trees(model, graphs: DecodeGraphs | None) -> list:
    """A new stream's rounds of one tree each (TREES[n]: made-up rows, the first after the last round's kept
    token), each keeping PATHS[n]; returns every round's logits bytes."""
    state, token, seen = model.net.new_state(max_rows=64), FIRST[0], []
    for parents, path in zip(TREES, PATHS):
        windows = [Window(state, [token] + [(token + 3 * r) % 200 for r in (1, 2, 3)], parents=parents)]
        logits = graphs.run(windows)[0] if graphs is not None else model.net.forward_logits(windows)[0]
        rows = model.backend.to_host(logits)
        state.keep_path(path)
        if graphs is not None:
            graphs.keep_round()
        seen.append(rows.tobytes())
        token = int(np.argmax(rows[path[-1]]))
    return seen


@pytest.fixture(scope="module")
def eager_trees(graph_model):
    return trees(twin_of(graph_model), None)


def test_trees_of_one_row_count_replay_one_recording(graph_model, eager_trees):
    graphs = DecodeGraphs(graph_model.net)
    assert trees(graph_model, graphs) == eager_trees
    assert (graphs.recorded, graphs.replayed) == (1, len(TREES))


def test_control_a_replay_of_the_recorded_trees_maps_is_caught(graph_model, eager_trees, monkeypatch):
    """Control: a replay that keeps the maps of the tree it recorded, not this round's, differs in round 2."""
    padded_maps, first = Window.padded_maps, {}
    monkeypatch.setattr(Window, "padded_maps", property(
        lambda self: first.setdefault(len(self.ids), padded_maps.fget(self))))
    got = trees(graph_model, DecodeGraphs(graph_model.net))
    assert got[0] == eager_trees[0] and got[1] != eager_trees[1]


# --- the engine: trees of changing shapes ----------------------------------------------------------------------

class TreeOracle(Drafter):
    """Proposes a request's known undrafted output as a 4-row tree: the decode row, a guess and a wrong sibling,
    and the next guess under the first. The guess comes first in even rounds, second in odd ones, so the tree's
    shape changes every round; a guess at output position 1, 4, ... is made wrong, so the engine below keeps the
    first tree's root alone and a path to the second's last row."""

    def __init__(self, prompt, output):
        self.prompt, self.output = prompt, output
        self.shapes = []  # each proposal's parents

    def propose_tree(self, tokens, max_rows, state=None):
        done = len(tokens) - len(self.prompt)
        guess, after = [t if (done + i) % 3 != 1 else (t + 1) % 200 for i, t in enumerate(self.output[done:done + 2])]
        level = [guess, (guess + 7) % 200] if len(self.shapes) % 2 == 0 else [(guess + 7) % 200, guess]
        parents = [-1, -1, level.index(guess)]
        self.shapes.append(tuple(parents))
        return level + [after], parents


def test_engine_tree_replays_equal_undrafted_eager(graph_model):
    """The engine, graphs on, drafting trees of two shapes against an oracle: the tokens of the undrafted eager
    engine (drafted output equals undrafted, eager or replayed), from one recording for both trees and one for
    the undrafted rounds."""
    undrafted = finished(Engine(twin_of(graph_model), context=64, graphs=False), FIRST, tokens=6).output
    oracle = TreeOracle(FIRST, undrafted)
    engine = Engine(graph_model, context=64, drafter=oracle, max_draft=4, graphs=True)
    assert finished(engine, FIRST, tokens=6).output == undrafted
    assert len(set(oracle.shapes)) == 2 and (engine.graphs.recorded, engine.graphs.replayed) == (2, 3)
