"""The checks of weights.py: the embedding lookup of every weight format. (The formats the GEMV holds a chunk in
are checked through the GEMV, contract/gemv.py.)"""
import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.contract.controls import roll, swap_rows
from tensorfold.cuda.weights import embed_affine_kernel, embed_bf16_kernel, embed_f32_kernel, launch_embed
from tensorfold.device.grid import to_host
from tensorfold.numerics.formats import affine_rows, bf16_to_f32, f32_to_bf16, quantize_affine


def _embed_cases(mode, rng):
    vocab, width, rows = (40, 128, 5) if mode == "sim" else (248320, 1024, 128)
    weight = rng.standard_normal((vocab, width), np.float32)
    packed, scales, biases = quantize_affine(weight, 4, 64)
    ids = rng.integers(0, vocab, rows).astype(np.int32)
    return [(f"{rows} ids of {vocab}x{width}", {"ids": ids, "weight": weight, "packed": packed,
                                                "scales": bf16_to_f32(scales), "biases": bf16_to_f32(biases)})]


def _embed_twin(ids, weight, packed, scales, biases):
    return weight[ids], bf16_to_f32(f32_to_bf16(weight[ids])), affine_rows(packed, scales, biases, 4, 64, ids)


def _embed_launch(ids, weight, packed, scales, biases):
    d_ids, width = cuda.to_device(ids), weight.shape[1]
    return (to_host(launch_embed(embed_f32_kernel, d_ids, width, cuda.to_device(weight))),
            to_host(launch_embed(embed_bf16_kernel, d_ids, width, cuda.to_device(f32_to_bf16(weight)))),
            to_host(launch_embed(embed_affine_kernel, d_ids, width, cuda.to_device(packed), cuda.to_device(scales),
                                 cuda.to_device(biases), 4, 64)))


def _next_id(inputs):
    """Planted: every id one higher (the last wrapping round to the first), as a lookup off by one row would."""
    return {**inputs, "ids": (inputs["ids"] + 1) % len(inputs["weight"])}


CONTRACT = [
    KernelCheck("embed (f32, bf16, affine4)", _embed_twin, _embed_launch, _embed_cases,
                {"two swapped ids": swap_rows("ids"), "id off by one": _next_id, "a wrong group index": roll("scales")},
                kernels=(embed_f32_kernel, embed_bf16_kernel, embed_affine_kernel)),
]
