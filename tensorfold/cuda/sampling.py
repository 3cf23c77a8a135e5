"""Choosing the next token from a row of logits: argmax, or a seeded draw filtered by temperature, top-k, top-p
and min-p.

The draw is counter-based: the uniform number for output position n of a request is a hash of (seed, n), so it
depends on nothing else: a drafted row and an undrafted step at the same position draw the same number.

Filtering order (as in vLLM and transformers): scale by 1 / temperature, keep the top_k largest, softmax, keep the
smallest most-probable set whose mass reaches top_p, drop tokens below min_p times the top probability. Ties are
broken towards the lower token id everywhere, so the candidate order is fully determined.

Mapping (the kernel): argmax is one block per row with a tree of (value, index) pairs; the filtered draw is one
block per row that walks the candidates in order.
"""
import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """One step of the SplitMix64 mixer over Python integers (64-bit wrap-around)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed, position):
    """The draw for output `position` under `seed`: a float64 in [0, 1) with 53 random bits."""
    return (splitmix64(splitmix64(seed & MASK64) ^ (position & MASK64)) >> 11) * (1.0 / (1 << 53))


def argmax(logits):
    """Index of the largest logit of each row [rows, V]; the lowest index among equal maxima."""
    return np.argmax(np.asarray(logits, np.float32), axis=-1)


def candidates(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The filtered candidates of one row of logits: (token ids, float64 probabilities), most probable first."""
    scaled = np.asarray(logits, np.float32) / np.float32(temperature)
    order = np.argsort(-scaled, kind="stable")  # descending; equal logits keep ascending ids
    if top_k > 0:
        order = order[:top_k]
    kept = scaled[order].astype(np.float64)
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if top_p < 1.0:
        reach = np.cumsum(probs)
        probs = probs[:int(np.searchsorted(reach, top_p)) + 1]  # smallest prefix whose mass reaches top_p
    if min_p > 0.0:
        probs = probs[probs >= min_p * probs[0]]
    return order[:len(probs)], probs


def sample(logits, seed, position, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0):
    """The token for output `position` of a request: argmax at temperature 0, else the seeded filtered draw."""
    if temperature == 0.0:
        return int(argmax(logits[None])[0])
    ids, probs = candidates(logits, temperature, top_k, top_p, min_p)
    target = uniform(seed, position) * probs.sum()
    index = int(np.searchsorted(np.cumsum(probs), target, side="right"))
    return int(ids[min(index, len(ids) - 1)])
