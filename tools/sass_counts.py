"""The machine code of the GEMV kernels without a GPU: each kernel's registers, spills and its busiest loop.

numba compiles a kernel to PTX for an H200 (compute capability 9.0) with no device present; ptxas assembles the PTX
and nvdisasm prints the SASS, the instructions the GPU runs. Both come in NVIDIA's wheels, which this tool needs and
the package does not:

    pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvdisasm
    python tools/sass_counts.py

For each GEMV shape a decode or prefill round uses it prints the registers a thread takes (which decide how many
blocks share an SM), the bytes spilled to local memory, and the loop with the most FFMA: its instruction count and
its instruction mix. For the kernels of receipt 2026-12-01-h200-ahead these are the counts that `inspect_sass`
gave on the H200 (ptxas 12.9 here), so a change to a loop can be shaped before it is timed; timings still decide.
"""
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

COMPUTE_CAPABILITY = (9, 0)
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


def sass(py_func, signature):
    """(registers, spilled bytes, SASS text) of a kernel's Python function compiled for `signature`."""
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
    return registers, spilled, text


def busiest_block(text):
    """The opcodes (modifiers dropped) of the basic block with the most FFMA: a kernel's inner loop, unrolled."""
    blocks = [[]]
    for line in text.splitlines():
        if line.strip().startswith(".L_"):  # a label starts a basic block
            blocks.append([])
        match = INSTRUCTION.search(line)
        if match:
            blocks[-1].append(match.group(1))
    return collections.Counter(max(blocks, key=lambda block: block.count("FFMA")))


def main():
    without_a_device()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from numba import types

    from tensorfold.cuda import gemv
    flat = {name: getattr(types, name)[::1] for name in ("uint64", "uint32", "float32")}
    tile = (flat["uint64"], types.int64, types.int64, flat["uint32"], types.int64, flat["float32"],
            flat["float32"], types.int64, flat["float32"]) + (types.int64,) * 5
    row = tile[:1] + tile[2:]  # the one-row kernel takes x as it is: no count of rounds
    kernels = [(f"tile, {rows} rows x {outputs} outputs a warp{', gated' if gated else ''}",
                gemv.gemv_kernel(gemv.affine_format(4, 64), rows, outputs, gated), tile)
               for rows, outputs, gated in [(8, 4, False), (8, 2, False), (4, 4, False), (4, 2, False), (4, 2, True)]]
    kernels += [(f"one row, {outputs} outputs x {step} chunks a warp", gemv.affine_row_kernel(4, 64, outputs, step), row)
                for outputs, step in [(gemv.ROW_OUTPUTS, gemv.ROW_STEP), (gemv.NARROW_OUTPUTS, gemv.NARROW_STEP)]]
    for name, kernel, signature in kernels:
        registers, spilled, text = sass(kernel.py_func, signature)
        loop = busiest_block(text)
        mix = ", ".join(f"{count} {opcode}" for opcode, count in loop.most_common(8))
        print(f"{name}: {registers} registers, {spilled} bytes spilled; loop {sum(loop.values())} instructions: {mix}")


if __name__ == "__main__":
    main()
