"""Lane rounds on the GPU at Qwen3.5-0.8B's shapes (random weights, all 24 layers: the session's lanes_model, see
conftest.py): drafted chains and trees equal undrafted, concurrent equals solo, deferred keep on and off, and a
stream of more than 8,192 keys beside a short one.

Runs only with `pytest --gpu`; without a GPU, `TENSORFOLD_TEST_LANES=numpy` runs the same checks on the twins with
the tiny config, and `TENSORFOLD_TEST_LANES=sim` on the kernels in numba's CUDA simulator with a micro config (far
too slow for the long stream)."""
import os

import numpy as np
import pytest
from test_lanes import OracleDrafter, OracleTreeDrafter

from tensorfold.drafters import NgramDrafter
from tensorfold.engine import Engine, SamplingParams
from tensorfold.model.cache import KeepPolicy
from tensorfold.model.rows import Window

pytestmark = [] if os.environ.get("TENSORFOLD_TEST_LANES") else pytest.mark.gpu


@pytest.fixture(scope="module")
def model(lanes_model):
    return lanes_model


@pytest.mark.parametrize("late", [True, False])
@pytest.mark.parametrize("tokens, sampling", [(24, dict(temperature=0.0)), (8, dict(temperature=0.8, seed=3))])
def test_rounds_equal_solo_with_and_without_drafts_and_deferred_keep(model, tokens, sampling, late):
    prompts = [list(np.random.default_rng(i).integers(0, 500, 5 + 7 * i)) for i in range(4)]
    solo = [model.generate(p, tokens, stop_ids=(), **sampling) for p in prompts]
    for drafter in (NgramDrafter(), OracleDrafter(prompts, solo), OracleTreeDrafter(prompts, solo)):
        engine = Engine(model, parallel=4, drafter=drafter, keep=KeepPolicy(late=late), context=4096)
        requests = [engine.submit(p, SamplingParams(max_tokens=tokens, stop_ids=(), **sampling)) for p in prompts]
        while engine.run_round():
            pass
        assert [r.output for r in requests] == solo, (sampling, late, drafter.name)


def test_a_long_stream_beside_a_short_one(model):
    rng = np.random.default_rng(5)
    long_prompt, short_prompt = list(rng.integers(0, 500, 8300)), list(rng.integers(0, 500, 7))
    long_alone, short_alone = model.net.new_state(), model.net.new_state()
    for i in range(0, len(long_prompt), 128):
        model.net.forward(long_prompt[i:i + 128], long_alone, "last")
    model.net.forward(short_prompt, short_alone)
    long_step = model.backend.to_host(model.net.forward([11], long_alone))
    short_chain = model.backend.to_host(model.net.forward([12, 13, 14], short_alone))
    long_state, short_state = model.net.new_state(), model.net.new_state()
    for i in range(0, len(long_prompt), 128):
        model.net.forward(long_prompt[i:i + 128], long_state, "last")
    model.net.forward(short_prompt, short_state)
    together = model.net.forward_round([Window(long_state, [11]), Window(short_state, [12, 13, 14])])
    assert long_state.length + 1 > 8192
    assert model.backend.to_host(together[0]).tobytes() == long_step.tobytes()
    assert model.backend.to_host(together[1]).tobytes() == short_chain.tobytes()
