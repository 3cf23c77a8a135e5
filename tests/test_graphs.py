"""Decode rounds, drafted or not, replayed from CUDA graphs (tensorfold/model/replay.py) compute the eager rounds'
bits, which are the twins' (the references here run on the numpy backend: `conftest.twin_of`).

Under --gpu the graphs are real (stream capture, cuGraphLaunch) on the lane tests' 0.8B-shaped model. Without it
the `cuda` backend runs in numba's CUDA simulator at the micro config, where a graph is the recorded list of
launches, each argument fixed when recorded: a round that would read a host value baked into the recording, or
leave a state where the next replay does not look, or keep rows from a graph's buffers past the next replay, gives
different bits there as it would on a GPU. The planted controls show each.
"""

import numpy as np
import pytest
from conftest import twin_of

from tensorfold import engine as engine_module
from tensorfold.drafters import Drafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import StreamState
from tensorfold.model.replay import DecodeGraphs
from tensorfold.model.rows import Window


@pytest.fixture(scope="module")
def graph_model(request, on_gpu, tmp_path_factory):
    from conftest import graph_model_for
    return graph_model_for(request, on_gpu, tmp_path_factory, "graphs", seed=3)


PROMPTS = ([5, 17, 99, 3, 42, 7], [250, 8, 61])


def prompted(model, pool=None) -> tuple:
    """Each prompt but its last token fed to a stream of its own (its DeltaNet states lane n of `pool`, if given):
    (the states, each prompt's last token)."""
    states = [model.net.new_state(max_rows=64, pool=pool, lane=n) for n in range(len(PROMPTS))]
    model.net.forward_round([Window(state, prompt[:-1], "last") for state, prompt in zip(states, PROMPTS)])
    for state, prompt in zip(states, PROMPTS):
        state.keep(len(prompt) - 1, write_back=True)
    return states, [p[-1] for p in PROMPTS]


def decode(model, rounds: int, graphs: DecodeGraphs | None, pool=None, swap_lanes=False) -> list:
    """Feed each prompt, then `rounds` decode rounds of both streams together (each fed its own greedy token);
    returns the logits bytes of every round, stream by stream. `swap_lanes` plants two pooled streams' lane indices
    swapped, their states' views left as they are."""
    net, (states, tokens) = model.net, prompted(model, pool)
    if swap_lanes:
        states[0].lane, states[1].lane = states[1].lane, states[0].lane
    seen = []
    for _ in range(rounds):
        windows = [Window(state, [token]) for state, token in zip(states, tokens)]
        logits, starts = graphs.run(windows)[:2] if graphs is not None else net.forward_logits(windows)
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
    return decode(twin_of(graph_model), 2, None)


def test_replayed_rounds_equal_eager_rounds(graph_model, eager, on_gpu):
    graphs = DecodeGraphs(graph_model.net)
    assert decode(graph_model, 2, graphs) == eager
    assert (graphs.recorded, graphs.replayed) == (1, 2)  # recorded once, replayed every round
    layer_types = graph_model.net.config.layer_types
    deltanet = sum(kind == "linear_attention" for kind in layer_types)
    (recorded,) = graphs.recordings.values()
    # Recorded side by side, stream by stream: each DeltaNet layer's conv and scan, each attention layer's
    # attention, and the keep (on the GPU, branches of the graph).
    assert recorded.graph.forks == 2 * deltanet + (len(layer_types) - deltanet) + 1
    # the kernels a replay runs, counted as they were recorded (under the simulator, its list of launches)
    assert graphs.kernels == recorded.graph.kernels > 2 * len(layer_types)
    assert on_gpu or recorded.graph.kernels == len(recorded.graph.launches)


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
    """The engine with graphs on and off (on the twins): the same tokens, with prompt chunks (eager) between replayed
    rounds, n-gram drafts, a sampled request and a stream that finishes before the others."""
    from tensorfold.drafters import NgramDrafter
    requests = [(PROMPTS[0] + PROMPTS[0][:3], SamplingParams(max_tokens=5)),
                (PROMPTS[1], SamplingParams(max_tokens=2, temperature=0.9, seed=11)),
                (PROMPTS[1] + PROMPTS[0][:1], SamplingParams(max_tokens=4, draft=False))]
    outputs = {}
    for graphs in (False, True):
        engine = Engine(graph_model if graphs else twin_of(graph_model), parallel=3, chunk=8, context=64,
                        drafter=NgramDrafter(), graphs=graphs)
        submitted = [engine.submit(prompt, params) for prompt, params in requests]
        while any(r.finish_reason is None for r in submitted):
            engine.run_round()
        outputs[graphs] = [r.output for r in submitted]
        if graphs:  # the mix this test is for: replayed rounds and drafted ones
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

