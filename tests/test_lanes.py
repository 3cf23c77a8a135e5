"""Lane rounds and the exactness contract: a window's rows equal one-row steps, drafted equals undrafted,
concurrent equals solo. Each property has a planted control that breaks it.

The model is the session's lanes_model (conftest.py): the tiny checkpoint on the twins, or under --gpu Qwen3.5-0.8B's
shapes on the GPU, whose arrays are device arrays: every comparison copies them to the host first."""
import dataclasses
import hashlib

import numpy as np
import pytest

import tensorfold
from tensorfold.drafters import Drafter, NgramDrafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.errors import TensorfoldError
from tensorfold.model.cache import KeepPolicy
from tensorfold.model.rows import Window
from tensorfold.models import DEFAULT_MODEL
from tensorfold.prompt_cache import Snapshot


def sha(ids):
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


@pytest.fixture(scope="module")
def model(lanes_model):
    return lanes_model


@pytest.fixture(scope="module")
def shakespeare(lanes_backend):
    return tensorfold.load(DEFAULT_MODEL, backend=lanes_backend)


def host(model, logits) -> np.ndarray:
    return model.backend.to_host(logits)


def one_row_steps(model, ids, state=None):
    """The logits of `ids` fed one row at a time to `state` (a fresh stream if None), and the stream after them."""
    state = model.net.new_state() if state is None else state
    return np.concatenate([host(model, model.net.forward([t], state)) for t in ids]), state


def first_two_rows_swapped(ops, log):
    """A scan log (decay, delta, key) with its rows 0 and 1 swapped, on either backend."""
    return tuple(ops.concat_rows([part[1:2], part[:1], part[2:]]) for part in log)


# --- windows --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 2, 7, 16])
def test_window_rows_equal_one_row_steps_beside_a_long_stream(model, rows):
    """A chain window that crosses the 128-key chunk boundary, in the same round as a 300-row prompt chunk."""
    rng = np.random.default_rng(rows)
    ids = list(rng.integers(0, 500, 120 + rows))
    other = list(rng.integers(0, 500, 300))
    expected, _ = one_row_steps(model, ids)
    mine, theirs = model.net.new_state(), model.net.new_state()
    model.net.forward(ids[:120], mine)
    model.net.forward(other[:100], theirs)
    got, _ = model.net.forward_round([Window(mine, ids[120:]), Window(theirs, other[100:])])
    assert host(model, got).tobytes() == expected[120:].tobytes()


@pytest.mark.parametrize("late", [False, True])
def test_partial_keep_equals_a_stream_that_saw_only_the_kept_rows(model, late):
    rng = np.random.default_rng(0)
    ids = list(rng.integers(0, 500, 40))
    drafted = list(rng.integers(0, 500, 9))
    expected, _ = one_row_steps(model, ids + drafted[:4] + [7, 8])

    def keep_four(plant=None):
        state = model.net.new_state(policy=KeepPolicy(late=late))
        model.net.forward(ids, state)
        model.net.forward_round([Window(state, drafted)])
        if plant:
            for record in state.records.values():
                record.log = plant(record.log)
        state.keep(4)  # the first four drafted rows were accepted
        assert state.pending_rows == (4 if late else 0)
        return np.concatenate([host(model, model.net.forward([t], state)) for t in (7, 8)])

    assert keep_four().tobytes() == expected[-2:].tobytes()
    # Control: the kept rows replayed in the wrong order (rows 0 and 1 of the scan's log swapped) must differ.
    assert keep_four(lambda log: first_two_rows_swapped(model.backend, log)).tobytes() != expected[-2:].tobytes()


