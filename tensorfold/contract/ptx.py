"""The checks of ptx.py's `load_words`: a run of words copied in the widest loads its length and place allow (16
bytes, 8, or word by word), against NumPy's slice of the same words. A small kernel calls it, one thread a run.
`mma_s8u8`, `load16` and `load8` run inside the exact GEMM, whose checks (gemm.py's) cover every fragment of them.
The control plants a source shifted by one word: a load that started a word late would read that."""
import functools

import numpy as np
from numba import cuda

from tensorfold.contract import KernelCheck
from tensorfold.cuda.ptx import load_width, load_words
from tensorfold.device.grid import to_host
from tensorfold.device.launch import kernel

# words a run: every width `load_width` picks (16-byte loads for 4 and 8, 8-byte for 2 and 6, single words for 1
# and 3); under the simulator a warp of runs, on the GPU many blocks of them
COUNTS = [4, 8, 2, 6, 1, 3]


@functools.cache
def copy_kernel(count):
    """A kernel whose thread t copies run t of `count` words through `load_words` and registers."""
    width = load_width(count)

    @kernel
    def copy(source, target):
        t = cuda.grid(1)
        if t < target.shape[0] // count:
            words = cuda.local.array(count, np.uint32)
            load_words(source, np.uint64(t * count), count, width, words, 0)
            for u in range(count):
                target[t * count + u] = words[u]

    return copy


def _cases(mode, rng):
    runs = 32 if mode == "sim" else 1 << 16
    return [(f"runs of {count} words", {"source": rng.integers(0, 1 << 32, count * runs, dtype=np.uint64)
                                        .astype(np.uint32), "count": count}) for count in COUNTS]


def _twin(source, count):
    return source.view(np.float32).copy()  # compared as float32 bytes: the words' bits as they are


def _launch(source, count):
    target = cuda.device_array(len(source), np.uint32)
    copy_kernel(count)[-(-len(source) // count // 128), 128](cuda.to_device(source), target)
    return to_host(target).view(np.float32)


def _shifted_one_word(inputs):
    return {**inputs, "source": np.roll(inputs["source"], 1)}


CONTRACT = [
    KernelCheck("load_words", _twin, _launch, _cases, {"the source one word late": _shifted_one_word},
                kernels=(load_words,)),
]
