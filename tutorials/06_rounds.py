"""
Lane rounds, trees and the deferred keep
========================================

The engine does not run one stream at a time: each *round*, every active stream gives one *window* of rows (a
prompt chunk, a decode row, or a decode row followed by drafted tokens), and all the windows go through one
forward pass. Afterwards each stream keeps the rows it accepted. This tutorial builds one such round by hand on a
tiny random Qwen3.5, runs it with ``Qwen35.forward_round``, keeps part of a drafted chain, and then follows the
*deferred keep*, which lets the DeltaNet rows a stream kept wait for its next scan instead of being written into
its state at once.

You will learn about:

* which rows a round holds, at which positions, and which keys each row reads: the rows of all windows share the
  row-wise work, while the conv, the DeltaNet scan and attention read each stream's own cache;
* why a row gives the same bits in a round, beside another stream's window, as in a one-row step;
* ``StreamState.keep(n)``: a partial keep of a drafted chain, and how it equals a stream that only ever saw the
  kept rows;
* the deferred keep (``KeepPolicy``): what waits in the pending buffer, when it lands (a one-row window, a prompt
  chunk, the threshold, a path that does not fit, a snapshot), why no bit changes, and what it costs in memory;
* drafted trees: rows at length + depth that see only their ancestors, run in the same single launches as a chain
  through index maps, and ``keep_path``, which compacts the kept path's key/value rows.

Run it with ``python tutorials/06_rounds.py``; it runs on the NumPy backend, needs no GPU and no network, and takes
a few seconds.
"""

# %%
# A tiny random model
# -------------------
# ``make_tiny`` writes a random Qwen3.5 checkpoint with a small trained tokenizer: four layers (three Gated
# DeltaNet, one gated attention), hidden size 64. Its text is noise, but every code path of the forward pass runs,
# and a check on bits does not care whether the model is any good.
import atexit
import shutil
import sys
import tempfile

import numpy as np

import tensorfold
from tensorfold.model.cache import KeepPolicy, pending_row_bytes
from tensorfold.model.presets import preset
from tensorfold.model.rows import Window
from tensorfold.model.tiny import make_tiny
from tensorfold.prompt_cache import Snapshot

folder = tempfile.mkdtemp(prefix="tensorfold-tiny-")
atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the checkpoint is gone when the script ends
make_tiny(folder, seed=0)
model = tensorfold.load(folder, backend="numpy")
net, c = model.net, model.config
print(f"layers: {c.layer_types}")


def check(ok, message):
    """Stop the script with a non-zero exit code when a check fails."""
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")
    print(f"ok: {message}")


def same(a, b):
    """Byte equality of two arrays."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def one_row_steps(ids):
    """The reference: a fresh stream fed one token per forward. Returns every row's logits."""
    state = net.new_state()
    return np.concatenate([net.forward([t], state) for t in ids])


# %%
# Two streams before the round
# ----------------------------
# Stream A is in the middle of its prompt: 6 rows are committed, and its next prompt chunk has 4 rows. Stream B
# has run its 9-row prompt and sampled a token from the last row; its window is that *decode row* followed by
# three tokens a drafter guessed. We make the guesses by hand: the first is the token the model will pick
# (greedy), the other two are not, so that the verification below accepts one draft and rejects the rest.
prompt_a = model.tokenizer.encode("Now is the winter of our")
prompt_b = model.tokenizer.encode("To be, or not to be, that is")
check(len(prompt_a) >= 10 and len(prompt_b) >= 9, "the prompts are long enough")
prompt_a, prompt_b = prompt_a[:10], prompt_b[:9]

stream_a = net.new_state(policy=KeepPolicy(late=False))  # the immediate keep for now; the deferred one comes later
stream_b = net.new_state(policy=KeepPolicy(late=False))
net.forward(prompt_a[:6], stream_a)  # A's first prompt chunk, kept whole
decode_row = int(np.argmax(net.forward(prompt_b, stream_b)[-1]))  # B's prompt, then its first token

truth = one_row_steps(prompt_b + [decode_row])  # what the model will say after the decode row
draft_1 = int(np.argmax(truth[-1]))  # a good guess: the model's own next token
wrong = [(draft_1 + 1) % c.vocab_size, (draft_1 + 2) % c.vocab_size]  # two guesses that are not
chain_b = [decode_row, draft_1] + wrong
print(f"stream A: {stream_a.length} rows committed, prompt chunk {prompt_a[6:]}")
print(f"stream B: {stream_b.length} rows committed, drafted chain {chain_b} (decode row, then 3 drafts)")