def test_control_positions_relative_to_the_window_are_caught(model, monkeypatch):
    """Control: RoPE positions counted from the window start instead of the stream's length."""
    ids = list(np.random.default_rng(1).integers(0, 500, 24))
    expected, _ = one_row_steps(model, ids)
    monkeypatch.setattr(Window, "positions", property(lambda w: np.arange(len(w.ids)) + w.state.length // 2))
    state = model.net.new_state()
    model.net.forward(ids[:16], state)
    assert host(model, model.net.forward(ids[16:], state)).tobytes() != expected[16:].tobytes()


# --- the engine -----------------------------------------------------------------------------------------------

def run(model, prompts, params, parallel=4, drafter=None, chunk=128):
    engine = Engine(model, parallel=parallel, drafter=drafter, chunk=chunk)
    requests = [engine.submit(p, params) for p in prompts]
    while engine.run_round():
        pass
    return requests


class OracleDrafter(Drafter):
    """Proposes each stream's known continuation with every `wrong_every`-th guess wrong: drafts of every length
    get accepted in full, in part and not at all, so every kind of keep runs."""

    def __init__(self, prompts, outputs, wrong_every=5):
        self.known = {tuple(p): o for p, o in zip(prompts, outputs)}
        self.wrong_every = wrong_every

    def propose(self, tokens, max_rows, state=None):
        for prompt, output in self.known.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                guess = list(output[done:done + max_rows])
                return [t if (done + i) % self.wrong_every else (t + 1) % 500 for i, t in enumerate(guess)]
        return []


PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo", "KING HENRY:\nOnce more unto the breach, dear friends",
           "HAMLET:\nTo be, or not to be"]


@pytest.fixture(scope="module")
def solo_outputs(model):
    """Outputs of prompts generated alone without drafts, computed once per (prompts, tokens, sampling)."""
    done = {}

    def outputs(prompts, tokens, sampling):
        key = (tuple(map(tuple, prompts)), tokens, tuple(sorted(sampling.items())))
        if key not in done:
            done[key] = [model.generate(p, tokens, stop_ids=(), **sampling) for p in prompts]
        return done[key]
    return outputs


@pytest.mark.parametrize("parallel", [1, 4, 16])  # one test per lane count: on a GPU they run side by side
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_p=0.95, seed=11)])
def test_drafted_equals_undrafted_and_concurrent_equals_solo(model, solo_outputs, sampling, parallel):
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=40, stop_ids=(), **sampling)
    solo = solo_outputs(prompts, 40, sampling)
    oracle = OracleDrafter(prompts, solo)
    for drafter in (Drafter(), NgramDrafter(), oracle):
        requests = run(model, prompts * (4 if parallel == 16 else 1), params, parallel=parallel, drafter=drafter)
        assert [sha(r.output) for r in requests] == [sha(o) for o in solo] * (4 if parallel == 16 else 1), \
            (parallel, drafter.name)
        if drafter is oracle:
            assert all(0 < r.stats.accepted < r.stats.drafted for r in requests)  # full, partial and no keeps


@pytest.mark.parametrize("control", [False, True])
def test_prompts_arriving_together_share_a_rounds_prompt_rows(model, monkeypatch, control):
    """Prompts of 45, 9 and 30 tokens arrive together at an engine of 16 prompt rows a round: no round feeds more
    than 16 prompt rows, the 9-token prompt (the fewest rows left) goes first and has its first token after one
    round, and every output equals its solo run. Control: every stream in its prompt taking up to 16 rows a round
    (the rule before) feeds 16 + 9 + 16 rows in the first round."""
    if control:
        def a_chunk_each(streams, chunk):
            for stream in streams:
                stream.prompt_rows = min(chunk, len(stream.request.prompt) - stream.prompt_fed)
            return streams
        monkeypatch.setattr("tensorfold.engine.prompt_turns", a_chunk_each)
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(0, 500, n)) for n in (45, 9, 30)]
    params = SamplingParams(max_tokens=6, temperature=0.9, seed=3, stop_ids=())
    solo = [run(model, [prompt], params, parallel=1, chunk=16)[0].output for prompt in prompts]
    engine = Engine(model, parallel=3, chunk=16)
    requests = [engine.submit(prompt, params) for prompt in prompts]
    fed, short_outputs = [], []  # each round's prompt rows; the 9-token prompt's tokens after each round
    while True:
        before = {id(stream): stream.prompt_fed for stream in engine.active}
        if not engine.run_round():
            break
        fed.append(sum(stream.prompt_fed - before.get(id(stream), 0) for stream in engine.active))
        short_outputs.append(len(requests[1].output))
    assert [r.output for r in requests] == solo
    assert (max(fed) == 41) if control else (max(fed) == 16 and short_outputs[0] == 1), (fed, short_outputs)


