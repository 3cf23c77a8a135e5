"""Recordings that outlive requests and tree shapes (tensorfold/model/replay.py): a lane's cache is reset in place
for its next request, so that request replays the recordings made on the lane's buffers, and a tree's index maps
are round data, so trees of one row count replay one recording whatever their shape. Both compute the bits a fresh
stream and an eager round compute; the planted controls show a stale lane and stale maps give other bits.

Under --gpu the graphs are real on the lane tests' 0.8B-shaped model; without it the `cuda` backend runs in numba's
CUDA simulator at the micro config, where a recorded argument is fixed as on a GPU (see tests/test_graphs.py).
"""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.drafters import Drafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import StreamState
from tensorfold.model.replay import DecodeGraphs
from tensorfold.model.rows import Window
from tensorfold.prompt_cache import PromptCache


@pytest.fixture(scope="module")
def graph_model(request, on_gpu, tmp_path_factory):
    """A model on the `cuda` backend: the lane tests' model on the GPU, the micro config in the simulator."""
    if on_gpu:
        return request.getfixturevalue("lanes_model")
    request.getfixturevalue("simulated_module")
    from conftest import sim_lanes_config

    from tensorfold.model.tiny import make_tiny
    folder = str(tmp_path_factory.mktemp("reuse"))
    make_tiny(folder, seed=5, fmt="hf", config=dataclasses.replace(sim_lanes_config(), vocab_size=264))
    return tensorfold.load(folder, backend="cuda")


# --- a lane's cache, reused by its next request ----------------------------------------------------------------

FIRST, SECOND = [5, 17, 99, 3, 42, 7], [250, 8, 61]
TOKENS = 3  # the second request's: one eager prompt round, then decode rounds replayed


def finished(engine, prompt, params):
    """A request run to its end on the engine, round by round on this thread."""
    request = engine.submit(prompt, params)
    while request.finish_reason is None:
        engine.run_round()
    return request


def second_request(model, first: bool) -> tuple:
    """SECOND through a one-lane engine with graphs on, after FIRST on the same lane (`first`) or alone: its tokens
    and their logprobs (floats of its logits), and the engine's recordings before and after it."""
    engine = Engine(model, parallel=1, chunk=8, context=64, graphs=True)
    if first:
        finished(engine, FIRST, SamplingParams(max_tokens=TOKENS, stop_ids=()))
    before = engine.graphs.recorded
    request = finished(engine, SECOND, SamplingParams(max_tokens=TOKENS, stop_ids=(), logprobs=2))
    return (request.output, request.logprobs), before, engine.graphs.recorded


@pytest.fixture(scope="module")
def alone(graph_model):
    """SECOND on a fresh lane: what it must give after FIRST."""
    return second_request(graph_model, first=False)[0]


def test_the_next_request_replays_the_lanes_recordings(graph_model, alone):
    got, before, after = second_request(graph_model, first=True)
    assert before >= 1 and after == before  # FIRST's decode rounds recorded, SECOND's replay them
    assert got == alone


@pytest.mark.parametrize("left", ["DeltaNet state", "conv tail"])
def test_control_a_reset_that_leaves_the_last_request_is_caught(graph_model, alone, left, monkeypatch):
    """Control: a reset that leaves the previous request's DeltaNet states or conv tails in the lane's buffers."""
    reset, part = StreamState.reset, 0 if left == "DeltaNet state" else 1

    def leaky_reset(self):
        self.settle()  # the last request's states and tails in the lane's own buffers
        stale = {i: self.ops.to_host(buffers[part]).copy() for i, buffers in self.home.items()}
        reset(self)
        for i, buffers in self.home.items():
            self.ops.copy_into(buffers[part], self.ops.upload(stale[i]))
    monkeypatch.setattr(StreamState, "reset", leaky_reset)
    assert second_request(graph_model, first=True)[0] != alone


def test_a_resumed_request_restores_into_the_lane(graph_model):
    """A request resumed from the prompt cache on a reused lane: the snapshot is copied into the lane's own
    buffers, so its decode rounds replay the lane's recordings, and it gives a fresh engine's tokens."""
    resumed = FIRST[:4] + [77, 78]  # resumes from FIRST's snapshot at 4 rows (the mark of 4-row chunks)
    params = SamplingParams(max_tokens=TOKENS, stop_ids=(), logprobs=2)
    fresh = finished(Engine(graph_model, parallel=1, chunk=4, context=64, graphs=True), resumed, params)
    engine = Engine(graph_model, parallel=1, chunk=4, context=64, graphs=True, prompt_cache=PromptCache(64 << 20, 4))
    finished(engine, FIRST, SamplingParams(max_tokens=TOKENS, stop_ids=()))
    before = engine.graphs.recorded
    request = finished(engine, resumed, params)
    assert request.stats.cached_tokens == 4 and engine.graphs.recorded == before
    assert (request.output, request.logprobs) == (fresh.output, fresh.logprobs)


