"""The block drafter's proposals and extends replayed from CUDA graphs (tensorfold/drafters/replay.py) compute the
eager path's bits.

Under --gpu the graphs are real, on the embedded model with its shipped drafter. Without it the `cuda` backend runs
in numba's CUDA simulator with a micro target and a random two-layer drafter, where a graph is the recorded list of
launches, each argument fixed when recorded: a replay that read a key count or a context length baked into its
recording gives different bits there, as it would on a GPU. The planted controls show each.
"""
import dataclasses

import numpy as np
import pytest

import tensorfold
from tensorfold.api import Model
from tensorfold.backends import make_backend
from tensorfold.drafters import block, replay
from tensorfold.drafters.block import BlockDrafter, DFlashModel, load_dflash
from tensorfold.drafters.dflash_checkpoint import DFlashConfig, expected_shapes, load_dflash_weights
from tensorfold.drafters.replay import DraftGraphs
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.checkpoint import Linear, load_weights
from tensorfold.model.tiny import TINY_CONFIG, random_tensors
from tensorfold.model.writer import write_checkpoint

L, F = "linear_attention", "full_attention"
# The simulator's time goes to attention's blocks (one per row and head, of 128 threads each): one head everywhere.
MICRO = dataclasses.replace(  # the smallest target with both mixers, and a vocabulary the lm_head walks quickly
    TINY_CONFIG, vocab_size=48, hidden_size=16, intermediate_size=16, num_hidden_layers=2, layer_types=(L, F),
    num_attention_heads=1, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=4, linear_value_head_dim=4, tie_word_embeddings=True, eos_token_ids=(0,))
MICRO_DRAFT = DFlashConfig(  # one layer of one head, two taps, blocks of up to 3 rows
    hidden_size=16, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=8,
    intermediate_size=16, vocab_size=48, num_target_layers=2, target_layer_ids=(0, 1), mask_token_id=47,
    block_size=3, rms_norm_eps=1e-6, rope_theta=1e6)


def random_drafter(config: DFlashConfig, target, seed: int = 0) -> DFlashModel:
    """A drafter of float32 random weights (norm multipliers near 1) for `target`."""
    rng = np.random.default_rng(seed)
    weights = {name: (1 + rng.normal(0, 0.3, shape)).astype(np.float32) if len(shape) == 1 else
               Linear("f32", *shape, rng.normal(0, 1 / np.sqrt(shape[1]), shape).astype(np.float32))
               for name, shape in expected_shapes(config).items()}
    return DFlashModel(config, weights, target)


@pytest.fixture(scope="module")
def target(request, on_gpu, tmp_path_factory):
    """The embedded model on the GPU; in the simulator the micro target."""
    if on_gpu:
        from tensorfold.models import DEFAULT_MODEL
        return tensorfold.load(DEFAULT_MODEL, backend="cuda")
    request.getfixturevalue("simulated_module")
    folder = tmp_path_factory.mktemp("micro")
    write_checkpoint(folder, MICRO, random_tensors(MICRO, 0))
    return Model(str(folder), MICRO, load_weights(str(folder), MICRO), None, make_backend("cuda"))


@pytest.fixture(scope="module")
def drafter_model(target, on_gpu):
    """The embedded model's shipped drafter on the GPU; in the simulator a random one for the micro target."""
    if on_gpu:
        yield load_dflash(f"{target.path}/drafter", target)
        return
    from tensorfold.cuda import topk
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(topk, "THREADS", 8)  # narrow blocks keep the simulator quick (the twin reads the same constant)
        yield random_drafter(MICRO_DRAFT, target)


# Each round: a block of `rows` rows (k of each row's top ids), then the first `kept` of `rows` rows observed (a
# window's features passed whole), after two rows observed
# first. With HEADROOM a block's rows + 2 (the context's first buffers), round 0 replays the first extend's
# recording over a longer context and round 1 round 0's proposal; round 1's extend outgrows the buffers (a new
# recording), and the context is saved and restored (as by the prompt cache: new buffers, grown again, new
# recordings) before round 2.
ROUNDS = ((2, 1, 1), (2, 1, 2), (3, 2, 1))
RESTORED_BEFORE = 2