def test_ngram_drafts_are_accepted_on_shakespeare(shakespeare):
    prompt = shakespeare.tokenizer.encode(PROMPTS[0])
    request = run(shakespeare, [prompt], SamplingParams(max_tokens=32), drafter=NgramDrafter())[0]
    assert request.output == shakespeare.generate(prompt, 32)
    assert request.stats.accepted > 8 and request.stats.rounds < 24  # the repeating text drafts itself


def test_control_a_drafter_whose_guesses_are_trusted_is_caught(shakespeare):
    """Control: accepting drafted tokens without comparing them to the model's own changes the output."""
    prompt = shakespeare.tokenizer.encode(PROMPTS[0])
    expected = sha(shakespeare.generate(prompt, 30))

    class Confident(Drafter):
        def propose(self, tokens, max_rows, state=None):
            return [tokens[-1]] * min(3, max_rows)

    engine = Engine(shakespeare, drafter=Confident())
    request = engine.submit(prompt, SamplingParams(max_tokens=30))
    real_after = engine._after

    def trusting_after(stream, window, logits):  # emits the drafts as if the model had agreed
        if window.logits_for == "all" and len(window.ids) > 1:
            for token in window.ids[1:]:
                if not engine._emit(stream, token):
                    return
            stream.state.keep(len(window.ids))
            stream.next_token = window.ids[-1]
            return
        real_after(stream, window, logits)

    engine._after = trusting_after
    while engine.run_round():
        pass
    assert sha(request.output) != expected


@pytest.mark.parametrize("chunk", [16, 31, 128])
def test_prompt_chunk_size_does_not_change_the_output(model, chunk):
    prompt = model.tokenizer.encode("ROMEO:\nBut, soft! what light through yonder window breaks?\n" * 4)
    expected = sha(model.generate(prompt, 10))
    assert sha(run(model, [prompt], SamplingParams(max_tokens=10), chunk=chunk)[0].output) == expected


def test_refusals_and_cancel(model):
    engine = Engine(model, parallel=2, context=64)
    with pytest.raises(TensorfoldError, match="maximum context length is 64 tokens"):
        engine.submit([5] * 60, SamplingParams(max_tokens=10))
    with pytest.raises(TensorfoldError, match="maximum context length"):  # refused before its ids are read
        engine.submit(["x"] * 10**6, SamplingParams(max_tokens=10))
    with pytest.raises(TensorfoldError, match="token ids must be integers"):  # the control: a prompt that fits
        engine.submit(["x"] * 10, SamplingParams(max_tokens=10))
    with pytest.raises(TensorfoldError, match="top_p must be in"):
        engine.submit([5], SamplingParams(top_p=0))
    a = engine.submit([5, 6], SamplingParams(max_tokens=50, stop_ids=()))
    b = engine.submit([5, 6], SamplingParams(max_tokens=5, stop_ids=()))
    engine.run_round()
    a.cancel()
    engine.run_round()
    assert a.finish_reason == "cancelled" and len(engine.active) == 1
    while engine.run_round():
        pass
    assert b.finish_reason == "length" and len(b.output) == 5


def test_engine_thread(model):
    engine = Engine(model, parallel=2, drafter=NgramDrafter())
    engine.start()
    try:
        requests = [engine.submit(model.tokenizer.encode(p), SamplingParams(max_tokens=8)) for p in PROMPTS]
        outputs = [r.result() for r in requests]
    finally:
        engine.stop()
    assert outputs == [model.generate(model.tokenizer.encode(p), 8) for p in PROMPTS]