# %%
# One round's rows
# ----------------
# The round stacks the windows' rows: A's four, then B's four. A window's positions start at its stream's
# committed length (``Window.positions``), not at the round's first row, so row 4 of the round is position 9 of
# stream B. Each row reads its own stream's keys up to its own position: the committed ones (``=``) and those of
# its window's earlier rows, written this round (``#``); never a later row's key, and never the other stream's.
windows = [Window(stream_a, prompt_a[6:], "last"), Window(stream_b, chain_b, "all")]
kinds = ["prompt chunk"] * 4 + ["decode row", "draft 1", "draft 2", "draft 3"]
width = {id(w.state): w.state.length + len(w.ids) for w in windows}


def key_map(win, position):
    """One stream's keys as one row at `position` sees them."""
    length = win.state.length
    return "".join("=" if k < length else "#" if k <= position else "." for k in range(width[id(win.state)]))


LINE = "{:>9}  {:^6}  {:<12}  {:>8}  {:>5}   {:<13}{:<13}"
print()
print(LINE.format("round row", "stream", "kind", "position", "token", "keys of A", "keys of B").rstrip())
print(LINE.format("", "", "", "", "", "0123456789", "0123456789012").rstrip())
row = 0
for name, win in zip("AB", windows):
    for position, token in zip(win.positions, win.ids):
        maps = [key_map(w, position) if w is win else "" for w in windows]
        print(LINE.format(row, name, kinds[row], position, token, *maps).rstrip())
        row += 1
print("""
The DeltaNet layers run one scan per window, each from its own stream's state:

    A: state after 6 rows -> row 0 -> row 1 -> row 2 -> row 3      (logits wanted: the last row only)
    B: state after 9 rows -> row 4 -> row 5 -> row 6 -> row 7      (logits wanted: every row, to verify drafts)

and the row-wise work (projections, norms, the MLP, the head) runs once over rows 0..7 together.
""")

# %%
# Run the round
# -------------
# ``forward_round`` returns each window's logits and commits nothing: it leaves both caches as they were, and
# records what each window would add (per DeltaNet layer the state before and after the window and the scan's
# log of each row's decay, delta and key; per attention layer the window's keys, past the committed length).
# Every op's arithmetic for one row is independent of the rows beside it, so every row must equal the same row
# computed by one-row steps, bit for bit: A's last row, and all four rows of B's chain.
logits_a, logits_b = net.forward_round(windows)
print(f"logits: A {logits_a.shape} (last row only), B {logits_b.shape}")
check(stream_a.length == 6 and stream_b.length == 9, "the forward committed nothing")
check(same(logits_a, one_row_steps(prompt_a)[-1:]), "A's last row == the same row in one-row steps, bit for bit")
check(same(logits_b, one_row_steps(prompt_b + chain_b)[-4:]),
      "B's four chain rows == the same rows in one-row steps, bit for bit")

# %%
# Verify the drafts and keep a prefix
# -----------------------------------
# Row r of B's chain has seen the decode row and the first r drafts, so its logits are the model's choice for the
# token after them. A draft is accepted while it equals that choice. Here round row 4 (the decode row) says
# ``draft_1``: accepted; round row 5 says something other than draft 2: rejected, and the model's token there
# becomes the next decode row. The stream keeps the rows whose inputs were right, the decode row and draft 1, and
# drops the rest. A's prompt chunk is kept whole.
picks = [int(t) for t in np.argmax(logits_b, axis=1)]
kept = 1
while kept < len(chain_b) and chain_b[kept] == picks[kept - 1]:
    kept += 1
next_row = picks[kept - 1]
print(f"model's picks after each chain row: {picks}; drafts {chain_b[1:]}: {kept - 1} accepted, keep {kept} rows, "
      f"next decode row {next_row}")
check(kept == 2, "the good guess is accepted and the first wrong one stops the chain")

stream_a.keep(4, write_back=True)  # a prompt chunk: all its rows
stream_b.keep(kept)  # the accepted prefix of the chain
check(stream_a.length == 10 and stream_b.length == 11, "A committed 10 rows, B 11")

