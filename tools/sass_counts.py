"""The machine code of the round's hot kernels without a GPU: each kernel's registers, spills and its busiest loop.

numba compiles a kernel to PTX for an H200 (compute capability 9.0) with no device present; ptxas assembles the PTX
and nvdisasm prints the SASS, the instructions the GPU runs. Both come in NVIDIA's wheels, which this tool needs and
the package does not:

    pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvdisasm
    python tools/sass_counts.py

For the exact GEMM at a decode round's shapes (one row, one row of a wide weight, 16 rows) and a prompt chunk's (a
chunk of K a block, and the whole of K a warp), the routed experts' grouped GEMM (a round's, and a prompt's over the
whole of K), their grouping and the router, x's quantize, the residual norm and the DeltaNet scan (of a window, and
of one row for each of several lanes) it prints the registers a thread takes and the blocks of its launch's size that
fit on a multiprocessor with them and its shared memory (`blocks_a_multiprocessor`: where a change of registers costs a
block, the warps that hide each load's latency go with it), the bytes spilled to local memory, and the basic block with
the most multiply-adds (FFMA, or IMMA on the tensor cores): its instruction count and mix. Compiling also catches what
the simulator does not (a shared array sized by an expression, a type numba cannot infer for the GPU). A change to a
loop can be shaped here before it is timed; timings still decide.
"""
import collections
import glob
import math
import os
import re
import subprocess
import sys
import tempfile

COMPUTE_CAPABILITY = (9, 0)
# a compute capability 9.0 multiprocessor: its registers, threads, blocks and shared memory, and the registers a warp
# is given at a time (a warp's registers are a whole number of these)
REGISTERS, THREADS, BLOCKS, SHARED_BYTES, WARP_REGISTER_UNIT = 65536, 2048, 32, 228 << 10, 256
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")  # /*0f70*/ @P0 LDG.E ...


def nvidia_tool(name):
    """The path of `name` (ptxas, nvdisasm) in the installed NVIDIA wheels."""
    import nvidia
    for root in nvidia.__path__:
        found = glob.glob(os.path.join(root, "*", "bin", name)) + glob.glob(os.path.join(root, "*", "*", "bin", name))
        if found:
            return found[0]
    sys.exit(f"{name} not found: pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm (see this file's docstring)")


def without_a_device():
    """numba compiles the device functions a kernel calls for the current device's compute capability, which it asks
    the driver for; with no GPU this answers COMPUTE_CAPABILITY instead."""
    import numba.cuda.dispatcher as dispatcher

    class Device:
        compute_capability = COMPUTE_CAPABILITY
    dispatcher.get_current_device = Device


