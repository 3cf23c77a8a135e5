"""
Sampling without sorting: counter-based draws and searched thresholds
=====================================================================

The last step of every decode round turns a row of logits into one token id: the argmax at temperature 0, else
a seeded draw after the temperature, top-k, top-p and min-p filters. The textbook way sorts the vocabulary
(248,320 logits for Qwen3.5); a GPU block does not sort well, so ``tensorfold/cuda/sampling.py`` finds each
filter's threshold by a search over float bit patterns, where every step is a block-wide count or sum in a fixed
order, and then walks the kept tokens in token-id order.

You will learn about:

* counter-based random numbers: why the draw for output position n is a hash of (seed, n) and nothing else;
* ``order_key``: float32 values as 32-bit integers that sort like the floats;
* the filter pipeline, threshold by threshold, and how a 16-way search fixes 4 bits of a threshold per step;
* the draw as a walk over the ids in order, split between the threads of one block;
* the twin and the kernel side by side, and bit-equality under numba's CUDA simulator.

Run it with ``python tutorials/05_sampling.py`` (no GPU needed: it uses the simulator unless one is present).
"""

# %%
# The simulator must be chosen before numba.cuda is first imported. `show` prints a twin (left) beside its kernel
# (right), the lines that do the same work on the same row (tutorials/_side_by_side.py).
import inspect
import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from _side_by_side import show  # noqa: E402
from tensorfold.cuda import argmax, sampling  # noqa: E402


def check(ok, message):
    if not ok:
        sys.exit(f"CHECK FAILED: {message}")
    print(f"ok: {message}")


# %%
# Counter-based draws
# -------------------
# A stateful generator (``rng.random()`` called once per token) makes token n depend on how many numbers were
# drawn before it: a speculative draft that is thrown away, a retried step or a different batch would shift every
# later draw. tensorfold hashes the pair (seed, output position) with SplitMix64 instead. The draw for position n
# is a pure function of (seed, n), so it can be computed in any order, on any row of any round, and again later.
# The twin computes on Python integers, the kernel's device functions on uint64 values:
show([sampling.splitmix64, sampling.uniform], [sampling.splitmix64_u64, sampling.uniform_u64],
     align=[("def uniform", "def uniform_u64")])
forward = [sampling.uniform(42, n) for n in range(8)]
backward = [sampling.uniform(42, n) for n in reversed(range(8))][::-1]
check(forward == backward, "the draws do not depend on the order they are made in")
print("u(42, 0..7) =", " ".join(f"{u:.4f}" for u in forward))

# %%
# The device functions compute the same hash on uint64 values. NumPy warns when a uint64 scalar product wraps, so
# they multiply and add in 32-bit halves, where nothing overflows; the bits are those of the twin.
print(inspect.getsource(sampling.mul64.py_func))
pairs = [(42, n) for n in range(8)] + [(2**64 - 1, 2**63 + 5)]
check(all(sampling.uniform_u64(np.uint64(s), np.uint64(n)) == sampling.uniform(s, n) for s, n in pairs),
      "the device uniform (32-bit halves) == the twin's Python integers")

# %%
# Floats as ordered integers
# --------------------------
# A threshold search works on integers. ``order_key`` maps a float32's bit pattern to a uint32 that orders like
# the float: non-negative floats get their sign bit set, negative ones have every bit flipped.
print(inspect.getsource(sampling.order_key.py_func))
values = np.array([-2.5, -0.25, 0.0, 0.25, 1.0, 3.0], np.float32)
for v, key in zip(values, sampling.keys_of(values)):
    print(f"  {v:6.2f} -> {key:#010x}")

# %%
# The filters, threshold by threshold
# -----------------------------------
# One small row, every filter on. `kept_probabilities` returns p_i = exp(x_i - max x) for the kept tokens (the
# top token has p = 1 exactly) and 0 for the others; its two searches each run 8 steps of 15 probes (its source
# faces the kernel's below). A step of the twin's `search` tests its 15 probes at once; the kernel's
# `block_search` has each thread count or sum its own values against every probe, then folds the 15 totals:
show(sampling.search, sampling.block_search,
     align=[("prefix = np.uint32(0)", "prefix = np.uint32(0)"),
            ("shift = ", "shift = "),
            ("ok = passes(probes)", "for j in range(PROBES):"),
            ("best = 0", "best = 0")])
rng = np.random.default_rng(0)
logits = (rng.normal(size=300) * 1.5).astype(np.float32)
temperature, top_k, top_p, min_p = 0.8, 40, 0.9, 0.02
p = sampling.kept_probabilities(logits, temperature, top_k, top_p, min_p)
print(f"kept {np.count_nonzero(p)} of {len(p)} tokens")