# %%
# After a partial keep, B's DeltaNet states are the log of round rows 4 and 5 replayed into the state from before
# the window (``deltanet_apply``: each row's decay and write, exactly as the scan did them), its conv tails moved
# by two rows, and its key and value rows past position 10 are left for the next window to overwrite. So the
# stream is the stream that only ever saw the kept rows: its next one-row step gives the bits of one-row steps all
# the way.
step = net.forward([next_row], stream_b)
check(same(step, one_row_steps(prompt_b + chain_b[:kept] + [next_row])[-1:]),
      "after keeping 2 of 4 rows, B's next step == one-row steps of the kept tokens, bit for bit")
step = net.forward([7], stream_a)
check(same(step, one_row_steps(prompt_a + [7])[-1:]), "and A's next step too")

# %%
# The deferred keep
# -----------------
# Above, ``keep`` wrote B's DeltaNet states at once: a partial keep runs ``deltanet_apply``, which reads every
# state and writes it back (Qwen3.5-0.8B: 18 layers of 16 x 128 x 128 floats, 18 MiB per stream), and the next
# round's scan then reads the same states again. The deferred keep (``KeepPolicy(late=True)``, the engine's
# default) leaves the states alone: the kept rows' log entries (decay, delta and key per value head) wait in the
# stream's *pending buffer*, and the next scan starts from ``scan_start``, the stored state with the pending rows
# replayed first. The replay is the same ``deltanet_apply``, in the same row order, with the same fp32 steps, so
# every state it builds, and so every output, keeps its bits.
#
# The saving needs a scan kernel that replays the pending rows while it holds the state. That fused kernel does
# not exist yet: today ``scan_start`` runs the replay as its own ``deltanet_apply`` before ``deltanet_scan``, on
# the numpy and the cuda backend alike, so the work is moved rather than saved, and no GPU timing exists yet. On
# a GPU, a drafted round replayed from a CUDA graph does not defer at all: after the walk its recorded keep (the
# kernels ``deltanet_apply``, ``conv_tail_after`` and ``kv_compact``, reading each stream's kept path from device
# memory) applies the path in one replay, in place (``tensorfold/model/replay.py``).
print(KeepPolicy())

# %%
# What one pending row costs: per DeltaNet layer and value head, one decay, a delta of dv floats and a key of dk
# floats. The buffer is counted at its full ``capacity`` in the stream's memory.
for label, config in (("this tiny model", c), ("Qwen3.5-0.8B and 2B", preset("0.8B")), ("Qwen3.5-4B", preset("4B"))):
    one = pending_row_bytes(config)
    print(f"  {label:<20} {one / 1024:7.1f} KiB per pending row, {48 * one / 2**20:6.2f} MiB for 48 rows")
late = net.new_state(policy=KeepPolicy())
check(late.nbytes - net.new_state(policy=KeepPolicy(late=False)).nbytes == 48 * pending_row_bytes(c),
      "StreamState.nbytes counts the pending buffer at its capacity")

# %%
# Landing
# -------
# Pending rows are applied to the stored states (they *land*) when:
#
# * a one-row window is kept: its scan already produced the state after its row, with the pending rows replayed
#   at its start, so that state is stored and the buffer empties;
# * a prompt chunk is kept (``keep(n, write_back=True)``), in the same way;
# * the buffer reaches ``threshold`` rows (24): ``land()`` replays them into the states;
# * a kept path does not fit in the ``capacity`` left (48 rows), or is a tree's branch rather than the window's
#   first rows: the state is written at once, from the window's starting state, which already had the pending
#   rows replayed;
# * a snapshot is taken for the prompt cache: ``Snapshot`` lands the rows before it copies the state, and a
#   restore drops whatever the target stream had pending.
#
# Keeping no rows of a window leaves the buffer as it was. We run one schedule of windows twice, once with the
# deferred keep and once with the immediate one, on the same tokens, and compare every window's logits and every
# state a scan starts from. The 30-row window is longer than the engine's default (one decode row and up to 15
# drafts), so that a path too long for the capacity shows up.
SCHEDULE = [  # (rows in the window, rows kept, what happens to the pending rows)
    (16, 5, "5 wait"),
    (16, 0, "nothing kept: unchanged"),
    (16, 9, "9 more wait"),
    (1, 1, "one-row window: land"),
    (16, 16, "a whole drafted window waits too"),
    (12, 8, "24 = threshold: land"),
    (8, 6, "6 wait"),
    (16, 14, "20 wait"),
    (30, 30, "20 + 30 > 48: written at once"),
    (12, 3, "3 wait"),
    ("prompt", 6, "prompt chunk: land"),
    (4, 2, "2 wait"),
    ("snapshot", 0, "snapshot: land"),
    (16, 7, "7 wait"),
]
EXPECTED = [5, 5, 14, 0, 16, 0, 6, 20, 0, 3, 0, 2, 0, 7]