def test_penalties_change_repetitive_text_and_keep_drafting_exact(shakespeare):
    prompt = shakespeare.tokenizer.encode(PROMPTS[0])
    plain = run(shakespeare, [prompt], SamplingParams(max_tokens=24), drafter=NgramDrafter())[0]
    penalised = SamplingParams(max_tokens=24, presence_penalty=1.0, frequency_penalty=1.0)
    drafted = run(shakespeare, [prompt], penalised, drafter=NgramDrafter())[0]
    undrafted = run(shakespeare, [prompt], dataclasses.replace(penalised, draft=False))[0]
    assert drafted.output == undrafted.output != plain.output
    assert len(set(drafted.output)) > len(set(plain.output))  # the penalties break the loop


# --- the deferred keep ------------------------------------------------------------------------------------------

def run_schedule(model, policy, schedule, seed=0, plant=None):
    """Windows of (rows, kept) after a 20-token prompt; returns every window's logits, the pending counts after each
    keep, and the logits of two one-row steps at the end."""
    rng = np.random.default_rng(seed)
    state = model.net.new_state(policy=policy)
    model.net.forward(list(rng.integers(0, 500, 20)), state)
    logits, pending = [], []
    for rows, kept in schedule:
        window = list(rng.integers(0, 500, rows))
        logits.append(host(model, model.net.forward_round([Window(state, window)])[0]))
        state.keep(kept)
        pending.append(state.pending_rows)
        if plant and state.pending_rows >= 2:
            plant(state)
    steps = [host(model, model.net.forward([t], state)) for t in (5, 6)]
    return np.concatenate(logits + steps), pending


# pending rows after each keep, with threshold 8 and capacity 8:
#   1, 7, 8 (= capacity: still fits, then the threshold lands it: 0), 7, 9 would exceed: lands at once (0),
#   a 10-row path (longer than the capacity) lands at once (0), 1, a one-row window writes back (0)
SCHEDULE = [(2, 1), (7, 6), (2, 1), (8, 7), (3, 2), (10, 10), (2, 1), (1, 1)]
EXPECTED_PENDING = [1, 7, 0, 7, 0, 0, 1, 0]


@pytest.mark.parametrize("threshold, capacity", [(8, 8), (4, 8), (24, 48)])
def test_deferred_keep_equals_immediate_keep_at_the_buffer_edges(model, threshold, capacity):
    immediate, none_pending = run_schedule(model, KeepPolicy(late=False), SCHEDULE)
    late, pending = run_schedule(model, KeepPolicy(True, threshold, capacity), SCHEDULE)
    assert late.tobytes() == immediate.tobytes()
    assert set(none_pending) == {0}
    if (threshold, capacity) == (8, 8):
        assert pending == EXPECTED_PENDING
    assert max(pending) > 0  # rows really waited


def test_deferred_keep_controls(model):
    """Controls: a dropped pending row, and two swapped pending rows, each change the bits."""
    immediate, _ = run_schedule(model, KeepPolicy(late=False), SCHEDULE)

    def dropped(state):
        state.pending = {i: tuple(part[1:] for part in log) for i, log in state.pending.items()}
        state.pending_rows -= 1

    def swapped(state):
        state.pending = {i: first_two_rows_swapped(state.ops, log) for i, log in state.pending.items()}

    for plant in (dropped, swapped):
        late, _ = run_schedule(model, KeepPolicy(True, 8, 8), SCHEDULE, plant=plant)
        assert late.tobytes() != immediate.tobytes(), plant.__name__