# The same sets, the slow way, by sorting: the k-th largest value, then the nucleus, then min-p.
x = logits / np.float32(temperature)
in_top_k = x >= np.sort(x)[::-1][top_k - 1]
check(np.array_equal(sampling.kept_probabilities(logits, temperature, top_k) > 0, in_top_k),
      "the searched top-k threshold == the k-th largest value of a sort")
full = sampling.kept_probabilities(logits, temperature, top_k)
ordered = np.sort(full[full > 0])[::-1]
nucleus = ordered[:np.searchsorted(np.cumsum(ordered, dtype=np.float64), top_p * ordered.sum()) + 1]
by_sort = (full >= nucleus[-1]) & (full >= np.float32(min_p))  # min-p: p >= min_p * p_max, and p_max = 1
print(f"a sort keeps {np.count_nonzero(by_sort)} tokens, the searches {np.count_nonzero(p)}")
check(np.array_equal(p > 0, by_sort), "the searched top-p and min-p thresholds == the sorted nucleus cut at min-p")
# (The search adds masses in the kernel's fixed order, a sort in its own: the two could disagree only where the
# nucleus mass lands within rounding of top_p * S. The search's answer is the one twin and kernel share.)


# %%
# The draw: a walk over the ids in order
# --------------------------------------
# target = u * K, K the kept mass; the token is the first id whose running kept mass passes the target. In the
# kernel, thread t owns ids [t*L, (t+1)*L), sums them in order, thread 0 adds the 256 slice sums to find the
# slice, and that slice's owner walks it. The twin does the same with two cumsums (beside the kernel below).
u = sampling.uniform(7, 3)
token = sampling.draw(p, u)
cumulative = np.cumsum(p.astype(np.float64))
print(f"u = {u:.4f}: token {token}; running mass before it {cumulative[token] - p[token]:.4f}, "
      f"after it {cumulative[token]:.4f}, target {u * cumulative[-1]:.4f}")

# %%
# The kernel
# ----------
# One block of 256 threads per row. Every reduction is a fixed two-level fold (16 threads fold 16 partials each,
# then one thread per probe folds those 16), every search step ends in the same decision in every thread, and
# every branch around a barrier depends only on the row's parameters, so the whole block takes it together.
# The folds first, then the filters and the draw, step by step:
show([sampling.thread_sums, sampling.fold_sum], sampling.block_fold_sum,
     align=[("def fold_sum", "if t < rows * GROUPS"),
            ("return np.cumsum(groups", "if t < rows:")])
show([sampling.kept_probabilities, sampling.draw], sampling.sample_kernel,
     align=[("m = logits[argmax", "m = logits[r, best]"),
            ("top_k_key = np.uint32(0)", "top_k_key = np.uint32(0)"),
            ("with np.errstate", "parts[0, t] = 0"),
            ("total = fold_sum", "block_fold_sum(parts"),
            ("top_p_key = np.uint32(0)", "top_p_key = np.uint32(0)"),
            ("threshold = max", "threshold = max"),
            ("return np.where(p_keys", "length = (vocab"),
            ("running = np.cumsum", "running = np.float32(0)"),
            ("reach = np.cumsum", "if t == 0:"),
            ("target = u * reach", "target = uniform_u64"),
            ("owner = int", "for s in range(THREADS)"),
            ("base = reach", "if t == owner[0]")])

# %%
# Run it (simulated) and compare bits
# -----------------------------------
# Two rows: the filtered draw above, and a greedy row whose maximum appears twice (the lower id must win).
logits2 = np.stack([logits, (rng.normal(size=300)).astype(np.float32)])
logits2[1, [250, 17]] = 9.0
rows = dict(seeds=np.array([7, 7], np.uint64), positions=np.array([3, 3], np.uint64),
            temperature=np.array([temperature, 0.0], np.float32), top_k=np.array([top_k, 0], np.int32),
            top_p=np.array([top_p, 1.0], np.float32), min_p=np.array([min_p, 0.0], np.float32))
twin = sampling.sample_rows(logits2, **rows)
kernel = sampling.sample_launch(cuda.to_device(logits2), *(cuda.to_device(rows[name]) for name in (
    "seeds", "positions", "temperature", "top_k", "top_p", "min_p"))).copy_to_host()
print(f"twin {twin}, kernel {kernel}")
check(twin.tobytes() == kernel.tobytes(), "sample kernel == twin")
check(twin[0] == token and twin[1] == 17, "the draw above, and the lower id among tied maxima")
check(argmax.argmax_launch(cuda.to_device(logits2)).copy_to_host()[1] == 17, "argmax kernel: the lower id too")

# %%
# Same seed, same position, same token
# ------------------------------------
# Each row's draw reads only its own logits, seed and position: the same request in a different row, next to
# different neighbours, gets the same token.
alone = sampling.sample(logits, 7, 3, temperature, top_k, top_p, min_p)
check(alone == twin[0], "a row sampled alone == the same row sampled in a round")
