"""Decode rounds, drafted or not, replayed from CUDA graphs (tensorfold/model/replay.py) compute the eager rounds'
bits.

Under --gpu the graphs are real (stream capture, cuGraphLaunch) on the lane tests' 0.8B-shaped model. Without it
the `cuda` backend runs in numba's CUDA simulator at the micro config, where a graph is the recorded list of
launches, each argument fixed when recorded: a round that would read a host value baked into the recording, or
leave a state where the next replay does not look, or keep rows from a graph's buffers past the next replay, gives
different bits there as it would on a GPU. The planted controls show each.
"""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import StreamState
from tensorfold.model.replay import DecodeGraphs
from tensorfold.model.rows import Window


@pytest.fixture(scope="module")
def graph_model(request, on_gpu, tmp_path_factory):
    """A model on the `cuda` backend: the lane tests' model on the GPU, the micro config in the simulator."""
    if on_gpu:
        return request.getfixturevalue("lanes_model")
    request.getfixturevalue("simulated_module")
    from conftest import sim_lanes_config

    from tensorfold.model.tiny import make_tiny
    folder = str(tmp_path_factory.mktemp("graphs"))
    # The simulator's time goes to the head's GEMV: the smallest vocabulary the tiny tokenizer allows (263 ids).
    make_tiny(folder, seed=3, fmt="hf", config=dataclasses.replace(sim_lanes_config(), vocab_size=264))
    return tensorfold.load(folder, backend="cuda")


PROMPTS = ([5, 17, 99, 3, 42, 7], [250, 8, 61])


def decode(model, rounds: int, graphs: DecodeGraphs | None) -> list:
    """Feed each prompt, then `rounds` decode rounds of both streams together (each fed its own greedy token);
    returns the logits bytes of every round, stream by stream."""
    net = model.net
    states = [net.new_state(max_rows=64) for _ in PROMPTS]
    net.forward_round([Window(state, prompt[:-1], "last") for state, prompt in zip(states, PROMPTS)])
    for state, prompt in zip(states, PROMPTS):
        state.keep(len(prompt) - 1, write_back=True)
    tokens = [p[-1] for p in PROMPTS]
    seen = []
    for _ in range(rounds):
        windows = [Window(state, [token]) for state, token in zip(states, tokens)]
        logits, starts = graphs.run(windows) if graphs is not None else net.forward_logits(windows)
        every = model.backend.to_host(logits)
        rows = [every[a:b] for a, b in zip(starts[:-1], starts[1:])]
        for state in states:
            state.keep(1)
        seen.append(b"".join(r.tobytes() for r in rows))
        tokens = [int(np.argmax(r[0])) for r in rows]
    return seen


@pytest.fixture(scope="module")
def eager(graph_model):
    """Two eager decode rounds: what every replay must give (the second is the first a stale replay gets wrong)."""
    return decode(graph_model, 2, None)


def test_replayed_rounds_equal_eager_rounds(graph_model, eager):
    graphs = DecodeGraphs(graph_model.net)
    assert decode(graph_model, 2, graphs) == eager
    assert (graphs.recorded, graphs.replayed) == (1, 2)  # recorded once, replayed every round
    layer_types = graph_model.net.config.layer_types
    deltanet = sum(kind == "linear_attention" for kind in layer_types)
    (recorded,) = graphs.recordings.values()
    # Recorded side by side, stream by stream: each DeltaNet layer's conv and scan, each attention layer's
    # attention, and the keep (on the GPU, branches of the graph).
    assert recorded.graph.forks == 2 * deltanet + (len(layer_types) - deltanet) + 1


def test_control_stale_inputs_are_caught(graph_model, eager, monkeypatch):
    """Control: a replay that reads the round's integers of the recording (never rewritten) differs."""
    graphs = DecodeGraphs(graph_model.net)
    original = graphs.write_integers
    fills = []

    def only_first(recorded, windows):
        if not fills:
            original(recorded, windows)
        fills.append(1)
    monkeypatch.setattr(graphs, "write_integers", only_first)
    got = decode(graph_model, 2, graphs)
    assert got[0] == eager[0] and got[1] != eager[1]


def test_control_state_left_out_of_place_is_caught(graph_model, eager, monkeypatch):
    """Control: a recording whose DeltaNet states and conv tails are not written back in place differs: the scan
    and the conv write new arrays, and no copy puts them where the next replay reads."""
    ops = type(graph_model.net.ops)
    for name in ("deltanet_scan", "causal_conv"):
        op = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda self, *args, op=op, in_place=False, **kwargs: op(self, *args, **kwargs))
    monkeypatch.setattr(StreamState, "commit_in_place", lambda self: None)
    got = decode(graph_model, 2, DecodeGraphs(graph_model.net))
    assert got[0] == eager[0] and got[1] != eager[1]


