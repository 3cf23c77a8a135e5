"""Choosing the next token from a row of logits: the argmax (argmax.py), or a seeded draw filtered by temperature,
top-k, top-p and min-p, computed without sorting.

The draw is counter-based: the uniform number for output position n of a request is a hash of (seed, n), so it
depends on nothing else: a drafted row and an undrafted step at the same position draw the same number, and the
same (seed, logits) always give the same token.

The filter pipeline for one row of V logits (temperature T > 0; T = 0 means argmax):

    x_i = logits_i / T                        float32 division, IEEE on every side
    top-k: keep x_i >= x_(k)                  x_(k) the k-th largest value; ties with it are all kept (as vLLM does)
    m = max x = logits_best / T               the argmax token's value (division by T > 0 keeps the order)
    p_i = exp32(x_i - m) for kept tokens      unnormalised probabilities, p_best = 1 exactly; 0 for dropped ones
    S = sum p                                 the softmax denominator
    top-p: keep p_i >= tau_p                  tau_p the largest threshold whose kept mass sum(p_i >= tau_p) still
                                              reaches top_p * S (tokens equal to tau_p are all kept)
    min-p: keep p_i >= min_p                  min_p * p_max, and p_max is 1
    draw:  target = u(seed, n) * K            K the kept mass; the token is the first id, in token-id order, whose
                                              running kept mass exceeds the target

Thresholds are searched, not sorted to: a 32-bit key that orders float32 values like the floats themselves
(`order_key`) is built four bits at a time; each of the 8 steps tests 15 thresholds at once with block-wide counts
(top-k) or masses (top-p) and keeps the largest one that still passes. Every sum has one fixed order, so the
searched thresholds, and with them the token, are the same bits in the twin, the simulator and on the GPU.

Mapping (the kernels): one block of THREADS threads per row of logits, after the argmax's first launch
(argmax.py), whose parts the block folds into the row's argmax: the answer at temperature 0, and m above.

* Thread-strided passes: thread t reads ids t, t + THREADS, ... in that order and keeps its own partial result
  (15 counts or 15 masses, a sum). After two search steps a thread copies the values that can still reach a
  probe, in order, to a spare buffer and walks only those: the same sums, far fewer reads.
* Folds: the block combines the THREADS partials in a fixed two-level order: 16 threads each fold 16 neighbouring
  partials in order, then one thread per probe folds those 16 group results in order. Three barriers per fold,
  where a halving tree needs nine (the searches run 16 folds per row).
* The draw walks the ids in order: thread t owns the contiguous ids [t * L, (t + 1) * L) with L = ceil(V / THREADS)
  and sums its kept p in order; thread 0 adds the THREADS slice sums in order (float64) to find the slice where
  the running mass passes the target; that slice's owner walks it id by id.

Ties go towards the lower token id: the argmax keeps the lowest id among equal maxima, and the draw walks ids in
increasing order. Logits are assumed free of NaN.
"""
import numpy as np
from numba import cuda

from tensorfold.cuda.argmax import GROUP, GROUPS, THREADS, argmax, argmax_parts_launch, best_of_parts
from tensorfold.cuda.fmath import exp32, exp32_twin
from tensorfold.device.launch import kernel

PROBES = 16  # thresholds per search step: c_0 (known to pass) and 15 tested ones, 4 bits of the answer per step
STEPS = 8  # 8 steps of 4 bits: a 32-bit key
DIGIT = 4  # bits fixed per search step
COMPACT = 2  # search steps over the whole row before each thread keeps only the values that can still pass

MASK64 = (1 << 64) - 1
LOW32 = np.uint64(0xFFFFFFFF)
S11, S27, S30, S31, S32 = (np.uint64(s) for s in (11, 27, 30, 31, 32))
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
TWO_TO_MINUS_53 = 1.0 / (1 << 53)
SIGN = np.uint32(0x80000000)
LOW31 = np.uint32(0x7FFFFFFF)
BIT31 = np.uint32(31)