def draft_rounds(model, graphs: bool, rounds: int = len(ROUNDS)) -> list:
    """Two committed rows, then the first `rounds` of ROUNDS; per round the proposal's ids and log-probabilities
    bytes and, after its observe, the committed keys and values bytes of every layer."""
    drafter, rng, ops = BlockDrafter(model, graphs=graphs), np.random.default_rng(3), model.ops
    hidden = model.config.hidden_size

    def features(rows):
        return [ops.upload(rng.normal(size=(rows, hidden)).astype(np.float32)) for _ in drafter.taps]
    state = drafter.new_stream()
    drafter.observe(state, features(2), position=0)
    seen, sizes = [], []  # the keys' buffer rows at each round's proposal, and after its observe
    for n, (rows, k, kept) in enumerate(ROUNDS[:rounds]):
        if n == RESTORED_BEFORE:
            state = drafter.restore(drafter.save(state))
        tokens = [int(t) for t in rng.integers(0, model.config.mask_token_id, state.next_position + 1)]
        ids, logprobs = drafter.block_topk(tokens, rows - 1, k, state)
        proposed_over = state.keys[0].shape[0]
        drafter.observe(state, features(rows), position=state.next_position, kept=range(kept))  # a window's, whole
        sizes.append((proposed_over, state.keys[0].shape[0]))
        committed = b"".join(ops.to_host(b)[:state.length].tobytes() for b in state.buffers())
        seen.append((ids.tobytes() + logprobs.tobytes(), committed))
    if graphs and rounds == len(ROUNDS):  # (an eager extend reserves its own rows only, not a block's)
        assert sizes[0][0] == sizes[0][1] == sizes[1][0] < sizes[1][1]  # kept into round 1, grown by its extend
        assert drafter.graphs.replayed == 2 * len(ROUNDS) + 1 > drafter.graphs.recorded  # every one replayed
    return seen


@pytest.fixture
def small_headroom(monkeypatch, drafter_model):
    monkeypatch.setattr(block, "HEADROOM", drafter_model.config.block_size + 2)


@pytest.fixture(scope="module")
def eager(drafter_model):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(block, "HEADROOM", drafter_model.config.block_size + 2)
        return draft_rounds(drafter_model, graphs=False)


def frozen(monkeypatch, rows: int, row: int) -> None:
    """Plant a replay that writes row `row` of its recording's first table again and again, in tables of `rows`
    rows (4: a proposal's, 2: an extend's): as a value passed from the host at recording time would be."""
    replay, first = DraftGraphs._replay, {}

    def stale(self, recorded, table):
        if len(table) == rows:
            table[row] = first.setdefault(id(recorded), table[row].copy())
        replay(self, recorded, table)
    monkeypatch.setattr(DraftGraphs, "_replay", stale)


def test_replayed_proposals_equal_eager_proposals(drafter_model, eager, small_headroom):
    """Proposals (ids and log-probabilities bytes) and the committed context after each observe, over a growing
    context, a grown buffer and a restored one."""
    assert draft_rounds(drafter_model, graphs=True) == eager


def test_control_a_key_count_frozen_at_recording_is_caught(drafter_model, eager, small_headroom, monkeypatch):
    """Control: a proposal whose key counts (block_table's row 2) stay those of its recording: round 1, which
    replays round 0's recording over a longer context, proposes from too few keys."""
    frozen(monkeypatch, 4, 2)
    got = draft_rounds(drafter_model, graphs=True, rounds=2)
    assert got[0] == eager[0] and got[1][0] != eager[1][0]


def test_control_a_context_written_at_the_recorded_length_is_caught(drafter_model, eager, small_headroom,
                                                                     monkeypatch):
    """Control: an extend that writes its rows at the cache rows of its recording (extend_table's row 1: the
    context's length then): round 0's extend, which replays the first extend's recording, overwrites its rows."""
    frozen(monkeypatch, 2, 1)
    (got,) = draft_rounds(drafter_model, graphs=True, rounds=1)
    assert got[0] == eager[0][0] and got[1] != eager[0][1]


TREE_PATH = [0, 2]  # a tree's path through a window: the root, then a child that is not the window's next row


def tree_path_context(model, graphs: bool, gathered: bool = False) -> bytes:
    """Two rows observed, then a window of a block's rows of which TREE_PATH is kept: the committed keys and values
    bytes. `gathered`: the path's rows given alone, in order (as an eager extend of them would take them), not the
    window's arrays with the path."""
    drafter, rng, ops = BlockDrafter(model, graphs=graphs), np.random.default_rng(5), model.ops
    hidden = model.config.hidden_size
    first = [rng.normal(size=(2, hidden)).astype(np.float32) for _ in drafter.taps]
    window = [rng.normal(size=(model.config.block_size, hidden)).astype(np.float32) for _ in drafter.taps]
    state = drafter.new_stream()
    drafter.observe(state, [ops.upload(f) for f in first], position=0)
    if gathered:
        drafter.observe(state, [ops.upload(f[TREE_PATH]) for f in window], position=2)
    else:
        drafter.observe(state, [ops.upload(f) for f in window], position=2, kept=TREE_PATH)
    assert state.length == 2 + len(TREE_PATH)
    return b"".join(ops.to_host(b)[:state.length].tobytes() for b in state.buffers())


