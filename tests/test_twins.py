"""The twins: each against a plain float64 reference, and each structural promise (the thread loop, the tree, the
independence from the other rows) checked bit for bit with a planted control that must break it."""
from fractions import Fraction

import numpy as np
import pytest

from tensorfold.cuda import attention, conv, deltanet, gemv, kv, rmsnorm, rope, sampling
from tensorfold.cuda.fmath import fma32, tree_sum
from tensorfold.numerics import paths
from tensorfold.numerics.floats import fma_rn_twin
from tensorfold.numerics.formats import affine_rows, bf16_to_f32, f32_to_bf16, quantize_affine

rng = np.random.default_rng(0)


def normal(*shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(np.float32)


# --- GEMV ---------------------------------------------------------------------------------------------------------

def thread_loop_gemv(x, w, threads=gemv.THREADS, chunk=gemv.CHUNK):
    """The kernel's mapping written out: thread t walks chunks t, t + threads, ... (`chunk` columns each, in order),
    adding with the GEMV's single-rounding fma_rn; then the warp's tree."""
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    for r in range(x.shape[0]):
        for o in range(w.shape[0]):
            partial = np.zeros(threads, np.float32)
            for t in range(threads):
                for c in range(t, -(-w.shape[1] // chunk), threads):
                    for k in range(c * chunk, min(c * chunk + chunk, w.shape[1])):
                        partial[t] = fma_rn_twin(w[o, k], x[r, k], partial[t])
            y[r, o] = tree_sum(partial)
    return y


def rounded_once(exact: Fraction) -> np.float32:
    """The float32 nearest an exact rational (ties to the even bit pattern): a single rounding, by definition."""
    guess = np.float32(float(exact))
    near = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(near, key=lambda f: (abs(Fraction(float(f)) - exact), int(np.array(f).view(np.uint32)) & 1))


def test_fma_rn_twin_rounds_once():
    """The GEMV's multiply-add twin equals a * b + c rounded once from exact rational arithmetic: on halfway
    products with a tiny term (where two roundings differ), cancellations, tiny (subnormal) sums and random
    triples. Control: fma32 (float64, then float32) differs on the halfway products."""
    n = 1000
    a = (rng.normal(size=n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    b = (rng.normal(size=n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    c = (rng.normal(size=n) * np.exp2(rng.integers(-60, 20, n))).astype(np.float32)
    c[:300] = (-(a[:300].astype(np.float64) * b[:300]) * (1 + rng.normal(size=300) * 1e-7)).astype(np.float32)
    a[-50:], b[-50:] = np.float32(2 ** -70), np.float32(2 ** -70) * rng.integers(1, 1000, 50).astype(np.float32)
    c[-50:] = (rng.normal(size=50) * 2.0 ** -140).astype(np.float32)
    halfway = np.float32(1 + 2 ** -12)  # halfway * halfway = 1 + 2^-11 + 2^-24, a float32 tie
    a[:3], b[:3], c[:3] = halfway, halfway, np.array([2.0 ** -80, -2.0 ** -80, 0.0], np.float32)
    got = fma_rn_twin(a, b, c)
    exact = [Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)) for x, y, z in zip(a, b, c)]
    assert [rounded_once(e) for e in exact] == list(got)
    assert fma32.py_func(a[:3], b[:3], c[:3]).tobytes() != got[:3].tobytes()  # control: two roundings


@pytest.mark.parametrize("in_features", [64, 200, 300])
def test_gemv_is_the_thread_loop(in_features):
    x, w = normal(3, in_features), normal(5, in_features)
    y = gemv.gemv_f32(x, w)
    assert y.tobytes() == thread_loop_gemv(x, w).tobytes()
    assert np.allclose(y, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    assert y.tobytes() != thread_loop_gemv(x, w, chunk=1).tobytes()  # control: a column stride, another order


def test_gemv_rows_do_not_change_each_other():
    x, w = normal(17, 300), normal(33, 300)
    together = gemv.gemv_f32(x, w)
    alone = np.concatenate([gemv.gemv_f32(x[r:r + 1], w) for r in range(17)])
    assert together.tobytes() == alone.tobytes()


def test_bf16_round_trip_and_gemv():
    w = normal(6, 128)
    bits = f32_to_bf16(w)
    back = bf16_to_f32(bits)
    assert np.abs(back - w).max() <= np.abs(w).max() * 2 ** -8
    assert f32_to_bf16(back).tobytes() == bits.tobytes()  # bf16 values are fixed points
    x = normal(2, 128)
    assert gemv.gemv_bf16(x, bits).tobytes() == gemv.gemv_f32(x, back).tobytes()
    assert f32_to_bf16(np.array([np.nan], np.float32))[0] == 0x7FC0


@pytest.mark.parametrize("bits", [4, 8])
def test_affine_gemm_is_the_dense_product_within_the_rounding_of_x(bits):
    """The integer GEMM of an affine weight is the exact product with its dequantized rows, but for x's fixed point
    (at most half a unit of 2^(e - P) an element, e its group's exponent) and the float32 rounding at the end.
    Control: the same bound fails for a weight read with a wrong group index."""
    from tensorfold.cuda import gemm, quantize
    w = normal(7, 192)
    packed, scale_bits, bias_bits = quantize_affine(w, bits, 64)
    scales, biases = bf16_to_f32(scale_bits), bf16_to_f32(bias_bits)
    dense = affine_rows(packed, scales, biases, bits, 64, np.arange(7)).astype(np.float64)
    assert np.abs(dense - w).max() <= scales.max() * 0.51 + 1e-2
    x = normal(3, 192)
    exact = x.astype(np.float64) @ dense.T
    group_max = np.abs(x).reshape(3, -1, 64).max(axis=2)
    unit = np.repeat(np.ldexp(1.0, np.frexp(group_max)[1] - quantize.P - 1), 64, axis=1)  # half a unit of X, a column
    bound = unit @ np.abs(dense).T + np.abs(exact) * 2.0 ** -24

    def within(scales):
        return bool(np.all(np.abs(gemm.gemm_affine(x, packed, scales, biases, bits, 64) - exact) <= bound))
    assert within(scales)
    assert not within(np.roll(scales, 1, axis=1))  # control


def test_numpy_backend_keeps_walked_weights_with_the_same_bits():
    """The NumPy backend's GEMV on a float weight it keeps in walk order gives the twin's bytes, for both float forms
    and a row count past one tile of the twin; past its budget it keeps nothing, and a weight's copy goes with the
    weight. An affine weight takes the integer GEMM's twin (gemm.py), with no walked copy. Control: a copy walked in
    the wrong order gives other bytes."""
    import gc

    from tensorfold.backends import NumpyBackend
    from tensorfold.cuda import gemm
    from tensorfold.model.checkpoint import Linear
    w = normal(40, 320)
    packed, scale_bits, bias_bits = quantize_affine(w, 4, 64)
    forms = [Linear("f32", 40, 320, w), Linear("bf16", 40, 320, f32_to_bf16(w))]
    affine = Linear("affine", 40, 320, packed, bf16_to_f32(scale_bits), bf16_to_f32(bias_bits), 4, 64)
    x = normal(130, 320)
    backend = NumpyBackend()
    for weight in forms:
        twin = gemv.gemv(x, weight.rows, 40)  # no walked copy: the tile by tile twin
        assert backend.linear(x, weight).tobytes() == twin.tobytes()  # makes the copy
        assert backend.linear(x, weight).tobytes() == twin.tobytes()  # uses it
        assert backend.walked(weight) is backend.walked(weight)
    assert backend.walked_bytes == 2 * 8 * 40 * 320
    expected = gemm.gemm_affine(x, affine.data, affine.scales, affine.biases, 4, 64)
    assert backend.linear(x, affine).tobytes() == expected.tobytes() and backend.walked_bytes == 2 * 8 * 40 * 320
    walked = gemv.walked_weight(forms[0].rows, 40, 320)
    assert gemv.gemv(x, forms[0].rows, 40, walked).tobytes() == gemv.gemv_f32(x, w).tobytes()
    assert gemv.gemv(x, forms[0].rows, 40, walked[::-1]).tobytes() != gemv.gemv_f32(x, w).tobytes()  # control
    kept = backend.walked(forms[1])
    twin = gemv.gemv(x, forms[1].rows, 40)
    forms[1].data = f32_to_bf16(w * np.float32(2))  # new arrays: a new copy, the new values
    assert backend.walked(forms[1]) is not kept and backend.walked_bytes == 2 * 8 * 40 * 320
    assert backend.linear(x, forms[1]).tobytes() == gemv.gemv(x, forms[1].rows, 40).tobytes() != twin.tobytes()
    del forms, weight
    gc.collect()
    assert backend.walked_bytes == 0 and not backend.walked_weights
    backend.WALKED_BUDGET = 0
    weight = Linear("f32", 40, 320, w)
    assert backend.walked(weight) is None and backend.linear(x, weight).tobytes() == gemv.gemv_f32(x, w).tobytes()

# --- norms ------------------------------------------------------------------------------------------------------

def test_rmsnorm_variants():
    x, z, m = normal(4, 3, 200), normal(4, 3, 200), normal(200)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * m
    assert np.allclose(rmsnorm.rmsnorm(x, m, 1e-6), ref, rtol=1e-5, atol=1e-5)
    gated = ref * z / (1 + np.exp(-z.astype(np.float64)))
    assert np.allclose(rmsnorm.rmsnorm_gated(x, z, m, 1e-6), gated, rtol=1e-5, atol=1e-5)
    l2 = x64 / np.sqrt((x64 ** 2).sum(-1, keepdims=True) + 1e-6) * 0.25
    assert np.allclose(rmsnorm.l2norm(x, 1e-6, scale=0.25), l2, rtol=1e-5, atol=1e-6)
    assert rmsnorm.rmsnorm(x[1:2], m, 1e-6).tobytes() == rmsnorm.rmsnorm(x, m, 1e-6)[1:2].tobytes()


# --- causal conv ------------------------------------------------------------------------------------------------

def test_causal_conv_reference_and_windows():
    u, w, tail = normal(10, 12), normal(12, 4), normal(3, 12)
    out, new_tail = conv.causal_conv(u, tail, w)
    history = np.concatenate([tail, u]).astype(np.float64)
    pre = np.stack([(history[r:r + 4] * w.T).sum(0) for r in range(10)])
    assert np.allclose(out, pre / (1 + np.exp(-pre)), rtol=1e-5, atol=1e-6)
    assert np.array_equal(new_tail, u[-3:])
    first, mid_tail = conv.causal_conv(u[:4], tail, w)
    second, end_tail = conv.causal_conv(u[4:], mid_tail, w)
    assert np.concatenate([first, second]).tobytes() == out.tobytes() and np.array_equal(end_tail, new_tail)
    shifted, _ = conv.causal_conv(u[4:], np.concatenate([tail, u[:3]])[-3:], w)  # control: tail one row behind
    assert shifted.tobytes() != second.tobytes()


def test_a_tree_conv_row_equals_a_chain_along_its_path():
    """Each tree row's conv window is its ancestors' inputs running on into the tail; the new tail is the last row's
    window less its oldest input. Control: taps in slot order (a sibling read as a predecessor) differ."""
    parents = paths.TREES["16 rows"]
    u, w, tail = normal(16, 12), normal(12, 4), normal(3, 12)
    out, new_tail = conv.causal_conv(u, tail, w, paths.conv_taps(parents, 4))
    for r in range(16):
        path = paths.path_slots(parents)[r, :paths.depths(parents)[r] + 1]
        along, tail_after = conv.causal_conv(u[path], tail, w)
        assert out[r].tobytes() == along[-1].tobytes(), f"row {r}"
    assert new_tail.tobytes() == tail_after.tobytes()  # the path to the last row
    in_slot_order, _ = conv.causal_conv(u, tail, w)
    assert in_slot_order.tobytes() != out.tobytes()


# --- DeltaNet ---------------------------------------------------------------------------------------------------

def deltanet_inputs(rows, nk=2, nv=4, dk=8, dv=6):
    q = rmsnorm.l2norm(normal(rows, nk, dk), 1e-6, scale=dk ** -0.5)
    k = rmsnorm.l2norm(normal(rows, nk, dk), 1e-6)
    decay, beta = deltanet.deltanet_gates(normal(rows, nv), normal(rows, nv), normal(nv), normal(nv))
    return normal(nv, dk, dv, scale=0.1), q, k, normal(rows, nv, dv), decay, beta


def test_deltanet_scan_matches_the_recurrence():
    state, q, k, v, decay, beta = deltanet_inputs(9)
    out, final, _ = deltanet.deltanet_scan(state, q, k, v, decay, beta)
    s = state.astype(np.float64)
    for r in range(9):
        for h in range(4):
            kh, qh = k[r, h // 2].astype(np.float64), q[r, h // 2].astype(np.float64)
            s[h] *= decay[r, h]
            delta = (v[r, h] - s[h].T @ kh) * beta[r, h]
            s[h] += np.outer(kh, delta)
            assert np.allclose(out[r, h], s[h].T @ qh, rtol=1e-4, atol=1e-5)
    assert np.allclose(final, s, rtol=1e-4, atol=1e-5)


def test_the_scan_sums_run_as_chains_whose_order_shows_in_the_bits():
    """The scan's sums over i run as deltanet.SUM_CHAINS interleaved chains added in a fixed tree; one chain in
    order (the control, the order before) gives other bits on the same inputs, within float32 rounding, so a kernel
    that summed in another order would fail the contract's bit-equality."""
    state, vec = normal(4, 128, 32, scale=0.1), normal(4, 128)
    chained = deltanet._column_sum(state, vec)
    one_chain = np.zeros((4, 32), np.float32)
    for i in range(128):
        one_chain = fma_rn_twin(state[:, i, :], vec[:, i, None], one_chain)
    assert chained.tobytes() != one_chain.tobytes()
    assert np.allclose(chained, one_chain, rtol=1e-5, atol=1e-6)


def test_deltanet_apply_replays_the_log_and_controls_fail():
    state, q, k, v, decay, beta = deltanet_inputs(12)
    out, final, log = deltanet.deltanet_scan(state, q, k, v, decay, beta)
    assert deltanet.deltanet_apply(state, log, range(12)).tobytes() == final.tobytes()
    head, mid, _ = deltanet.deltanet_scan(state, q[:5], k[:5], v[:5], decay[:5], beta[:5])
    tail, end, _ = deltanet.deltanet_scan(mid, q[5:], k[5:], v[5:], decay[5:], beta[5:])
    assert np.concatenate([head, tail]).tobytes() == out.tobytes() and end.tobytes() == final.tobytes()
    dropped = [r for r in range(12) if r != 7]
    swapped = [0, 1, 2, 4, 3] + list(range(5, 12))
    assert deltanet.deltanet_apply(state, log, dropped).tobytes() != final.tobytes()
    assert deltanet.deltanet_apply(state, log, swapped).tobytes() != final.tobytes()


def test_a_tree_scan_row_equals_a_chain_along_its_path():
    """Each tree row starts from its parent's state: its output equals a chain scan along its path, and replaying a
    path's logged rows gives that chain's state. Controls: a tree scanned as a chain, and a replay in slot order."""
    parents = paths.TREES["16 rows"]
    depths, slots = paths.depths(parents), paths.path_slots(parents)
    state, q, k, v, decay, beta = deltanet_inputs(16)
    out, last, log = deltanet.deltanet_scan(state, q, k, v, decay, beta, depths, slots)
    for r in range(16):
        path = slots[r, :depths[r] + 1]
        along, after, _ = deltanet.deltanet_scan(state, q[path], k[path], v[path], decay[path], beta[path])
        assert out[r].tobytes() == along[-1].tobytes(), f"row {r}"
        assert deltanet.deltanet_apply(state, log, path).tobytes() == after.tobytes(), f"row {r}"
    assert last.tobytes() == after.tobytes()  # the state after the last row, along its path
    as_chain, _, _ = deltanet.deltanet_scan(state, q, k, v, decay, beta)
    assert as_chain.tobytes() != out.tobytes()
    assert deltanet.deltanet_apply(state, log, range(len(path))).tobytes() != after.tobytes()


def test_deltanet_gates():
    b, a, a_log, dt_bias = normal(3, 4), normal(3, 4, scale=10), normal(4), normal(4)
    decay, beta = deltanet.deltanet_gates(b, a, a_log, dt_bias)
    x = a.astype(np.float64) + dt_bias
    softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    assert np.allclose(decay, np.exp(-np.exp(a_log.astype(np.float64)) * softplus), rtol=1e-6)
    assert np.allclose(beta, 1 / (1 + np.exp(-b.astype(np.float64))), rtol=1e-6)
    assert (decay >= 0).all() and (decay <= 1).all()  # a strong gate's decay underflows to 0 in float32


# --- RoPE -------------------------------------------------------------------------------------------------------

def test_rope_rotate_half_partial():
    x, positions = normal(5, 2, 16), np.array([0, 1, 2, 40, 300])
    y = rope.rope(x, positions, rotary_dim=8, theta=1e7)
    assert np.array_equal(y[:, :, 8:], x[:, :, 8:]) and np.array_equal(y[0], x[0])
    inv = 1e7 ** (-np.arange(4) * 2 / 8)
    angle = positions[:, None, None] * inv
    x64 = x.astype(np.float64)
    ref = np.concatenate([x64[..., :4] * np.cos(angle) - x64[..., 4:8] * np.sin(angle),
                          x64[..., 4:8] * np.cos(angle) + x64[..., :4] * np.sin(angle)], -1)
    assert np.allclose(y[:, :, :8], ref, rtol=1e-5, atol=1e-6)
    one = rope.rope(x[3:4], positions[3:4], 8, 1e7)
    assert one.tobytes() == y[3:4].tobytes()
    assert rope.rope(x[3:4], positions[3:4] + 1, 8, 1e7).tobytes() != one.tobytes()  # control: off by one


# --- attention --------------------------------------------------------------------------------------------------

def reference_attention(q, keys, values, n_keys, scale):
    share = q.shape[1] // keys.shape[1]
    out = np.empty(q.shape)
    for r in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = keys[:n_keys[r], h // share].astype(np.float64) @ q[r, h] * scale
            p = np.exp(s - s.max())
            out[r, h] = p @ values[:n_keys[r], h // share] / p.sum()
    return out


def test_attention_matches_softmax_and_rows_are_independent():
    keys, values = normal(300, 2, 16), normal(300, 2, 16)
    q, n_keys = normal(5, 4, 16), np.array([1, 127, 128, 129, 300])
    out = attention.attention_merge(*attention.attention_partial(q, keys, values, n_keys, 0.25))
    assert np.allclose(out, reference_attention(q, keys, values, n_keys, 0.25), rtol=1e-4, atol=1e-5)
    for r in range(5):
        alone = attention.attention_merge(*attention.attention_partial(q[r:r + 1], keys, values, n_keys[r:r + 1], 0.25))
        assert alone.tobytes() == out[r:r + 1].tobytes()


def test_attention_chunk_boundary_control(monkeypatch):
    keys, values, q = normal(300, 1, 16), normal(300, 1, 16), normal(1, 1, 16)
    fixed = attention.attention_merge(*attention.attention_partial(q, keys, values, [300], 0.25))
    monkeypatch.setattr(attention, "CHUNK", 64)  # control: a moved chunk boundary changes the sums
    moved = attention.attention_merge(*attention.attention_partial(q, keys, values, [300], 0.25))
    assert moved.tobytes() != fixed.tobytes() and np.allclose(moved, fixed, rtol=1e-5)


def test_a_tree_attention_row_equals_a_one_row_step_over_its_compacted_path():
    """Window rows written at committed + slot: each row reads the committed keys, then its path's keys, in chunks
    cut at logical positions. It equals one row reading a cache holding its path at committed + depth, which is what
    kv_compact leaves for a kept path. Controls: a sibling's key in a row's place; compaction in decreasing depth."""
    parents, committed = paths.TREES["16 rows"], 125  # rows at depth 3 and deeper read keys past the 128 boundary
    depths, slots = paths.depths(parents), paths.path_slots(parents)
    keys, values, q = normal(committed + 16, 2, 16), normal(committed + 16, 2, 16), normal(16, 4, 16)
    n_keys = committed + depths + 1
    out = attention.attention_merge(*attention.attention_partial(q, keys, values, n_keys, 0.25, committed, slots))
    for r in range(16):
        path = list(slots[r, :depths[r] + 1])
        kept_keys, kept_values = kv.kv_compact(keys.copy(), values.copy(), committed, path)
        alone = attention.attention_merge(*attention.attention_partial(q[r:r + 1], kept_keys, kept_values,
                                                                       n_keys[r:r + 1], 0.25))
        assert alone.tobytes() == out[r:r + 1].tobytes(), f"row {r}"
        assert kept_keys[committed:committed + len(path)].tobytes() == keys[committed + np.array(path)].tobytes()
    leaked = slots.copy()
    leaked[15, depths[15]] = 14  # rows 14 and 15 are siblings
    assert attention.attention_merge(*attention.attention_partial(q, keys, values, n_keys, 0.25, committed,
                                                                  leaked))[15].tobytes() != out[15].tobytes()
    path = [0, 2, 5, 9, 13]  # control: moved deepest first, slot 2 is overwritten (by slot 5) before it moves
    backwards = keys.copy()
    for depth, slot in reversed(list(enumerate(path))):
        backwards[committed + depth] = backwards[committed + slot]
    compacted, _ = kv.kv_compact(keys.copy(), values.copy(), committed, path)
    assert backwards.tobytes() != compacted.tobytes()


# --- sampling ---------------------------------------------------------------------------------------------------

def test_uniform_is_a_function_of_seed_and_position():
    draws = [sampling.uniform(7, n) for n in range(1000)]
    assert draws == [sampling.uniform(7, n) for n in range(1000)]
    assert all(0 <= u < 1 for u in draws) and abs(np.mean(draws) - 0.5) < 0.05
    assert draws != [sampling.uniform(8, n) for n in range(1000)]


def test_filters():
    logits = np.log(np.array([0.05, 0.4, 0.3, 0.2, 0.05], np.float32))
    ids, _ = sampling.candidates(logits, 1.0)
    assert list(ids) == [1, 2, 3, 0, 4]  # ties keep the lower id first
    assert list(sampling.candidates(logits, 1.0, top_k=2)[0]) == [1, 2]
    assert list(sampling.candidates(logits, 1.0, top_p=0.69)[0]) == [1, 2]
    assert list(sampling.candidates(logits, 1.0, top_p=0.71)[0]) == [1, 2, 3]
    assert list(sampling.candidates(logits, 1.0, min_p=0.45)[0]) == [1, 2, 3]
    assert list(sampling.candidates(logits, 1.0, min_p=0.55)[0]) == [1, 2]
    assert sampling.sample(logits, 0, 0, temperature=0.0) == 1
    assert all(sampling.sample(logits, 3, n, temperature=1.0, top_k=1) == 1 for n in range(20))


def test_seeded_draws_follow_the_distribution():
    logits = np.log(np.array([0.1, 0.6, 0.3], np.float32))
    counts = np.bincount([sampling.sample(logits, 11, n, temperature=1.0) for n in range(3000)], minlength=3)
    assert np.allclose(counts / 3000, [0.1, 0.6, 0.3], atol=0.03)


def test_numpy_backends_lanes_scan_writes_each_lanes_state_in_place():
    """The numpy backend's one-launch scan of one-row windows (ops.deltanet_scan_lanes): each window's row and its
    lane's state, written over that lane's row of the pool, as the window alone would give; the other lanes' rows
    untouched. Control: the windows' lanes in the other order give other states."""
    from tensorfold.backends import NumpyBackend
    from tensorfold.cuda.deltanet import deltanet_scan
    rng = np.random.default_rng(4)
    pool = rng.normal(size=(4, 2, 3, 5)).astype(np.float32)
    q, k = (rng.normal(size=(2, 1, 3)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(2, 2, 5)).astype(np.float32)
    decay, beta = rng.uniform(0.2, 1, size=(2, 2, 2)).astype(np.float32)
    lanes, out = np.array([2, 0], np.int32), np.empty((2, 2, 5), np.float32)
    scanned = pool.copy()
    log = NumpyBackend().deltanet_scan_lanes(scanned, lanes, q, k, v, decay, beta, out)
    for w, lane in enumerate(lanes):
        one = slice(w, w + 1)
        rows, after, alone = deltanet_scan(pool[lane], q[one], k[one], v[one], decay[one], beta[one])
        assert np.array_equal(out[one], rows) and np.array_equal(scanned[lane], after)
        assert all(np.array_equal(part[one], row) for part, row in zip(log, alone))
    assert np.array_equal(scanned[[1, 3]], pool[[1, 3]])
    swapped = pool.copy()
    NumpyBackend().deltanet_scan_lanes(swapped, lanes[::-1].copy(), q, k, v, decay, beta, np.empty_like(out))
    assert not np.array_equal(swapped, scanned)


def test_numpy_backends_lanes_conv_shifts_each_lanes_tail_in_place():
    """The numpy backend's one-launch conv of one-row windows (ops.causal_conv_lanes): each window's row and its
    lane's new tail, written over that lane's row of the pool, as the window alone gives; the other lanes' rows
    untouched. Control: the windows' lanes in the other order give other tails."""
    from tensorfold.backends import NumpyBackend
    rng = np.random.default_rng(6)
    pool, inputs = rng.normal(size=(4, 3, 5)).astype(np.float32), rng.normal(size=(2, 5)).astype(np.float32)
    weight, lanes = rng.normal(size=(5, 4)).astype(np.float32), np.array([3, 1], np.int32)
    shifted, out = pool.copy(), np.empty((2, 5), np.float32)
    NumpyBackend().causal_conv_lanes(inputs, shifted, lanes, weight, out)
    for w, lane in enumerate(lanes):
        rows, tail = conv.causal_conv(inputs[w:w + 1], pool[lane], weight)
        assert np.array_equal(out[w:w + 1], rows) and np.array_equal(shifted[lane], tail)
    assert np.array_equal(shifted[[0, 2]], pool[[0, 2]])
    swapped = pool.copy()
    NumpyBackend().causal_conv_lanes(inputs, swapped, lanes[::-1].copy(), weight, np.empty_like(out))
    assert not np.array_equal(swapped, shifted)