def test_save_and_restore_with_rows_pending(model):
    """A snapshot lands the pending rows first; restoring it drops whatever the target had pending."""
    rng = np.random.default_rng(3)
    prompt, drafted = list(rng.integers(0, 500, 30)), list(rng.integers(0, 500, 6))
    state = model.net.new_state(policy=KeepPolicy(True, 24, 48))
    model.net.forward(prompt, state)
    model.net.forward_round([Window(state, drafted)])
    state.keep(5)
    assert state.pending_rows == 5
    snapshot = Snapshot(state)
    assert state.pending_rows == 0 and snapshot.length == 35
    other = model.net.new_state(policy=KeepPolicy(True, 24, 48))
    model.net.forward(prompt[:10], other)
    model.net.forward_round([Window(other, drafted)])
    other.keep(3)
    assert other.pending_rows == 3
    snapshot.restore(other)
    assert other.pending_rows == 0
    expected, _ = one_row_steps(model, prompt + drafted[:5] + [9])
    assert host(model, model.net.forward([9], other)).tobytes() == expected[-1:].tobytes()
    assert host(model, model.net.forward([9], state)).tobytes() == expected[-1:].tobytes()


@pytest.mark.parametrize("late", ["0", "1"])
def test_engine_keep_late_switch(model, late, monkeypatch):
    monkeypatch.setenv("TENSORFOLD_KEEP_LATE", late)
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    solo = [model.generate(p, 30, stop_ids=()) for p in prompts]
    engine = Engine(model, parallel=4, drafter=OracleDrafter(prompts, solo))
    assert engine.keep.late == (late == "1")
    requests = [engine.submit(p, SamplingParams(max_tokens=30, stop_ids=())) for p in prompts]
    while engine.run_round():
        pass
    assert [r.output for r in requests] == solo


# --- trees --------------------------------------------------------------------------------------------------------

TREE = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 16 rows, depth up to 5, siblings at every level


def tree_ids(rng, parents):
    return [int(t) for t in rng.integers(0, 500, len(parents))]


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("committed", [40, 124])  # 124 + depth crosses the 128-key chunk boundary
def test_tree_rows_equal_one_row_steps_along_their_ancestors(model, late, committed):
    rng = np.random.default_rng(committed)
    prompt, ids = [int(t) for t in rng.integers(0, 500, committed)], tree_ids(rng, TREE)
    other = [int(t) for t in rng.integers(0, 500, 200)]
    state, beside = model.net.new_state(policy=KeepPolicy(late=late)), model.net.new_state()
    model.net.forward(prompt, state)
    model.net.forward(other[:150], beside)
    window = Window(state, ids, parents=TREE)
    got = host(model, model.net.forward_round([window, Window(beside, other[150:])])[0])
    after_prompt = Snapshot(one_row_steps(model, prompt)[1])  # the prompt's one-row steps, run once

    def steps_after_prompt(tokens):
        """The one-row steps of `tokens` continuing the prompt's (from a copy of the stream they left)."""
        stream = model.net.new_state()
        after_prompt.restore(stream)
        return one_row_steps(model, tokens, stream)[0]

    expected = {}  # row -> the logits of the one-row step it stands for
    for leaf in (r for r in range(len(TREE)) if r not in TREE):  # every row lies on the path to a leaf
        path = window.ancestors(leaf)[::-1] + [leaf]
        expected.update(zip(path, steps_after_prompt([ids[a] for a in path])))
    for r in range(len(TREE)):
        assert got[r].tobytes() == expected[r].tobytes(), f"row {r}"
    # Keep the path to row 12 (0, 1, 3, 7, 11... 12's ancestors) and step on: equal to steps of the kept tokens.
    path = window.ancestors(12)[::-1] + [12]
    state.keep_path(path)
    assert state.length == committed + len(path)
    assert state.pending_rows == 0  # a branch, not the window's first rows, lands at once under either policy
    expected_step = steps_after_prompt([ids[r] for r in path] + [9])[-1:]
    assert host(model, model.net.forward([9], state)).tobytes() == expected_step.tobytes()


