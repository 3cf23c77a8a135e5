"""The sampling twin: the counter-based uniform, the searched thresholds, the in-order walk, and the kernel's
device functions under the simulator."""
import random

import numpy as np
import pytest

from tensorfold.cuda import sampling


def test_device_uniform_equals_the_python_integer_twin(on_gpu):
    if on_gpu:  # a device function is called from the host only in the simulator
        pytest.skip("the simulator check; on a GPU the sample kernel's contract checks the draws")
    rnd = random.Random(1)
    pairs = [(rnd.getrandbits(64), rnd.getrandbits(64)) for _ in range(2000)]
    pairs += [(0, 0), (sampling.MASK64, sampling.MASK64), (2**63, 1), (1, 2**63 - 1)]
    with np.errstate(all="raise"):  # the 32-bit halves never overflow
        assert all(sampling.uniform_u64(np.uint64(a), np.uint64(b)) == sampling.uniform(a, b) for a, b in pairs)


def test_order_key_orders_like_the_floats():
    values = np.array([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1e-30, 0.5, 1.0, 7.0, 3e38, np.inf], np.float32)
    keys = sampling.keys_of(values)
    assert (np.diff(keys.astype(np.int64)) > 0).all()
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    assert (np.argsort(sampling.keys_of(x), kind="stable") == np.argsort(x, kind="stable")).all()


def test_argmax_takes_the_lowest_id_among_ties():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 1000)).astype(np.float32)
    logits[0, [700, 300, 44]] = 9.0  # 300 is owned by thread 44, which also holds 44: the lowest id wins
    logits[1, [263, 200]] = 9.0  # 263 lies in thread 7, 200 in thread 200: the lowest id, not the first thread
    logits[2] = -np.inf
    assert list(sampling.argmax(logits)) == [44, 200, 0, int(np.argmax(logits[3]))]


@pytest.mark.parametrize("k", [1, 2, 7, 100, 999])
def test_top_k_keeps_the_k_largest_and_every_tie_with_the_kth(k):
    logits = np.round(np.random.default_rng(k).normal(size=1000) * 3).astype(np.float32)  # many ties
    kept = sampling.kept_probabilities(logits, 1.0, top_k=k) > 0
    kth = np.sort(logits)[::-1][k - 1]
    assert (kept == (logits >= kth)).all()


def test_top_p_threshold_is_the_largest_that_reaches_the_mass():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=3000) * 2).astype(np.float32)
    full = sampling.kept_probabilities(logits, 1.0)
    total = sampling.fold_sum(sampling.thread_sums(full))
    for top_p in (0.1, 0.5, 0.9, 0.99):
        kept = sampling.kept_probabilities(logits, 1.0, top_p=top_p)
        tau = kept[kept > 0].min()

        def mass(threshold):
            return sampling.fold_sum(sampling.thread_sums(np.where(full >= threshold, full, np.float32(0))))
        assert (kept > 0).sum() == (full >= tau).sum()
        assert mass(tau) >= np.float32(top_p) * total
        assert mass(np.nextafter(tau, np.float32(2))) < np.float32(top_p) * total


def test_min_p_is_relative_to_the_top_probability():
    logits = np.log(np.array([0.1, 0.5, 0.25, 0.15], np.float32))
    assert list(sampling.candidates(logits, 1.0, min_p=0.31)[0]) == [1, 2]
    assert list(sampling.candidates(logits, 1.0, min_p=0.29)[0]) == [1, 2, 3]


def test_draw_walks_the_ids_in_order():
    p = np.zeros(1000, np.float32)
    p[[3, 500, 999]] = [1.0, 2.0, 1.0]  # running mass 1, 3, 4 along the ids
    assert [sampling.draw(p, u) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.99999)] == [3, 3, 500, 500, 999, 999]


def test_filtered_draws_follow_the_renormalised_distribution():
    probs = np.array([0.05, 0.3, 0.1, 0.35, 0.2], np.float32)
    logits = np.log(probs)
    draws = [sampling.sample(logits, 4, n, temperature=1.0, top_k=3, top_p=0.8) for n in range(4000)]
    kept = np.array([0, 0.3, 0, 0.35, 0.2]) / 0.85  # top-3 is {1, 3, 4}; 0.35 + 0.3 + 0.2 / 0.85 > 0.8 keeps all three
    assert np.allclose(np.bincount(draws, minlength=5) / 4000, kept, atol=0.03)


def test_temperature_zero_is_the_argmax_and_rows_are_independent():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(3, 700)).astype(np.float32)
    rows = dict(seeds=np.array([1, 2, 3], np.uint64), positions=np.array([0, 0, 9], np.uint64),
                temperature=np.array([0.0, 1.0, 0.7], np.float32), top_k=np.array([0, 0, 20], np.int32),
                top_p=np.array([1.0, 0.9, 1.0], np.float32), min_p=np.array([0.0, 0.0, 0.1], np.float32))
    out = sampling.sample_rows(logits, **rows)
    assert out[0] == np.argmax(logits[0])
    assert out[2] == sampling.sample(logits[2], 3, 9, 0.7, 20, 1.0, 0.1)


def test_kernel_equals_twin_on_ties_and_filters_that_cut_through_them():
    """Rounded logits tie in blocks of many ids: the k-th value, the top-p threshold and the maximum all tie."""
    from numba import cuda
    logits = np.round(np.random.default_rng(6).normal(size=(2, 300)) * 2).astype(np.float32)
    rows = dict(seeds=np.array([9, 10], np.uint64), positions=np.array([0, 77], np.uint64),
                temperature=np.array([1.0, 0.6], np.float32), top_k=np.array([5, 40], np.int32),
                top_p=np.array([0.5, 0.95], np.float32), min_p=np.array([0.0, 0.01], np.float32))
    twin = sampling.sample_rows(logits, **rows)
    kernel = sampling.sample_launch(cuda.to_device(logits), *(cuda.to_device(rows[name]) for name in (
        "seeds", "positions", "temperature", "top_k", "top_p", "min_p"))).copy_to_host()
    assert twin.tobytes() == kernel.tobytes()
    assert (sampling.kept_probabilities(logits[0], 1.0, top_k=5) > 0).sum() > 5  # the tie at the 5th value is kept