# Each round, stream 0 drafts a 3-row chain (its decode row and two guesses), stream 1 a 4-row tree: TREES[n] in
# round n, the first shape again in round 2, then a second shape of the same rows, which replays the same recording
# with its own maps (a tree's maps are round data: tests/test_replay_reuse.py has their control). Each round's keep:
# the chain in full, in part, and its decode row alone; the tree along a path to its last row (the scan's final
# state), along one that ends before it, and its decode row alone.
TREES = ([-1, 0, 0, 1], [-1, 0, 0, 1], [-1, 0, 1, 1])
KEEPS = ((3, [0, 1, 3]), (2, [0, 2]), (1, [0]))
TAPS = (0,)  # a block drafter's: the features of layer 0, which live in the graph's buffers too


def drafted(model, graphs: DecodeGraphs | None, rounds: int = len(KEEPS), held: list | None = None,
            eager_first: int = 0) -> list:
    """Feed each prompt, then `rounds` rounds of both streams together: stream 0's window its greedy token and a
    2-row chain, stream 1's its greedy token and three made-up rows in round n's tree; then each keeps the rows KEEPS
    says (a replayed round's keeps applied by its recorded keep). Returns the logits and tapped features bytes of
    every round, stream by stream; with `held`, appends the tapped feature arrays of each round to it. The first
    `eager_first` rounds run eagerly even with `graphs` (an eager chain's kept rows wait, pending, for the next
    scan)."""
    net, (states, tokens) = model.net, prompted(model)
    seen = []
    for n, (tree, (chain_keep, path)) in enumerate(list(zip(TREES, KEEPS))[:rounds]):
        windows = [Window(states[0], [tokens[0], (tokens[0] + 1) % 200, (tokens[0] + 2) % 200]),
                   Window(states[1], [tokens[1]] + [(tokens[1] + 3 * r) % 200 for r in (1, 2, 3)], parents=tree)]
        replayed = graphs is not None and n >= eager_first
        if replayed:
            logits, starts, _ = graphs.run(windows, TAPS)
        else:
            logits, starts = net.forward_logits(windows, TAPS)
        every = model.backend.to_host(logits)
        rows = [every[a:b] for a, b in zip(starts[:-1], starts[1:])]
        features = b"".join(model.backend.to_host(f).tobytes() for win in windows for f in win.features)
        if held is not None:
            held.append([f for win in windows for f in win.features])
        states[0].keep(chain_keep)
        states[1].keep_path(path)
        if replayed:
            graphs.keep_round()
        seen.append(b"".join(r.tobytes() for r in rows) + features)
        tokens = [int(np.argmax(rows[0][chain_keep - 1])), int(np.argmax(rows[1][path[-1]]))]
    return seen


@pytest.fixture(scope="module")
def eager_drafted(graph_model):
    return drafted(twin_of(graph_model), None)


def test_drafted_rounds_equal_eager_rounds(graph_model, eager_drafted):
    """A chain and a tree in one round, kept in full, in part and not at all: one recording for both tree shapes,
    replayed every round. The tapped features are the graph's: the next replay overwrites them,
    so a drafter must read them within the round (the engine's `observe` does)."""
    graphs, held = DecodeGraphs(graph_model.net), []
    assert drafted(graph_model, graphs, held=held) == eager_drafted
    assert (graphs.recorded, graphs.replayed) == (1, 3)
    first_now = b"".join(graph_model.backend.to_host(f).tobytes() for f in held[0])
    assert first_now != eager_drafted[0][-len(first_now):]  # round 1's features, read after round 2's replay


def test_control_a_replayed_round_whose_keep_is_not_replayed_is_caught(graph_model, eager_drafted, monkeypatch):
    """Control: without its recorded keep, a replayed round's kept rows never reach the streams' states."""
    monkeypatch.setattr(DecodeGraphs, "keep_round", lambda self: None)
    got = drafted(graph_model, DecodeGraphs(graph_model.net), rounds=2)
    assert got[0] == eager_drafted[0] and got[1] != eager_drafted[1]


def test_an_eager_round_then_replays_equal_eager_rounds(graph_model, eager_drafted):
    """An eager round's pending rows (the late keep's) are landed before the first replay."""
    assert drafted(graph_model, DecodeGraphs(graph_model.net), eager_first=1) == eager_drafted


def test_control_pending_rows_left_for_the_next_replay_are_caught(graph_model, eager_drafted, monkeypatch):
    """Control: a replay that does not land the kept rows pending from the eager round before would record their
    replay into its scan; its recorded keep, which writes the stream's own state, refuses to be recorded."""
    monkeypatch.setattr(StreamState, "land", lambda self: None)
    with pytest.raises(AssertionError, match="own state"):
        drafted(graph_model, DecodeGraphs(graph_model.net), rounds=2, eager_first=1)