def test_engine_graphs_on_equals_off(graph_model):
    """The engine with graphs on and off: the same tokens, with drafted (eager) rounds between replayed ones, a
    sampled request and a stream that finishes before the others."""
    from tensorfold.drafters import NgramDrafter
    requests = [(PROMPTS[0] + PROMPTS[0][:3], SamplingParams(max_tokens=5)),
                (PROMPTS[1], SamplingParams(max_tokens=2, temperature=0.9, seed=11)),
                (PROMPTS[1] + PROMPTS[0][:1], SamplingParams(max_tokens=4, draft=False))]
    outputs = {}
    for graphs in (False, True):
        engine = Engine(graph_model, parallel=3, chunk=8, context=64, drafter=NgramDrafter(), graphs=graphs)
        submitted = [engine.submit(prompt, params) for prompt, params in requests]
        while any(r.finish_reason is None for r in submitted):
            engine.run_round()
        outputs[graphs] = [r.output for r in submitted]
        if graphs:  # the mix this test is for: replayed rounds and a drafted (eager) one
            assert engine.graphs.replayed > 0 and any(r.stats.draft_rounds for r in submitted)
    assert outputs[True] == outputs[False]


def test_recording_key_follows_the_buffers():
    """A recording's key (`StreamState.settled_buffers`) stays through an eager keep once `settle` has put the
    DeltaNet state back in the stream's own buffer, and changes when a key/value buffer grows, which a replay
    must never miss. Control: a key of the DeltaNet buffers alone misses the growth."""
    from conftest import sim_lanes_config

    from tensorfold.backends import NumpyBackend
    state = StreamState(sim_lanes_config(), NumpyBackend())
    key = lambda buffers: tuple(id(b) for b in buffers)  # noqa: E731
    before = key(state.settled_buffers())
    layer = next(iter(state.recurrent))
    state.recurrent[layer] = state.recurrent[layer] + 1  # an eager keep points the state at the scan's output
    state.settle()
    assert key(state.settled_buffers()) == before
    deltanet_only = key(state.settled_buffers()[:1])
    state.reserve(8)  # the key/value buffers grow
    assert key(state.settled_buffers()) != before
    assert key(state.settled_buffers()[:1]) == deltanet_only  # the control would not have seen it


# --- drafted rounds -----------------------------------------------------------------------------------------------

CHAIN, TREE = None, [-1, 0, 0, 1]  # stream 0 drafts 2-row chains after its decode row, stream 1 a 4-row tree
# Each round's keep: stream 0 a prefix of its 3-row chain, stream 1 a path of its tree; in full (the chain's every
# row, the tree's path to its last row), in part, and the decode row alone.
KEEPS = ([3, [0, 1, 3]], [2, [0, 2]], [1, [0]])


def drafted(model, graphs: DecodeGraphs | None, keeps=KEEPS, trees=None) -> list:
    """Feed each prompt, then a round per entry of `keeps` of both streams together: stream 0's window its greedy
    token and a 2-row chain, stream 1's a tree (TREE, or round n's `trees[n]`) whose rows after the first are made
    up; then each keeps the rows `keeps` says. Returns the logits bytes of every round, stream by stream."""
    net = model.net
    states = [net.new_state(max_rows=64) for _ in PROMPTS]
    net.forward_round([Window(state, prompt[:-1], "last") for state, prompt in zip(states, PROMPTS)])
    for state, prompt in zip(states, PROMPTS):
        state.keep(len(prompt) - 1, write_back=True)
    tokens = [p[-1] for p in PROMPTS]
    seen = []
    for n, (chain_keep, path) in enumerate(keeps):
        tree = TREE if trees is None else trees[n]
        windows = [Window(states[0], [tokens[0], (tokens[0] + 1) % 200, (tokens[0] + 2) % 200]),
                   Window(states[1], [tokens[1]] + [(tokens[1] + 3 * r) % 200 for r in range(1, len(tree))],
                          parents=tree)]
        logits, starts = graphs.run(windows) if graphs is not None else net.forward_logits(windows)
        every = model.backend.to_host(logits)
        rows = [every[a:b] for a, b in zip(starts[:-1], starts[1:])]
        states[0].keep(chain_keep)
        states[1].keep_path(path)
        seen.append(b"".join(r.tobytes() for r in rows))
        tokens = [int(np.argmax(rows[0][chain_keep - 1])), int(np.argmax(rows[1][path[-1]]))]
    return seen


@pytest.fixture(scope="module")
def eager_drafted(graph_model):
    return drafted(graph_model, None)


def test_drafted_rounds_equal_eager_rounds(graph_model, eager_drafted):
    """A chain and a tree in one round, kept in full, in part and not at all: one recording, replayed each round."""
    graphs = DecodeGraphs(graph_model.net)
    assert drafted(graph_model, graphs) == eager_drafted
    assert (graphs.recorded, graphs.replayed) == (1, len(KEEPS))