def blocks_a_multiprocessor(registers, threads, shared_bytes=0):
    """Blocks of `threads` threads, each thread with `registers` registers and each block with `shared_bytes` of
    shared memory, that a multiprocessor holds at once."""
    warps = -(-threads // 32)
    warp_registers = -(-registers * 32 // WARP_REGISTER_UNIT) * WARP_REGISTER_UNIT
    limits = [REGISTERS // (warps * warp_registers), THREADS // (32 * warps), BLOCKS]
    if shared_bytes:
        limits.append(SHARED_BYTES // shared_bytes)
    return min(limits)


def sass(py_func, signature):
    """(registers, spilled bytes, shared bytes, SASS text) of a kernel's Python function compiled for `signature`."""
    from numba import cuda
    ptx, _ = cuda.compile_ptx(py_func, signature, cc=COMPUTE_CAPABILITY)
    arch = "sm_{}{}".format(*COMPUTE_CAPABILITY)
    with tempfile.TemporaryDirectory() as folder:
        source, binary = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        report = subprocess.run([nvidia_tool("ptxas"), f"-arch={arch}", "-v", source, "-o", binary],
                                capture_output=True, text=True, check=True).stderr
        text = subprocess.run([nvidia_tool("nvdisasm"), "-c", binary], capture_output=True, text=True,
                              check=True).stdout
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    shared = re.search(r"(\d+) bytes smem", report)
    return registers, spilled, int(shared.group(1)) if shared else 0, text


def busiest_block(text):
    """The opcodes (modifiers dropped) of the basic block with the most multiply-adds (FFMA and IMMA): a kernel's
    inner loop, unrolled."""
    blocks = [[]]
    for line in text.splitlines():
        if line.strip().startswith(".L_"):  # a label starts a basic block
            blocks.append([])
        match = INSTRUCTION.search(line)
        if match:
            blocks[-1].append(match.group(1))
    return collections.Counter(max(blocks, key=lambda block: block.count("FFMA") + block.count("IMMA")))


def main():
    without_a_device()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from numba import types

    from tensorfold.cuda import deltanet, experts, gemm, gemm_launch, moe, quantize, rmsnorm
    from tensorfold.device.grid import BLOCK
    u32, i32, f32, f64 = (getattr(types, name)[::1] for name in ("uint32", "int32", "float32", "float64"))
    f2, f3, f4, i2 = types.float32[:, ::1], types.float32[:, :, ::1], types.float32[:, :, :, ::1], types.int32[:, ::1]
    # gemm_kernel's arguments (digits, exponents, S, columns, padded rows, codes, words a row, scales, biases,
    # groups a row, partials, rows, outputs)
    products = (u32, i32, i32, types.int64, types.int64, u32, types.int64, f32, f32, types.int64, f64, types.int64,
                types.int64)
    # the round kernel's: products' up to groups a row, then rows, outputs, y and the parts' three ends
    rounds = products[:10] + (types.int64, types.int64, f32, types.int64, types.int64, types.int64)
    round_words = gemm_launch.kernel_shape(1, 4, 64, 2048)[0]
    chunks = 2048 // gemm.CHUNK_COLUMNS
    quantize_threads = math.gcd(BLOCK, 2048 // quantize.QUANTIZE_COLUMNS)
    # (name, kernel, signature, threads a block as launched)
    kernels = [(f"exact GEMM and combine, 4-bit, {name}", gemm.round_kernel(
        4, 64, *gemm_launch.kernel_shape(rows, 4, 64, 2048), chunks, False), rounds, chunks * 32)
        for name, rows in (("1 row", 1), ("16 rows", 16))]
    kernels += [(f"exact GEMM, 4-bit, {name}",
                 gemm.gemm_kernel(4, 64, *gemm_launch.kernel_shape(rows, 4, 64, 2048, outs)), products,
                 gemm.WARPS * 32) for name, rows, outs in (("1 row of a wide weight (gate/up)", 1, 12288),
                                                           ("a prompt chunk", 512, 2048))]
    kernels += [(f"exact GEMM over the whole of K, 4-bit, a prompt chunk's {name}",
                 gemm.whole_kernel(4, 64, *gemm_launch.kernel_shape(2048, 4, 64, columns, outs), gated), rounds,
                 gemm.WARPS * 32) for name, columns, outs, gated in (("gate/up", 2048, 12288, True),
                                                                     ("down", 6144, 2048, False))]
    # the grouped round and whole kernels': products' up to groups a row, then y, pairs, outputs, the tile table (each
    # tile's expert and pairs), x rows a pair
    grouped_finishing = products[:10] + (f32, types.int64, types.int64, i2, types.int64)
    kernels += [("grouped expert GEMM and combine, 4-bit, a round's gate/up", experts.grouped_round_kernel(
                    4, 64, round_words, 1, gemm.ROUND_TILES, chunks, True), grouped_finishing, chunks * 32),
                ("grouped expert GEMM over the whole of K, 4-bit, a prompt chunk's gate/up",
                 experts.grouped_whole_kernel(4, 64, *gemm_launch.kernel_shape(72, 4, 64, 2048), True),
                 grouped_finishing, experts.BLOCK_THREADS),
                ("expert grouping (the pairs sorted by expert)", experts.group_kernel,
                 (i2, types.int64, types.int64, i32, i32), experts.GROUP_THREADS),
                ("the grouping's tile table", experts.tile_kernel, (i32, i32, types.int64, i2), experts.TILE_THREADS),
                ("router (top k of each row's experts), 256 experts", moe.route_kernel(8), (f2, types.int64, i2, f2),
                 32),
                ("router and grouping of a round, 256 experts and the shared one, 16 rows",
                 moe.route_group_kernel(8, 16), (f2, types.int64, i2, f2, types.int64, types.int64, i32, i32,
                                                 types.int64, i2), 16 * 32),
                ("quantize x, 4-bit, a round's layout", quantize.quantize_kernel(4, round_words, 64),
                 (f2, types.int8[:, :, ::1], i2, i2), quantize_threads),
                ("residual norm", rmsnorm.add_rmsnorm_kernel, (f2, f2, f2, types.float64, f2, f2), rmsnorm.THREADS),
                ("DeltaNet scan, dk 128", deltanet.scan_kernel(128),
                 (f4, f3, f3, f3, f2, f2, i32, i2, f3, f4, f2, f3, f3), deltanet.SCAN_THREADS),
                ("DeltaNet scan of one row for each of several lanes, dk 128", deltanet.scan_kernel(128, lanes=True),
                 (f4, f4, i32, f3, f3, f3, f2, f2, f3, f2, f3, f3), deltanet.SCAN_THREADS)]
    for name, kernel, signature, threads in kernels:
        registers, spilled, shared, text = sass(kernel.py_func, signature)
        blocks = blocks_a_multiprocessor(registers, threads, shared)
        loop = busiest_block(text)
        mix = ", ".join(f"{count} {opcode}" for opcode, count in loop.most_common(8))
        print(f"{name}: {registers} registers, {blocks} blocks of {threads} threads a multiprocessor, {spilled} bytes "
              f"spilled; loop {sum(loop.values())} instructions: {mix}")


if __name__ == "__main__":
    main()
