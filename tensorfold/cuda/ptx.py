"""PTX instructions that numba does not emit, reached through inline assembly, each with a form for the simulator.

* `mma_s8u8`: one warp's tensor-core multiply-add `mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32`,
  D = A @ B + C with A [16, 32] signed bytes, B [32, 8] unsigned bytes and C, D [16, 8] int32. Every lane holds a
  piece of each (PTX ISA, "Matrix Fragments for mma.m16n8k32"), with g = lane >> 2 and t = lane % 4:
  A register i (4 bytes, the lowest first) holds row g + 8 * (i & 1), columns 4t + 16 * (i >> 1) + 0..3;
  B register j holds column g, rows 4t + 16j + 0..3; accumulator i holds row g + 8 * (i >> 1), column 2t + (i & 1).
  The sums are exact integers (int32 wraps only past 2^31, which no caller reaches).
* `load16`: four uint32 words of a global array in one 16-byte load (`ld.global.nc.v4.u32`, the read-only
  path); the index is a word index, a multiple of 4 (the address must be 16-byte aligned). numba reads an array
  element by element, at most 8 bytes a load. `load8`: two words in one 8-byte load (`ld.global.nc.v2.u32`), the
  index a multiple of 2 (numba would read a uint32 array's words one by one).
* `load_words`: a run of words in the widest of those loads that its length and place allow (`load_width`).
* `prefetch_l2`: bring the 128-byte line that holds a word of a global array into the L2 cache
  (`prefetch.global.L2`), loading nothing into registers: a later load of it waits on the cache, not on memory.
* `shfl_xor`: the value of lane `lane ^ mask` of the warp (`shfl.sync.bfly`), which numba emits itself
  (`cuda.shfl_xor_sync`) but its simulator lacks.

A numba `@intrinsic` types each call and emits the instruction with llvmlite's `ir.InlineAsm`. The simulator
cannot run PTX, so under it each function is Python that computes the same values: `load16` reads the four
words (and refuses an address that the GPU's load would fault on), and `mma_s8u8` has every lane give its registers
to its warp (`simulator.warp_share`: one meeting of the warp's lanes, the block's other warps going on) and compute
its own four accumulators from the whole warp's registers (the fragments unpacked into A and B by the index tables
below, and multiplied as int64 NumPy matrices: exact, so the same integers); `shfl_xor` the same way, a value a lane.
All 32 lanes of a warp must call them together, as on the GPU.
"""
import numpy as np
from numba import cuda

from tensorfold.device import SIMULATED, simulator

FULL_WARP = 0xFFFFFFFF  # shfl_xor's lanes: the whole warp

if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def mma_s8u8(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C on the tensor cores: (d0, d1, d2, d3), the lane's accumulators (see the docstring)."""
        sig = types.UniTuple(types.int32, 4)(*([types.uint32] * 6 + [types.int32] * 4))

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32] * 10),
                               "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, "
                               "{$8,$9}, {$10,$11,$12,$13};", "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r")
            out = builder.call(asm, list(args))
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(out, i) for i in range(4)])

        return sig, codegen

    def vector_load(count):
        """An intrinsic (w0, .., w{count-1}) = array[index:index + count] of a uint32 array in one load of `count`
        words (`ld.global.nc.v{count}.u32`; index a multiple of count, so that the address is aligned)."""
        outputs = ",".join(f"${i}" for i in range(count))
        text = f"ld.global.nc.v{count}.u32 {{{outputs}}}, [${count}];"
        constraints = ",".join(["=r"] * count + ["l"])

        @intrinsic
        def load(typingctx, array, index):
            sig = types.UniTuple(types.uint32, count)(array, types.uint64)

            def codegen(context, builder, signature, args):
                i32, i64 = ir.IntType(32), ir.IntType(64)
                data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
                address = builder.add(builder.ptrtoint(data, i64), builder.mul(args[1], ir.Constant(i64, 4)))
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * count), [i64]), text, constraints)
                out = builder.call(asm, [address])
                words = [builder.extract_value(out, i) for i in range(count)]
                return context.make_tuple(builder, signature.return_type, words)

            return sig, codegen

        return load

    load16, load8 = vector_load(4), vector_load(2)

    @intrinsic
    def prefetch_l2(typingctx, array, index):
        """Word `index` of a global array's line, into L2 (see the docstring)."""
        sig = types.void(array, types.uint64)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
            itemsize = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
            address = builder.add(builder.ptrtoint(data, i64), builder.mul(args[1], ir.Constant(i64, itemsize)))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64]), "prefetch.global.L2 [$0];", "l",
                               side_effect=True)
            builder.call(asm, [address])

        return sig, codegen

    @cuda.jit(device=True)
    def shfl_xor(value, mask, lanes):
        """Lane `lane ^ mask`'s value, every lane of `lanes` (a bit a lane: FULL_WARP, or a block's fewer threads)
        taking part."""
        return cuda.shfl_xor_sync(lanes, value, mask)