# --- the counter-based uniform --------------------------------------------------------------------------------
# SplitMix64 twice: u(seed, n) = mix(mix(seed) ^ n) >> 11, scaled by 2^-53. The twin uses Python integers masked
# to 64 bits. The kernels use uint64 device functions in which the sums and products that wrap past 2^64 are
# computed in 32-bit halves: nothing overflows, so the simulator's NumPy scalars raise no warning, and the GPU
# gets the same bits as the twin.

def splitmix64(x):
    """One step of the SplitMix64 mixer over Python integers (64-bit wrap-around)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed, position):
    """The draw for output `position` under `seed`: a float64 in [0, 1) with 53 random bits."""
    return (splitmix64(splitmix64(seed & MASK64) ^ (position & MASK64)) >> 11) * (1.0 / (1 << 53))


@cuda.jit(device=True)
def add64(a, b):
    """(a + b) mod 2^64 for uint64 a, b."""
    low = (a & LOW32) + (b & LOW32)
    high = ((a >> S32) + (b >> S32) + (low >> S32)) & LOW32
    return (high << S32) | (low & LOW32)


@cuda.jit(device=True)
def mul64(a, b):
    """(a * b) mod 2^64 for uint64 a, b: the high halves' product a1 * b1 only touches bits >= 64."""
    a0, a1 = a & LOW32, a >> S32
    b0, b1 = b & LOW32, b >> S32
    low = a0 * b0  # < 2^64
    high = ((a0 * b1) & LOW32) + ((a1 * b0) & LOW32) + (low >> S32)  # < 3 * 2^32
    return ((high & LOW32) << S32) | (low & LOW32)


@cuda.jit(device=True)
def splitmix64_u64(x):
    """splitmix64 on a uint64."""
    x = add64(x, GOLDEN)
    x = mul64(x ^ (x >> S30), MIX1)
    x = mul64(x ^ (x >> S27), MIX2)
    return x ^ (x >> S31)


@cuda.jit(device=True)
def uniform_u64(seed, position):
    """uniform() on uint64 seed and position."""
    return np.float64(splitmix64_u64(splitmix64_u64(seed) ^ position) >> S11) * TWO_TO_MINUS_53


# --- keys: float32 values as ordered 32-bit integers ----------------------------------------------------------

@cuda.jit(device=True)
def order_key(bits):
    """A uint32 key of a float32's bit pattern with key(a) < key(b) exactly when a < b (and -0 < +0).

    Non-negative floats get their sign bit set; negative ones have every bit flipped. Branch-free, so the same
    body serves scalars (kernels) and arrays (twins).
    """
    return np.uint32(bits ^ (((bits >> BIT31) * LOW31) | SIGN))


@cuda.jit(device=True)
def f32_bits(x):
    """The bit pattern of a float32 as a uint32, through a one-element local array (works in the simulator)."""
    word = cuda.local.array(1, np.float32)
    word[0] = x
    return word.view(np.uint32)[0]


def keys_of(values):
    """order_key of every float32 in an array."""
    return order_key.py_func(np.ascontiguousarray(values, np.float32).view(np.uint32))


# --- the twin ---------------------------------------------------------------------------------------------------