rng = np.random.default_rng(6)
prompt = [int(t) for t in rng.integers(0, c.vocab_size, 20)]
deferred, immediate = net.new_state(policy=KeepPolicy()), net.new_state(policy=KeepPolicy(late=False))
net.forward(prompt, deferred)
net.forward(prompt, immediate)
pending, all_logits, starts_checked = [], {"deferred": [], "immediate": []}, 0

print()
ROW = "{:>6}  {:>8}  {:>4}   {:<49} {:>2}  {}"
HEADER = "pending rows after the keep (| threshold 24, ] capacity 48)"
print(ROW.format("window", "rows", "kept", HEADER, "", "").rstrip())
for rows, n, what in SCHEDULE:
    if not all(same(deferred.scan_start(i), immediate.scan_start(i)) for i in deferred.recurrent):
        check(False, "the next scan starts from the same state under both policies")
    starts_checked += 1
    if rows == "snapshot":
        snapshots = Snapshot(deferred), Snapshot(immediate)  # what the prompt cache would store
    else:
        ids = [int(t) for t in rng.integers(0, c.vocab_size, n if rows == "prompt" else rows)]
        for name, state in (("deferred", deferred), ("immediate", immediate)):
            all_logits[name].append(net.forward_round([Window(state, ids, "all")])[0])
            state.keep(n, write_back=rows == "prompt")
    pending.append(deferred.pending_rows)
    bar = "".join("#" if k < deferred.pending_rows else "|" if k == 24 else "]" if k == 48 else " "
                  for k in range(49))
    print(ROW.format(len(pending), rows, n if rows != "snapshot" else "", bar, deferred.pending_rows, what))
    if immediate.pending_rows:
        check(False, "the immediate keep never leaves a row pending")

print()
check(starts_checked == len(SCHEDULE), "before every window, both policies' scans start from the same states")
check(pending == EXPECTED, f"pending rows after each keep: {pending}")
check(all(same(snapshots[0].recurrent[i], snapshots[1].recurrent[i]) for i in deferred.recurrent),
      "the snapshot landed the pending rows: it copied the immediate keep's states")
check(max(pending) > 0 and deferred.length == immediate.length, "rows really waited, and both streams kept as many")
check(same(np.concatenate(all_logits["deferred"]), np.concatenate(all_logits["immediate"])),
      "every window's logits, deferred keep == immediate keep, bit for bit")
ends = [np.concatenate([net.forward([5], s), net.forward([6], s)]) for s in (deferred, immediate)]
check(same(*ends), "two one-row steps after the last window (7 rows pending): the same bits")
deferred.land()
check(all(same(deferred.recurrent[i], immediate.recurrent[i]) for i in deferred.recurrent),
      "after land(), the stored states are the immediate keep's, bit for bit")

# %%
# The control: a replay that loses a row is red
# ---------------------------------------------
# A check that cannot fail proves nothing. We keep part of a drafted window under the deferred keep, then drop
# the first pending row from the buffer, the bug a wrong offset into it would cause: the next step must differ.
tokens = [int(t) for t in rng.integers(0, c.vocab_size, 30)]
planted = net.new_state(policy=KeepPolicy())
net.forward(tokens[:20], planted)
net.forward_round([Window(planted, tokens[20:30])])
planted.keep(4)
check(planted.pending_rows == 4, "4 kept rows wait in the buffer")
planted.pending = {i: tuple(part[1:] for part in log) for i, log in planted.pending.items()}
planted.pending_rows -= 1
bad = net.forward([9], planted)
check(not same(bad, one_row_steps(tokens[:24] + [9])[-1:]), "control: a dropped pending row changes the bits")