@pytest.fixture(scope="module")
def path_alone(drafter_model):
    return tree_path_context(drafter_model, graphs=False, gathered=True)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_tree_path_kept_from_its_window_commits_its_rows_bits(drafter_model, path_alone, graphs):
    """A tree's path kept from the window's whole arrays (the extend's table sends the path's rows to the context's
    end, the others past it) commits what an extend of the path's rows alone commits, replayed and eager."""
    assert tree_path_context(drafter_model, graphs) == path_alone


@pytest.mark.parametrize("graphs", [True, False])
def test_control_a_path_taken_as_a_chains_first_rows_is_caught(drafter_model, path_alone, graphs, monkeypatch):
    """Control: an extend table that commits the window's first rows, as for a chain, whatever the path: row 1 is
    committed where the path kept row 2."""
    table = replay.extend_table
    first_rows = lambda length, position, kept, given: table(length, position, range(len(kept)), given)  # noqa: E731
    monkeypatch.setattr(replay, "extend_table", first_rows)
    monkeypatch.setattr(block, "extend_table", first_rows)
    assert tree_path_context(drafter_model, graphs) != path_alone


# --- the engine -------------------------------------------------------------------------------------------------------

PROMPT = [5, 17, 29]


def logging_engine(target, model: DFlashModel, graphs: bool, max_draft: int = 1) -> tuple:
    """(an engine drafting chains of up to `max_draft` guesses with the block drafter, graphs on or off (the target's
    and the drafter's), its drafter, the list to which each proposal's ids and log-probabilities bytes are
    appended)."""
    drafter, proposals = BlockDrafter(model, "chain", graphs=graphs), []
    block_topk = drafter.block_topk

    def logged(*args):
        ids, logprobs = block_topk(*args)
        proposals.append(ids.tobytes() + logprobs.tobytes())
        return ids, logprobs
    drafter.block_topk = logged
    engine = Engine(target, parallel=1, chunk=8, context=32, drafter=drafter, max_draft=max_draft, graphs=graphs)
    return engine, drafter, proposals


def engine_drafts(target, model: DFlashModel, graphs: bool, proposals_wanted: int | None = None) -> tuple:
    """The prompt through a `logging_engine` until it ends or has proposed `proposals_wanted` times: (the output,
    each proposal's bytes, in order). At least two rounds draft, accepted or not; the second replays the first's
    proposal over a longer context."""
    engine, drafter, proposals = logging_engine(target, model, graphs)
    request = engine.submit(PROMPT, SamplingParams(max_tokens=5, stop_ids=()))
    while request.finish_reason is None and len(proposals) != proposals_wanted:
        engine.run_round()
    if graphs:
        assert engine.graphs.replayed > 0 and drafter.graphs.replayed > drafter.graphs.recorded
    return request.output, proposals


@pytest.fixture(scope="module")
def eager_engine(target, drafter_model):
    output, proposals = engine_drafts(target, drafter_model, graphs=False)
    assert len(proposals) >= 2
    return output, proposals


def test_engine_graphs_on_equals_off_with_the_block_drafter(target, drafter_model, eager_engine):
    """The same tokens and the same proposals' bits with the target's rounds and the drafter's proposals and
    extends replayed as with everything eager."""
    assert engine_drafts(target, drafter_model, graphs=True) == eager_engine


def test_control_engine_proposals_with_a_frozen_key_count_are_caught(target, drafter_model, eager_engine,
                                                                      monkeypatch):
    """Control: the same engine run to its second proposal, the proposals' key counts frozen at recording: the
    tokens stay the eager ones (a drafter only guesses), the second proposal's bits do not."""
    frozen(monkeypatch, 4, 2)
    output, proposals = engine_drafts(target, drafter_model, graphs=True, proposals_wanted=2)
    assert output == eager_engine[0][:len(output)]
    assert proposals[0] == eager_engine[1][0] and proposals[1] != eager_engine[1][1]