def test_control_a_tree_reading_the_recorded_length_is_caught(graph_model, on_gpu, monkeypatch):
    """Control: a replay whose trees read the stream lengths of the recording (as a length passed from the host
    would be) reads the wrong keys: past the tree's maps for its deepest row, which the simulator refuses. On a GPU
    that read is out of bounds, which can leave the CUDA context unusable for every later test of the process, so
    this control runs in the simulator only."""
    if on_gpu:
        pytest.skip("the planted fault reads out of bounds: on a GPU it would poison the process's CUDA context")
    graphs = DecodeGraphs(graph_model.net)
    original, recorded_lengths = graphs.write_integers, {}

    def lengths_kept(recorded, windows):
        original(recorded, windows)
        committed = recorded.integers[-1]  # the table's last row: each row's stream length
        committed[...] = recorded_lengths.setdefault(id(recorded), np.array(committed))
    monkeypatch.setattr(graphs, "write_integers", lengths_kept)
    with pytest.raises(IndexError, match="out of bounds"):
        drafted(graph_model, graphs, rounds=2)


def test_control_a_drafted_scan_over_the_stored_state_is_caught(graph_model, eager_drafted, monkeypatch):
    """Control: a drafted recording whose scan writes its final state over the stored one, as a one-row round's
    does, differs: keeping part of a chain then replays its rows from the state after all of them."""
    ops = type(graph_model.net.ops)
    scan = ops.deltanet_scan
    monkeypatch.setattr(ops, "deltanet_scan", lambda self, *args, in_place=False, **kwargs: scan(
        self, *args, in_place=True, **kwargs))
    got = drafted(graph_model, DecodeGraphs(graph_model.net), rounds=2)
    assert got[0] == eager_drafted[0] and got[1] != eager_drafted[1]