else:
    # Where A[row, k] and B[k, column] sit in the warp's registers: (lane, register, byte) per element.
    _K = np.arange(32)
    A_LANE = (np.arange(16)[:, None] % 8) * 4 + (_K % 16) // 4  # [16, 32]
    A_REGISTER = np.arange(16)[:, None] // 8 + 2 * (_K // 16)
    B_LANE = np.arange(8)[None, :] * 4 + (_K[:, None] % 16) // 4  # [32, 8]
    B_REGISTER = np.broadcast_to(4 + _K[:, None] // 16, (32, 8))
    SHIFT = 8 * (_K % 4)  # byte k % 4 of its word, the lowest first

    @cuda.jit(device=True)
    def mma_s8u8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """The simulator's form: the warp's registers exchanged (`simulator.warp_share`; see the docstring)."""
        lane = cuda.threadIdx.x % 32
        words = np.array(simulator.warp_share((a0, a1, a2, a3, b0, b1)), np.int64)  # [lane, register]
        a = (words[A_LANE, A_REGISTER] >> SHIFT[None, :]) & 255
        a = np.where(a > 127, a - 256, a)  # signed bytes
        b = (words[B_LANE, B_REGISTER] >> SHIFT[:, None]) & 255  # unsigned bytes
        product = a @ b  # [16, 8], exact in int64
        g, t = lane >> 2, lane % 4
        sums = [int(c) + int(product[g + 8 * (i >> 1), 2 * t + (i & 1)]) for i, c in enumerate((c0, c1, c2, c3))]
        return np.int32(sums[0]), np.int32(sums[1]), np.int32(sums[2]), np.int32(sums[3])

    def aligned(array, index, words):
        """Whether a load of `words` words may start at word `index` of `array` on the GPU: its address a multiple of
        the load's bytes (a misaligned vector load faults there; the simulator's reads would not notice)."""
        return (simulator.address(array) + 4 * int(index)) % (4 * words) == 0

    @cuda.jit(device=True)
    def load16(array, index):
        """The simulator's form: the four words, read one by one."""
        assert aligned(array, index, 4)
        i = int(index)
        return np.uint32(array[i]), np.uint32(array[i + 1]), np.uint32(array[i + 2]), np.uint32(array[i + 3])

    @cuda.jit(device=True)
    def load8(array, index):
        """The simulator's form: the two words, read one by one."""
        assert aligned(array, index, 2)
        i = int(index)
        return np.uint32(array[i]), np.uint32(array[i + 1])

    @cuda.jit(device=True)
    def prefetch_l2(array, index):
        """The simulator's form: nothing (the simulator has no cache); the index must still be in the array."""
        assert int(index) < len(array)

    @cuda.jit(device=True)
    def shfl_xor(value, mask, lanes):
        """The simulator's form (every lane of the warp takes part; `lanes` names them): the value its partner gave."""
        return simulator.warp_share(value)[cuda.threadIdx.x % 32 ^ mask]


@cuda.jit(device=True)
def load_words(source, at, count, width, target, first):
    """target[first:first + count] = source[at:at + count] of uint32 arrays in loads of `width` words: 16-byte loads
    for 4 (count and at multiples of 4), 8-byte loads for 2 (multiples of 2), else word by word."""
    if width == 4:
        for u4 in range(count // 4):
            got = load16(source, at + np.uint64(4 * u4))
            for u in range(4):
                target[first + 4 * u4 + u] = got[u]
    elif width == 2:
        for u2 in range(count // 2):
            pair = load8(source, at + np.uint64(2 * u2))
            target[first + 2 * u2], target[first + 2 * u2 + 1] = pair[0], pair[1]
    else:
        for u in range(count):
            target[first + u] = source[at + np.uint64(u)]


def load_width(words):
    """The widest load (4, 2 or 1 words) that `words` consecutive words at a multiple of `words` take whole."""
    return 4 if words % 4 == 0 else 2 if words % 2 == 0 else 1