def test_keeping_a_tree_path_compacts_its_keys_and_values(model, monkeypatch):
    """A tree's rows are written at length + slot; keep_path moves the kept path's rows to length + depth, so that
    the committed keys and values equal those of one-row steps of the kept tokens, byte for byte. Control: a keep
    that leaves the rows where the window wrote them."""
    rng = np.random.default_rng(2)
    prompt, ids = [int(t) for t in rng.integers(0, 500, 30)], tree_ids(rng, TREE)
    path = [0, 2, 5, 9, 13]  # slots that are not depths from row 2 on
    _, stepped = one_row_steps(model, prompt + [ids[r] for r in path])

    def committed_cache():
        state = model.net.new_state()
        model.net.forward(prompt, state)
        model.net.forward_round([Window(state, ids, parents=TREE)])
        state.keep_path(path)
        assert state.length == stepped.length
        return [host(model, cache[i][:state.length]) for cache in (state.keys, state.values) for i in cache]

    expected = [host(model, cache[i][:stepped.length]) for cache in (stepped.keys, stepped.values) for i in cache]
    assert all(got.tobytes() == want.tobytes() for got, want in zip(committed_cache(), expected, strict=True))
    monkeypatch.setattr(model.backend, "kv_compact", lambda keys, values, committed, path: (keys, values))
    assert any(got.tobytes() != want.tobytes() for got, want in zip(committed_cache(), expected, strict=True))


def test_control_a_tree_read_as_a_chain_is_caught(model):
    """Control: rows that read their slot-order predecessors (the seeds' tree bug) instead of their ancestors."""
    rng = np.random.default_rng(1)
    prompt, ids = [int(t) for t in rng.integers(0, 500, 30)], tree_ids(rng, TREE)
    state = model.net.new_state()
    model.net.forward(prompt, state)
    as_chain = host(model, model.net.forward_round([Window(state, ids)])[0])
    path = [0, 2, 5, 9, 13]  # a path that is not a prefix of the slot order
    expected, _ = one_row_steps(model, prompt + [ids[a] for a in path])
    assert as_chain[13].tobytes() != expected[-1].tobytes()


class OracleTreeDrafter(OracleDrafter):
    """Trees whose branches hold the known continuation (with every fifth guess wrong) and a wrong sibling at each
    level: the walk must pick the right child among siblings."""

    def propose_tree(self, tokens, max_rows, state=None):
        chain = self.propose(tokens, max_rows // 2)
        ids, parents = [], []
        for depth, token in enumerate(chain):
            parent = -1 if depth == 0 else 2 * depth - 1  # under the previous level's guess
            ids += [(token + 7) % 500, token]  # a wrong sibling first, then the guess
            parents += [parent, parent]
        return ids, parents


@pytest.mark.parametrize("late", [True, False])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, seed=4)])
def test_tree_drafts_equal_undrafted_and_solo(model, solo_outputs, sampling, late):
    from tensorfold.drafters import NgramTreeDrafter
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    solo = solo_outputs(prompts, 30, sampling)
    for drafter in (OracleTreeDrafter(prompts, solo), NgramTreeDrafter()):
        engine = Engine(model, parallel=4, drafter=drafter, keep=KeepPolicy(late=late))
        requests = [engine.submit(p, SamplingParams(max_tokens=30, stop_ids=(), **sampling)) for p in prompts]
        while engine.run_round():
            pass
        assert [r.output for r in requests] == solo, drafter.name
        if isinstance(drafter, OracleTreeDrafter):
            assert all(r.stats.accepted > r.stats.rounds for r in requests)  # deep paths through the siblings


def test_ngram_tree_drafter_shares_prefixes():
    from tensorfold.drafters import NgramTreeDrafter
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3, 8, 6, 1, 2, 3]
    ids, parents = NgramTreeDrafter(branches=3).propose_tree(tokens, 8)
    assert ids[0] == 8 and parents[0] == -1  # the latest match's continuation comes first
    assert all(p < i for i, p in enumerate(parents)) and len(ids) <= 8
    assert ids.count(8) == 1  # "8 ..." continuations share their first node
