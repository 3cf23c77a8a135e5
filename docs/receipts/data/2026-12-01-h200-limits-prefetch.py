"""Scratch: does prefetching the next GEMV's weights into L2 on a side branch of the recorded round help?
python3 .samp/prefetch.py MODE STREAMS  (MODE: off | bulk | bulk2 | lines)"""
import json
import sys

import numpy as np
from llvmlite import ir
from numba import cuda
from numba.cuda import types
from numba.cuda.extending import intrinsic

from tensorfold import bench_local
from tensorfold.backend import CudaBackend
from tensorfold.cuda import graphs

MODE = sys.argv[1]
STREAMS = [int(s) for s in sys.argv[2].split(",")]
TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 64


@intrinsic
def bulk_prefetch(typingctx, address, size):
    def codegen(context, builder, signature, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)]),
                           "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", side_effect=True)
        builder.call(asm, args)
    return types.void(types.uint64, types.uint32), codegen


@intrinsic
def line_prefetch(typingctx, address):
    def codegen(context, builder, signature, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64)]),
                           "prefetch.global.L2::evict_last [$0];", "l", side_effect=True)
        builder.call(asm, args)
    return types.void(types.uint64), codegen


PIECE = 1 << 15


@cuda.jit
def bulk_kernel(base, nbytes):
    start = np.uint64(cuda.grid(1)) * np.uint64(PIECE)
    if start < nbytes:
        size = min(np.uint64(PIECE), nbytes - start)
        bulk_prefetch(base + start, np.uint32(size))


@cuda.jit
def line_kernel(base, nbytes):
    at = np.uint64(cuda.grid(1)) * np.uint64(128)
    if at < nbytes:
        line_prefetch(base + at)


LIMIT = 20 << 20  # bytes of one weight prefetched at most (the head is 250 MB: its first part only)
next_of, last, state = {}, [None], {}


def prefetch(array, stream, held):
    base = np.uint64(array.device_ctypes_pointer.value)
    nbytes = np.uint64(min(array.nbytes, LIMIT) // 16 * 16)
    if MODE.startswith("bulk"):
        bulk_kernel[max(1, -(-int(nbytes) // (PIECE * 128))), 128, stream](base, nbytes)
    else:
        bulk = -(-int(nbytes) // 128)
        line_kernel[max(1, -(-bulk // 256)), 256, stream](base, nbytes)
    held.append(array)


original_gemv = CudaBackend._gemv


def gemv_with_prefetch(self, x, weight, **options):
    recording = graphs.recording()
    key = id(weight.data)
    if recording is None:
        if last[0] is not None and last[0] != key:
            next_of.setdefault(last[0], weight)
        last[0] = key
    elif MODE != "off" and key in next_of:
        side = state.setdefault("side", cuda.stream())
        fork = cuda.event(timing=False)
        fork.record(self.stream)
        fork.wait(side)
        recording.held.append(fork)
        targets = [next_of[key]]
        if MODE == "bulk2" and id(targets[0].data) in next_of:
            targets.append(next_of[id(targets[0].data)])
        for target in targets:
            for array in (target.data, target.scales, target.biases):
                if array is not None:
                    prefetch(array, side, recording.held)
        state["used"] = True
    return original_gemv(self, x, weight, **options)


original_exit = graphs.Recording.__exit__


def exit_with_join(self, kind, error, traceback):
    if state.pop("used", False):
        joined = cuda.event(timing=False)
        joined.record(state["side"])
        joined.wait(self.stream)
        self.held.append(joined)
    return original_exit(self, kind, error, traceback)


CudaBackend._gemv = gemv_with_prefetch
graphs.Recording.__exit__ = exit_with_join


def main():
    import tensorfold
    folder = bench_local.checkpoint_folder("2B", 0, "/tmp/tfcache")
    model = tensorfold.load(folder, backend="cuda")
    warm = cuda.device_array(1 << 20, np.uint8)
    prefetch(warm, 0, [])  # compile both before any recording
    cuda.synchronize()
    rng = np.random.default_rng(0)
    out = {"mode": MODE}
    for streams in STREAMS:
        level = bench_local.decode_rate(model, streams, TOKENS, 2, 32, rng)
        out[streams] = level["ms_per_round"]
        print(f"{MODE} x{streams}: {level['ms_per_round']:.3f} ms a round, {level['tok_s']:.1f} tok/s "
              f"({level['graph_rounds']})", flush=True)
    print("JSON", json.dumps(out))


if __name__ == "__main__":
    main()