def thread_sums(values):
    """values [..., V] -> [..., THREADS]: thread t's float32 sum of values t, t + THREADS, ... in that order."""
    vocab = values.shape[-1]
    length = -(-vocab // THREADS)
    padded = np.zeros(values.shape[:-1] + (length * THREADS,), np.float32)
    padded[..., :vocab] = values
    return np.cumsum(padded.reshape(values.shape[:-1] + (length, THREADS)), axis=-2, dtype=np.float32)[..., -1, :]


def fold_sum(parts):
    """parts [..., THREADS] -> [...]: GROUPS in-order sums of GROUP neighbours each, then their in-order sum."""
    groups = np.cumsum(parts.reshape(parts.shape[:-1] + (GROUPS, GROUP)), axis=-1)[..., -1]
    return np.cumsum(groups, axis=-1)[..., -1]


def search(passes):
    """The largest 32-bit key c with passes(c) true, for a test that holds at key 0 and fails from some key on.

    Step s fixes bits [28 - 4s, 32 - 4s): it tests the 15 keys c_j = prefix | j << shift (c_0 = prefix passes)
    together and moves the prefix to the largest one that passes.
    """
    prefix = np.uint32(0)
    for step in range(STEPS):
        shift = np.uint32(32 - DIGIT * (step + 1))
        probes = prefix | (np.arange(PROBES, dtype=np.uint32) << shift)
        ok = passes(probes)
        best = 0
        for j in range(1, PROBES):
            if ok[j]:
                best = j
        prefix = np.uint32(prefix | (np.uint32(best) << shift))
    return prefix


def kept_probabilities(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """One row's unnormalised probabilities after the filters: p_i for kept tokens, 0 for the others (float32)."""
    logits = np.asarray(logits, np.float32)
    vocab = logits.shape[-1]
    temperature = np.float32(temperature)
    x = logits / temperature
    m = logits[argmax(logits[None])[0]] / temperature
    x_keys = keys_of(x)
    top_k_key = np.uint32(0)
    if 0 < top_k < vocab:  # the largest key that at least top_k values reach: the k-th largest value's key
        top_k_key = search(lambda probes: (x_keys[None, :] >= probes[:, None]).sum(axis=1) >= top_k)
    with np.errstate(under="ignore"):
        p = np.where(x_keys >= top_k_key, exp32_twin(x - m), np.float32(0))
    total = fold_sum(thread_sums(p))
    p_keys = keys_of(p)
    top_p_key = np.uint32(0)
    if np.float32(top_p) < np.float32(1):  # the largest threshold whose kept mass still reaches top_p * S
        target = np.float32(top_p) * total
        top_p_key = search(lambda probes: fold_sum(thread_sums(
            np.where(p_keys[None, :] >= probes[:, None], p[None, :], np.float32(0)))) >= target)
    threshold = max(top_p_key, keys_of(np.float32(min_p)))
    return np.where(p_keys >= threshold, p, np.float32(0))


def draw(p, u):
    """The id whose kept mass straddles u * K when the ids are walked in order (p: kept_probabilities).

    Thread t's slice [t * L, (t + 1) * L) is summed in float32 in id order; thread 0 adds the slice sums in float64
    in order (the last running sum is K) and finds the first slice whose running sum exceeds the target; that
    slice's owner walks it: base + (its float32 running sum) until it exceeds the target.
    """
    vocab = p.shape[-1]
    length = -(-vocab // THREADS)
    padded = np.zeros(length * THREADS, np.float32)
    padded[:vocab] = p
    running = np.cumsum(padded.reshape(THREADS, length), axis=1, dtype=np.float32)  # each thread's walk
    reach = np.cumsum(running[:, -1].astype(np.float64))  # thread 0's scan over the slice sums
    target = u * reach[-1]
    owner = int(np.argmax(reach > target))
    base = reach[owner - 1] if owner > 0 else 0.0
    return owner * length + int(np.argmax(base + running[owner].astype(np.float64) > target))


def sample(logits, seed, position, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0):
    """The token for output `position` of a request: argmax at temperature 0, else the seeded filtered draw."""
    logits = np.asarray(logits, np.float32)
    if np.float32(temperature) == 0:
        return int(argmax(logits[None])[0])
    return draw(kept_probabilities(logits, temperature, top_k, top_p, min_p), uniform(seed, position))


def sample_rows(logits, seeds, positions, temperature, top_k, top_p, min_p):
    """sample() for every row [rows, V] with per-row seeds, positions and parameters: int32 [rows]."""
    return np.array([sample(logits[r], int(seeds[r]), int(positions[r]), temperature[r], int(top_k[r]), top_p[r],
                            min_p[r]) for r in range(len(logits))], np.int32)


def candidates(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The filtered candidates of one row, for inspection: (token ids, float64 probabilities), most probable first
    (ties: lower id first)."""
    p = kept_probabilities(logits, temperature, top_k, top_p, min_p)
    ids = np.flatnonzero(p > 0)
    ids = ids[np.argsort(-p[ids], kind="stable")]
    probs = p[ids].astype(np.float64)
    return ids, probs / probs.sum()


# --- the kernels --------------------------------------------------------------------------------------------------
# Block r handles row r; thread t. Shared arrays are declared in the kernels and handed to the device functions.

@cuda.jit(device=True)
def block_fold_sum(parts, groups, totals, rows, t):
    """totals[j] = parts[j, :] folded in the fixed order of fold_sum, for j < rows; every thread sees them."""
    cuda.syncthreads()  # every partial is written
    if t < rows * GROUPS:
        j, g = t // GROUPS, t % GROUPS
        acc = parts[j, g * GROUP]
        for i in range(1, GROUP):
            acc += parts[j, g * GROUP + i]
        groups[j, g] = acc
    cuda.syncthreads()
    if t < rows:
        acc = groups[t, 0]
        for g in range(1, GROUPS):
            acc += groups[t, g]
        totals[t] = acc
    cuda.syncthreads()


@cuda.jit(device=True)
def probe_reach(key, prefix, shift):
    """How many of the probes c_1 .. c_15 a key reaches (-1: below c_0 = prefix too)."""
    if key < prefix:
        return -1
    return min(np.int64((key - prefix) >> shift), PROBES - 1)


@cuda.jit(device=True)
def block_search(values, spare, r, t, goal, mass, acc, parts, groups, totals):
    """The twin's `search` over the keys of row r of `values`: the largest key c whose test passes, the test being
    sum(v for v with key(v) >= c) >= goal when `mass`, else count(key(v) >= c) >= goal (counts are exact floats).

    Thread t's values sit at slots n * THREADS + t, n < count (first the row itself, strided). After COMPACT steps
    only values with key >= prefix can still reach a probe, so each thread copies those, in order, to the same
    slots of `spare` and reads only them from then on: the same sums from a much shorter walk.
    """
    source = values
    count = (values.shape[1] - t + THREADS - 1) // THREADS
    prefix = np.uint32(0)
    for step in range(STEPS):
        if step == COMPACT:
            kept = 0
            for n in range(count):
                v = source[r, n * THREADS + t]
                if order_key(f32_bits(v)) >= prefix:
                    spare[r, kept * THREADS + t] = v
                    kept += 1
            source, count = spare, kept
        shift = np.uint32(32 - DIGIT * (step + 1))
        for j in range(PROBES):
            acc[j] = 0
        for n in range(count):
            v = source[r, n * THREADS + t]
            reach = probe_reach(order_key(f32_bits(v)), prefix, shift)
            add = v if mass else np.float32(1)
            for j in range(1, PROBES):
                if j <= reach:
                    acc[j] += add
        for j in range(PROBES):
            parts[j, t] = acc[j]
        block_fold_sum(parts, groups, totals, PROBES, t)
        best = 0
        for j in range(1, PROBES):
            if totals[j] >= goal:
                best = j
        prefix = np.uint32(prefix | (np.uint32(best) << shift))
    return prefix


@kernel
def sample_kernel(logits, part_values, part_ids, seeds, positions, temperature, top_k, top_p, min_p, work, spare,
                  out):
    r, t = cuda.blockIdx.x, cuda.threadIdx.x
    vocab = logits.shape[1]
    values = cuda.shared.array(THREADS, np.float32)
    ids = cuda.shared.array(THREADS, np.int32)
    group_values = cuda.shared.array(GROUPS, np.float32)
    group_ids = cuda.shared.array(GROUPS, np.int32)
    parts = cuda.shared.array((PROBES, THREADS), np.float32)
    groups = cuda.shared.array((PROBES, GROUPS), np.float32)
    totals = cuda.shared.array(PROBES, np.float32)
    walk = cuda.shared.array(2, np.float64)  # the chosen slice's base mass, the target
    owner = cuda.shared.array(1, np.int32)
    acc = cuda.local.array(PROBES, np.float32)  # a thread's probe sums, in registers

    best = best_of_parts(part_values, part_ids, r, t, values, ids, group_values, group_ids)
    if t == 0:
        out[r] = best  # the answer at temperature 0; a draw overwrites it below
    temp = temperature[r]
    if temp != 0:  # the same for the whole block: the barriers below are reached by every thread or by none
        m = logits[r, best] / temp
        for i in range(t, vocab, THREADS):
            work[r, i] = logits[r, i] / temp  # x
        top_k_key = np.uint32(0)
        if 0 < top_k[r] and top_k[r] < vocab:
            top_k_key = block_search(work, spare, r, t, np.float32(top_k[r]), False, acc, parts, groups, totals)

        parts[0, t] = 0
        for i in range(t, vocab, THREADS):
            x = work[r, i]
            p = np.float32(0)
            if order_key(f32_bits(x)) >= top_k_key:
                p = exp32(x - m)
            work[r, i] = p  # from here on work holds p
            parts[0, t] += p
        block_fold_sum(parts, groups, totals, 1, t)
        total = totals[0]

        top_p_key = np.uint32(0)
        if top_p[r] < np.float32(1):
            top_p_key = block_search(work, spare, r, t, top_p[r] * total, True, acc, parts, groups, totals)
        threshold = max(top_p_key, order_key(f32_bits(min_p[r])))

        length = (vocab + THREADS - 1) // THREADS
        first, last = t * length, min(t * length + length, vocab)
        running = np.float32(0)
        for i in range(first, last):
            p = work[r, i]
            if order_key(f32_bits(p)) >= threshold:
                running += p
        values[t] = running
        cuda.syncthreads()
        if t == 0:
            reach = 0.0
            for s in range(THREADS):
                reach += np.float64(values[s])
            target = uniform_u64(np.uint64(seeds[r]), np.uint64(positions[r])) * reach
            reach = 0.0
            for s in range(THREADS):
                after = reach + np.float64(values[s])
                if after > target:
                    owner[0] = s
                    walk[0], walk[1] = reach, target
                    break
                reach = after
        cuda.syncthreads()
        if t == owner[0]:
            base, target = walk[0], walk[1]
            running = np.float32(0)
            for i in range(first, last):
                p = work[r, i]
                if order_key(f32_bits(p)) >= threshold:
                    running += p
                if base + np.float64(running) > target:
                    out[r] = i
                    break


def sample_launch(logits, seeds, positions, temperature, top_k, top_p, min_p, out=None, stream=0):
    """One token per row of device logits [rows, V]: int32 [rows] on the device (into `out` if given).

    Every other argument is a device array with one entry per row: seeds and positions uint64, temperature, top_p
    and min_p float32, top_k int32 (0: off). Rows with temperature 0 take the argmax.
    """
    rows, vocab = logits.shape
    work = cuda.device_array((rows, vocab), np.float32, stream=stream)  # each row's x, then its p
    spare = cuda.device_array((rows, vocab), np.float32, stream=stream)  # the searches' compacted candidates
    out = cuda.device_array(rows, np.int32, stream=stream) if out is None else out
    sample_kernel[rows, THREADS, stream](logits, *argmax_parts_launch(logits, stream), seeds, positions, temperature,
                                         top_k, top_p, min_p, work, spare, out)
    return out
