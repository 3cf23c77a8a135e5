"""Stacked projections (qwen35.PROJECTIONS): the projections of a layer that read the same x run as one GEMV over
their stacked rows, and each projection's output must keep the bits its own GEMV gives."""
import numpy as np
import pytest

import tensorfold


def separate_and_stacked(net, x, prefix):
    """Each projection of the group through its own weight (a view of the stack), and the group through `project`."""
    from tensorfold.model.projections import PROJECTIONS
    names = [n for n in PROJECTIONS[prefix.split(".", 2)[2]]]
    ops = net.ops
    separate = [ops.to_host(ops.linear(x, net.weights[prefix + name + ".weight"])) for name in names]
    stacked = [ops.to_host(y) for y in net.project(x, prefix)]
    return separate, stacked


def equal(a, b):
    return len(a) == len(b) and all(u.shape == v.shape and u.tobytes() == v.tobytes() for u, v in zip(a, b))


@pytest.mark.parametrize("form", ["mlx4", "hf"])
def test_stacked_projections_equal_each_projection(form, tiny_mlx4, tiny_hf):
    model = tensorfold.load(tiny_mlx4 if form == "mlx4" else tiny_hf, backend="numpy")
    net, rng = model.net, np.random.default_rng(0)
    assert {p.split(".", 2)[2] for p in net.projections} == {"linear_attn.", "self_attn.", "mlp."}
    for prefix, gemvs in net.projections.items():
        x = rng.normal(size=(3, model.config.hidden_size)).astype(np.float32)
        separate, stacked = separate_and_stacked(net, x, prefix)
        assert equal(separate, stacked), prefix
        # No weight is held twice: each projection's weight is a view of its stack.
        weight, widths = gemvs[0]
        first = net.weights[prefix + {"linear_attn.": "in_proj_qkv", "self_attn.": "q_proj",
                                      "mlp.": "gate_proj"}[prefix.split(".", 2)[2]] + ".weight"]
        assert np.shares_memory(first.data, weight.data) and len(widths) > 1
    # Planted: the stacked output cut one column off (the same widths, each boundary moved by one) must fail.
    for prefix in net.projections:
        x = rng.normal(size=(2, model.config.hidden_size)).astype(np.float32)
        separate, _ = separate_and_stacked(net, x, prefix)
        weight, widths = net.projections[prefix][0]
        shifted = np.roll(net.ops.linear(x, weight), 1, axis=1)
        cut = np.split(shifted, np.cumsum(widths)[:-1], axis=1)
        assert equal(separate[:len(widths)], np.split(net.ops.linear(x, weight), np.cumsum(widths)[:-1], axis=1))
        assert not equal(separate[:len(widths)], cut), prefix


def test_stacked_projections_in_the_simulator(tmp_path, monkeypatch, on_gpu):
    """The cuda backend's stacked GEMV writes each projection's output whole, at one row and at several."""
    if on_gpu:
        pytest.skip("under --gpu the exactness suite runs the stacked GEMVs at real widths")
    from test_backend_sim import MICRO

    from tensorfold.cuda import gemv, rmsnorm
    from tensorfold.model.tiny import make_tiny
    monkeypatch.setattr(gemv, "THREADS", 8)
    monkeypatch.setattr(rmsnorm, "THREADS", 8)
    make_tiny(tmp_path, seed=0, config=MICRO, fmt="mlx4")
    cpu, sim = tensorfold.load(str(tmp_path), backend="numpy"), tensorfold.load(str(tmp_path), backend="cuda")
    rng = np.random.default_rng(1)
    for rows in (1, 3):
        x = rng.normal(size=(rows, MICRO.hidden_size)).astype(np.float32)
        for prefix in sim.net.projections:
            separate, stacked = separate_and_stacked(sim.net, sim.backend.upload(x), prefix)
            assert equal(separate, stacked), (rows, prefix)
            assert equal(separate_and_stacked(cpu.net, x, prefix)[1], stacked), (rows, prefix)
        for prefix in [p for p in sim.net.projections if p.endswith("mlp.")]:  # the gated GEMV: SiLU(gate) * up
            gate, up = separate_and_stacked(cpu.net, x, prefix)[0]
            fused = sim.backend.to_host(sim.net.ops.swiglu(sim.backend.upload(x), sim.net.projections[prefix][0][0]))
            assert fused.tobytes() == cpu.net.ops.silu_mul(gate, up).tobytes(), (rows, prefix)
            assert fused.tobytes() != cpu.net.ops.silu_mul(up, gate).tobytes(), "planted: gate and up swapped"


def test_mlp_of_gate_and_up_in_different_forms(tmp_path, tiny_mlx4):
    """Gate and up of different forms (one 8-bit, one 4-bit) are two GEMVs and a product; in one form, one gated
    GEMV; both give down(SiLU(gate(x)) * up(x)) computed projection by projection. Control: the same with gate and
    up swapped gives other bytes, so the comparison catches a path that mixes them up."""
    import json
    import os

    from test_checkpoint import rewrite

    from tensorfold.numerics.formats import quantize_affine
    model = tensorfold.load(tiny_mlx4, backend="numpy")
    gate = model.net.weights["layers.0.mlp.gate_proj.weight"].dense()
    packed, scales, biases = quantize_affine(gate, 8, 64)
    module = "language_model.model.layers.0.mlp.gate_proj"

    def change(tensors):
        tensors.update({module + ".weight": ("U32", packed), module + ".scales": ("BF16", scales),
                        module + ".biases": ("BF16", biases)})
        return tensors
    folder = str(tmp_path / "mixed")
    rewrite(tiny_mlx4, folder, change)
    config = json.load(open(os.path.join(folder, "config.json")))
    for key in ("quantization", "quantization_config"):
        config[key][module] = {"bits": 8, "group_size": 64}
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    x = np.random.default_rng(2).normal(size=(3, model.config.hidden_size)).astype(np.float32)
    for net, stacks in ((model.net, 1), (tensorfold.load(folder, backend="numpy").net, 2)):
        p, ops, w = "layers.0.mlp.", net.ops, net.weights
        assert len(net.projections[p]) == stacks
        gate, up = ops.linear(x, w[p + "gate_proj.weight"]), ops.linear(x, w[p + "up_proj.weight"])
        mlp = net.mlp(x, p).tobytes()
        assert mlp == ops.linear(ops.silu_mul(gate, up), w[p + "down_proj.weight"]).tobytes()
        assert mlp != ops.linear(ops.silu_mul(up, gate), w[p + "down_proj.weight"]).tobytes()  # the control