def lane_drafts(target, model: DFlashModel) -> tuple:
    """PROMPT through a `logging_engine` (graphs on) whose one lane served another request first: (the output, each
    proposal's bytes, in order, the drafter's recordings made for it)."""
    engine, drafter, proposals = logging_engine(target, model, graphs=True)
    for prompt, tokens in ((PROMPT[::-1] + [11], 3), (PROMPT, 5)):
        proposals.clear()
        recorded = drafter.graphs.recorded
        request = engine.submit(prompt, SamplingParams(max_tokens=tokens, stop_ids=()))
        while request.finish_reason is None:
            engine.run_round()
    return request.output, proposals, drafter.graphs.recorded - recorded


def test_a_lanes_next_request_drafts_on_the_lanes_drafter_context(target, drafter_model, eager_engine):
    """The lane's drafter context, emptied in place for its next request (`BlockDrafter.reset`), gives that request
    the proposals a fresh eager engine's gives, and its proposals and extends replay the recordings made for the
    request before (none recorded anew)."""
    output, proposals, recorded = lane_drafts(target, drafter_model)
    assert (output, proposals) == eager_engine and recorded == 0


def test_control_a_lane_whose_drafter_context_keeps_the_last_request_is_caught(target, drafter_model, eager_engine,
                                                                              monkeypatch):
    """Control: a reset that leaves the last request's context rows: the next request's proposals are not a fresh
    engine's (its first extend, at a position before the stale context's end, is refused and ends it)."""
    monkeypatch.setattr(BlockDrafter, "reset", lambda self, state: state)
    assert lane_drafts(target, drafter_model)[:2] != eager_engine


@pytest.fixture(scope="module")
def three_row_drafter(target, drafter_model, on_gpu):
    """A drafter whose block is 3 rows: the simulator's random one, or on the GPU the shipped drafter's weights
    drafting blocks of 3 (its own block, 16 rows, is as long as a window can be)."""
    if not on_gpu:
        return drafter_model
    config = dataclasses.replace(drafter_model.config, block_size=3)
    return DFlashModel(config, load_dflash_weights(f"{target.path}/drafter", config), target)


@pytest.mark.parametrize("bounded", [True, False])
def test_a_replayed_window_holds_the_drafters_block_not_max_draft(target, three_row_drafter, bounded, monkeypatch):
    """A block drafter fills at most its block (`window_rows`: 3 rows here), so with max_draft 5 its replayed windows
    are padded to 3 rows, not 6: padding rows cost a round as much as real ones. Control: a drafter with no bound of
    its own gets windows of 1 + max_draft rows."""
    if not bounded:
        monkeypatch.setattr(BlockDrafter, "window_rows", None)
    engine, _, proposals = logging_engine(target, three_row_drafter, graphs=True, max_draft=5)
    request = engine.submit(PROMPT, SamplingParams(max_tokens=3, stop_ids=()))
    while request.finish_reason is None and not proposals:
        engine.run_round()
    drafted = {rows for key in engine.graphs.recordings for rows, _ in key[1]} - {1}  # (a one-row round's: 1)
    assert drafted == ({3} if bounded else {6})


@pytest.mark.parametrize("fits", [True, False])
def test_every_lanes_recordings_fit_beside_the_others(target, drafter_model, fits, monkeypatch):
    """Two lanes draft in the same rounds with room for one context's recordings at first: each new context grows
    the room (`DraftGraphs.fit`), so after each lane's first proposal and extend nothing is recorded again. Control:
    without the growth, least-recently-used drops each lane's recordings just before its next use, and every
    proposal and extend records anew."""
    if not fits:
        monkeypatch.setattr("tensorfold.drafters.replay.RECORDINGS_A_CONTEXT", 0)
    drafter = BlockDrafter(drafter_model, "chain", graphs=True)
    drafter.graphs.capacity = 2  # one context's proposal and extend
    engine = Engine(target, parallel=2, chunk=8, context=32, drafter=drafter, max_draft=1, graphs=True)
    # 8 tokens: a drafted round gives at most 2, so each lane drafts 4 rounds however well its drafter guesses
    requests = [engine.submit(prompt, SamplingParams(max_tokens=8, stop_ids=())) for prompt in (PROMPT, PROMPT[::-1])]
    while any(r.finish_reason is None for r in requests):
        engine.run_round()
    drafted = sum(r.stats.draft_rounds for r in requests)
    assert drafted >= 8
    assert (drafter.graphs.recorded == 4) if fits else (drafter.graphs.recorded >= drafted), (drafter.graphs.recorded,
                                                                                                drafted)