# %%
# A drafted tree
# --------------
# A drafter can also propose several continuations at once, as a tree: each row names its parent (-1 for the
# decode row at the root) and sits at the stream's length plus its depth. Siblings share a position and never see
# each other. Here the decode row has two children, and the first child two more:
#
#   row:     0 --+-- 1 --+-- 3          depth 0, 1, 2
#                |       +-- 4
#                +-- 2
#
# Row 4 must give the bits of one-row steps over (0, 1, 4): its conv window, its DeltaNet state and its keys are
# its ancestors', never rows 2 or 3, although those come first in row order.
#
# The whole tree still runs in one launch per kernel and layer, as a chain does: the window hands the kernels
# *index maps* (``tensorfold/numerics/paths.py``, built once a round as ``Window.maps``) that tell each row where its
# history is. ``path_slots[r]`` lists the slots of row r's ancestors, root first, then its own; ``conv_taps[r]``
# lists its conv window as rows of [the stream's conv tail (rows 0 .. 2); the window's inputs (3 + slot)]. A chain's
# maps are the identity, so chains and trees go through the same kernels:
#
# * attention: the window's keys are written at length + slot in one append; row r reads logical keys 0 .. length
#   + depth(r), key j < length in place and key length + d at length + path_slots[r, d]. The 128-key chunks are cut
#   at logical positions, so a tree row sums in the order of the one-row step it stands for;
# * the conv: row r's window is history[conv_taps[r]];
# * the DeltaNet scan: the threads of a state column walk the rows in slot order; a row whose parent is not the row
#   before it first rebuilds its parent's state, replaying the logged (decay, delta, key) rows of its path from the
#   window's start state, which gives the parent's state bit for bit (a chain never rebuilds).
tree_tokens = [int(t) for t in rng.integers(0, c.vocab_size, 5)]
parents = [-1, 0, 0, 1, 1]
rooted = net.new_state()
net.forward(tokens[:20], rooted)
window = Window(rooted, tree_tokens, parents=parents)
print(f"depths {window.depths}, positions {[int(p) for p in window.positions]}")
print("row  path_slots (its path)  conv_taps (its conv window)")
for r, (path, taps) in enumerate(zip(window.maps.path_slots, window.maps.conv_taps)):
    print(f"{r:>3}  {str(path[:window.depths[r] + 1].tolist()):<21}  {taps.tolist()}")
tree_logits = net.forward_round([window])[0]
for r in range(len(parents)):
    path = window.ancestors(r)[::-1] + [r]
    check(same(tree_logits[r:r + 1], one_row_steps(tokens[:20] + [tree_tokens[a] for a in path])[-1:]),
          f"tree row {r} == one-row steps along {path}, bit for bit")

# %%
# Keeping a path
# --------------
# Verification walks from the root to the child whose token the model picked at each row; say it accepted row 1,
# then row 4. ``keep_path([0, 1, 4])`` replays the path's logged DeltaNet rows (a path that is not the window's
# first rows lands at once, even under the deferred keep: its rows would have to be gathered one by one into the
# pending buffer), moves the conv tail along the path (its last 3 inputs), and compacts the attention
# cache: the path's key and value rows move from length + slot to length + depth, in increasing depth. That order
# is safe in place because slots rise along a path and slot >= depth: each move reads a row no earlier move wrote.
#
#   cache row         L    L+1  L+2  L+3  L+4      (L = 20, the stream's length)
#   after forward     r0   r1   r2   r3   r4       every window row at L + slot
#   after keep_path   r0   r1   r4 | r3   r4       the path at L + depth; length L + 3, the rest is stale
layer = next(iter(rooted.keys))
written = rooted.keys[layer][20:25].copy()
rooted.keep_path([0, 1, 4])  # the walk accepted row 1, then row 4
check(rooted.length == 23, "keeping a path commits its rows at length + depth")
check(same(rooted.keys[layer][20:23], written[[0, 1, 4]]), "the path's keys moved to L + depth: rows 0, 1, 4")
check(same(net.forward([9], rooted), one_row_steps(tokens[:20] + [tree_tokens[0], tree_tokens[1],
                                                                  tree_tokens[4], 9])[-1:]),
      "after keeping the path, the next step equals one-row steps of the kept tokens")
print("all checks passed")