class Oracle(Drafter):
    """Proposes each request's known undrafted output, every third guess wrong: as a chain for the first prompt, as
    a tree with a wrong sibling at each level for the second, so drafts are accepted in full, in part and not at
    all, and one round holds a chain and a tree."""

    def __init__(self, outputs):
        self.outputs = outputs  # prompt tuple -> its undrafted output

    def propose_tree(self, tokens, max_rows, state=None):
        prompt = next(p for p in self.outputs if tuple(tokens[:len(p)]) == p)
        done, tree = len(tokens) - len(prompt), prompt == tuple(ENGINE_PROMPTS[1])
        chain = [t if (done + i) % 3 else (t + 1) % 200
                 for i, t in enumerate(self.outputs[prompt][done:done + (max_rows // 2 if tree else max_rows)])]
        if not tree:
            return chain, list(range(-1, len(chain) - 1))
        ids, parents = [], []
        for depth, token in enumerate(chain):
            parents += [2 * depth - 1 if depth else -1] * 2
            ids += [(token + 7) % 200, token]
        return ids, parents


ENGINE_PROMPTS = (PROMPTS[0], PROMPTS[1] + PROMPTS[0][:2])


def engine_outputs(model, drafter, graphs: bool, capacity: int = 2, caches: list | None = None):
    """Both requests of ENGINE_PROMPTS (5 greedy tokens each) through one engine, and the engine; with `caches`,
    appends `caches_bytes` after every round to it."""
    # one prompt round: a chunk of 16 rows takes both prompts
    engine = Engine(model, parallel=2, chunk=16, context=64, drafter=drafter, max_draft=4, graphs=graphs)
    if engine.graphs is not None:
        engine.graphs.capacity = capacity
    submitted = [engine.submit(prompt, SamplingParams(max_tokens=5)) for prompt in ENGINE_PROMPTS]
    while any(r.finish_reason is None for r in submitted):
        engine.run_round()
        if caches is not None:
            caches.append(caches_bytes(engine))
    return [r.output for r in submitted], engine


@pytest.fixture(scope="module")
def undrafted(graph_model):
    """The requests' output, undrafted and eager."""
    return engine_outputs(twin_of(graph_model), Drafter(), graphs=False)[0]


def caches_bytes(engine) -> list:
    """Each active stream's cache after a round: DeltaNet states (with any pending rows replayed, the lane left as it
    is), conv tails, committed keys and values. (A stream whose request ended leaves; a replayed one-row round has
    already written its state, an eager one has not, and its lane is reset before it serves again.)"""
    seen = []
    for stream in engine.active:
        state = stream.state
        arrays = [*(state.scan_start(i) for i in state.recurrent), *state.conv_tail.values(),
                  *(k[:state.length] for k in state.keys.values()), *(v[:state.length] for v in state.values.values())]
        seen.append(b"".join(engine.model.backend.to_host(a).tobytes() for a in arrays))
    return seen


@pytest.fixture(scope="module")
def eager_drafted_caches(graph_model, undrafted):
    """The caches after every round of the same drafted requests, eager: the keeps of the same walks, on the host."""
    oracle = Oracle({tuple(p): out for p, out in zip(ENGINE_PROMPTS, undrafted)})
    caches = []
    engine_outputs(twin_of(graph_model), oracle, graphs=False, caches=caches)
    return caches


def test_engine_drafted_replays_equal_undrafted_eager(graph_model, undrafted, eager_drafted_caches):
    """The engine, graphs on, drafting chains and trees against an oracle: the undrafted eager tokens, from drafted
    rounds replayed (each round after the prompts), with at most `capacity` recordings held; after every round the
    streams' caches (what the recorded keeps wrote) equal the eager engine's after the same walks."""
    oracle = Oracle({tuple(p): out for p, out in zip(ENGINE_PROMPTS, undrafted)})
    caches = []
    outputs, engine = engine_outputs(graph_model, oracle, graphs=True, caches=caches)
    assert outputs == undrafted
    assert engine.graphs.replayed == engine.rounds - 1 and len(engine.graphs.recordings) <= 2
    assert caches == eager_drafted_caches


def test_control_engine_replays_without_their_recorded_keeps_are_caught(graph_model, undrafted, eager_drafted_caches,
                                                                        monkeypatch):
    """Control: the same engine run, its drafted replays' recorded keeps never replayed."""
    monkeypatch.setattr(DecodeGraphs, "keep_round", lambda self: None)
    oracle = Oracle({tuple(p): out for p, out in zip(ENGINE_PROMPTS, undrafted)})
    caches = []
    engine_outputs(graph_model, oracle, graphs=True, caches=caches)
    assert caches != eager_drafted_caches


# --- drafts of changing lengths, one recorded shape ---------------------------------------------------------------

class FirstGuessRight(Drafter):
    """Proposes as many guesses as the engine allows, only the first of them right: each round accepts one guess,
    and the proposals shrink with the room left (3 guesses, then 1)."""

    def __init__(self, prompt, output):
        self.prompt, self.output = list(prompt), output

    def propose_tree(self, tokens, max_rows, state=None):
        done = len(tokens) - len(self.prompt)
        guesses = self.output[done:done + max_rows]
        chain = guesses[:1] + [(t + 1) % 200 for t in guesses[1:]]
        return chain, list(range(-1, len(chain) - 1))


def shrinking_drafts(model, output) -> tuple:
    """The first prompt's request alone, drafted by FirstGuessRight: its output and the recordings made."""
    drafter = FirstGuessRight(ENGINE_PROMPTS[0], output)
    engine = Engine(model, parallel=1, chunk=8, context=64, drafter=drafter, max_draft=3, graphs=True)
    request = engine.submit(ENGINE_PROMPTS[0], SamplingParams(max_tokens=len(output)))
    while request.finish_reason is None:
        engine.run_round()
    return request.output, engine.graphs.recorded


def test_drafts_of_changing_lengths_replay_one_recording(graph_model, undrafted):
    """Windows of 4 and 2 rows, both padded to 1 + max_draft = 4: one recording, the undrafted output."""
    assert shrinking_drafts(graph_model, undrafted[0]) == (undrafted[0], 1)


def test_control_unpadded_drafts_record_each_length(graph_model, undrafted, monkeypatch):
    """Control: windows left at their own rows make a recording for each length."""
    monkeypatch.setattr(engine_module, "MAX_ROWS", 0)
    assert shrinking_drafts(graph_model, undrafted[0]) == (undrafted[0], 2)



def test_replayed_one_row_rounds_scan_every_lane_in_one_launch(graph_model, eager, monkeypatch):
    """Streams whose DeltaNet states and conv tails are views of one lane pool (an engine's lanes) replay their
    one-row rounds with one conv and one scan launch a layer for all of them, and give the eager rounds' bits;
    control: two streams' lane indices swapped (each window reads, and writes, the other's) differ."""
    graphs = DecodeGraphs(graph_model.net, lanes=len(PROMPTS))
    counted = []
    for name in ("causal_conv_lanes", "deltanet_scan_lanes"):
        op = getattr(graph_model.backend, name)
        monkeypatch.setattr(graph_model.backend, name, lambda *args, op=op, name=name: (counted.append(name),
                                                                                        op(*args))[1])
    assert decode(graph_model, 2, graphs, graphs.pool) == eager
    assert set(counted) == {"causal_conv_lanes", "deltanet_scan_lanes"}
    swapped = DecodeGraphs(graph_model.net, lanes=len(PROMPTS))
    assert decode(graph_model, 2, swapped, swapped.pool, swap_lanes=True) != eager