# --- trees of one row count, one recording ---------------------------------------------------------------------

# Three 4-row trees: two levels, a spine with a fork at its tip, and a root with three children (path_slots 3, 3
# and 2 columns wide: padded to 4), each round's keep a path of that round's tree.
TREES = ([-1, 0, 0, 1], [-1, 0, 1, 1], [-1, 0, 0, 0])
PATHS = ([0, 1, 3], [0, 1], [0, 3])


def trees(model, graphs: DecodeGraphs | None, rounds: int = len(TREES)) -> list:
    """FIRST but its last token into a stream, then `rounds` rounds of one tree each (TREES[n]: the greedy token and
    three made-up rows), each keeping PATHS[n]; returns every round's logits bytes."""
    state = model.net.new_state(max_rows=64)
    model.net.forward_round([Window(state, FIRST[:-1], "last")])
    state.keep(len(FIRST) - 1, write_back=True)
    token, seen = FIRST[-1], []
    for parents, path in list(zip(TREES, PATHS))[:rounds]:
        windows = [Window(state, [token] + [(token + 3 * r) % 200 for r in (1, 2, 3)], parents=parents)]
        logits, _ = graphs.run(windows) if graphs is not None else model.net.forward_logits(windows)
        rows = model.backend.to_host(logits)
        state.keep_path(path)
        seen.append(rows.tobytes())
        token = int(np.argmax(rows[path[-1]]))
    return seen


@pytest.fixture(scope="module")
def eager_trees(graph_model):
    return trees(graph_model, None)


def test_trees_of_one_row_count_replay_one_recording(graph_model, eager_trees):
    graphs = DecodeGraphs(graph_model.net)
    assert trees(graph_model, graphs) == eager_trees
    assert (graphs.recorded, graphs.replayed) == (1, len(TREES))


def test_control_a_replay_of_the_recorded_trees_maps_is_caught(graph_model, eager_trees, monkeypatch):
    """Control: a replay that keeps the maps of the tree it recorded, not this round's, differs from round 2."""
    padded_maps, first = Window.padded_maps, {}
    monkeypatch.setattr(Window, "padded_maps", property(
        lambda self: first.setdefault(len(self.ids), padded_maps.fget(self))))
    got = trees(graph_model, DecodeGraphs(graph_model.net), rounds=2)
    assert got[0] == eager_trees[0] and got[1] != eager_trees[1]


# --- the engine: lanes reused, trees of changing shapes --------------------------------------------------------

class TreeOracle(Drafter):
    """Proposes a request's known undrafted output as a tree whose shape changes every round: level by level the
    right guess beside a wrong one, the right one first in even rounds, second in odd rounds, so that a recording
    keyed by parents would re-record every round; every third right guess is made wrong, so paths end early too."""

    def __init__(self, outputs):
        self.outputs, self.rounds = outputs, 0  # prompt tuple -> its undrafted output

    def propose_tree(self, tokens, max_rows, state=None):
        prompt = next(p for p in self.outputs if tuple(tokens[:len(p)]) == p)
        done, self.rounds = len(tokens) - len(prompt), self.rounds + 1
        guesses = [t if (done + i) % 3 else (t + 1) % 200
                   for i, t in enumerate(self.outputs[prompt][done:done + max_rows // 2])]
        ids, parents, right = [], [], -1
        for token in guesses:
            pair = [token, (token + 7) % 200] if self.rounds % 2 else [(token + 7) % 200, token]
            parents += [right, right]
            right = len(ids) + pair.index(token)
            ids += pair
        return ids, parents


PROMPTS = (FIRST, SECOND, FIRST[:3] + SECOND)


def engine_outputs(model, drafter, graphs: bool):
    """PROMPTS (6 greedy tokens each: room for two-level trees) through a two-lane engine, the third request on a
    reused lane."""
    engine = Engine(model, parallel=2, chunk=8, context=64, drafter=drafter, max_draft=4, graphs=graphs)
    submitted = [engine.submit(prompt, SamplingParams(max_tokens=4, stop_ids=())) for prompt in PROMPTS]
    while any(r.finish_reason is None for r in submitted):
        engine.run_round()
    return [r.output for r in submitted], engine


def test_engine_tree_replays_equal_graphs_off(graph_model):
    undrafted = engine_outputs(graph_model, Drafter(), graphs=False)[0]
    oracle = lambda: TreeOracle({tuple(p): out for p, out in zip(PROMPTS, undrafted)})  # noqa: E731
    off = engine_outputs(graph_model, oracle(), graphs=False)[0]
    on, engine = engine_outputs(graph_model, oracle(), graphs=True)
    assert on == off == undrafted
    assert engine.graphs.replayed > 2 * engine.graphs.recorded  # tree rounds of changing shapes, few recordings
