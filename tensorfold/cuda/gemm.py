"""GEMM over rows of x with MLX affine 4- and 8-bit weights, in exact integers: y[r, o] = sum_k W[o, k] * x[r, k].

The arithmetic. An affine weight is w[o, k] = s[o, g] * q[o, k] + b[o, g], with q a 4- or 8-bit code and one scale s and
bias b per group g of `group_size` columns. x is made integer per row and group, from the row's own values:

    e[r, g] = the frexp exponent of max_{k in g} |x[r, k]|     (a group of zeros: X = 0 whatever e is)
    X[r, k] = floor(x[r, k] * 2^(P - e) + 0.5)                 in float64, exact; |X| <= 2^P, P = 22
    X = d0 + 256 d1 + 65536 d2,  d0, d1, d2 in [-128, 127]      (balanced base 256: three signed bytes)

P = 22 is the largest that three signed digits hold: X can round up to 2^P, and 127 * (1 + 256 + 65536) < 2^23. Then,
per group, in exact integers and then in float64 in an order fixed by K alone:

    D_l[r, o, g] = sum_{k in g} q[o, k] * d_l[r, k]              int32, exact in any order (the tensor cores)
    D = D0 + 256 D1 + 65536 D2,  S[r, g] = sum_{k in g} X[r, k]   exact (below 2^53)
    t = s[o, g] * D + b[o, g] * S                                 products exact (`exact_factor_bits`), one rounding
    partial_c += t * 2^(e[r, g] - P)   for the groups g of chunk c, in increasing order    float64
    acc += partial_c                   for c = 0, 1, 2, ...  (chunks of CHUNK_COLUMNS columns)  float64
    y[r, o] = float32(acc)

The order is fixed by K alone; the chunks let the kernel split K across warps (each chunk's partial sum is computed on
its own, and the partial sums are added in chunk order afterwards). Every product is exact, so the multiply-add fusion
NVVM applies cannot change a bit, and a row's result depends on that row alone: a prompt's rows equal one-row steps. The
only approximation is X's rounding, at most 2^-(P+1) of the group's largest |x| an element.

The twin, `gemm_affine`, forms D with BLAS matrix products on integer-valued float64 arrays (exact: every partial sum
stays below 2^53, whatever order BLAS takes), then runs the fixed-order loop over the chunks and their groups.

The kernels: quantize.py's `quantize_kernel` writes x's digits, exponents and S (`fixed_point`, which the twin runs);
`tile_products`, a warp's work as a device function, multiplies with `mma_s8u8` (ptx.py) on rows and weight rows its
caller places (`gemm_kernel`: consecutive rows; experts.py's grouped kernel: an expert's rows, gathered);
`combine_kernel` finishes. The combination builds D, S and 2^(e - P) from their bits (fmath's `exact_float64` and
`power_of_two`): no conversion instruction, no branch, the same values. A warp's tile is 8 outputs (the mma's columns)
by the rows of 8 * `row_halves` rows: lane (g, t) feeds the weights of output g and the digits of rows g + 8 * rho, and
gets back outputs 2t and 2t + 1 of every row and digit it fed, so the combination above stays in the lane. The mma's 16
A rows carry (row, digit, group) combinations: tile row g + 8 * xi of mma mu is combination 2 mu + xi. A step is one
load of `words` words of codes a lane; a word of eight 4-bit codes is two B registers, `w & 0x0F0F0F0F` and `(w >> 4) &
0x0F0F0F0F`, the columns in even/odd order; x's digits are laid out in that same order (quantize.py's `digit_position`:
an integer sum does not care which column comes first, only that A and B agree). When a step's columns cover several
groups, lane t holds group t * halves / 4, and each group's digits go in an A row of their own (zero in the other
lanes). A round's rows (up to 16) take 16-byte loads and read the weights once whatever their count; a prompt chunk
takes steps of one group where the group is that wide (8-byte loads of 4-bit codes, 16-byte of digits; no mma carries a
zero A row) and several tiles of rows a warp, reusing each B register. A block works on one chunk of K (the grid's third
axis) and writes its float64 partial sums; the combine adds them in chunk order and writes the float32 outputs:
SiLU(gate) * up for the gated form (gate rows, then up rows), each part whole for stacked projections (`output_index`).
Most of a round's calls take `round_kernel` instead: a warp a chunk of one tile of outputs, the partial sums in the
block's shared memory, the same finish in the block. A prompt chunk's calls, whose rows fill the GPU without splitting
K, take `whole_kernel`: each warp walks every chunk of K, adds their partial sums to its sums in shared memory in chunk
order, and finishes its own outputs."""
import functools

import numpy as np
from numba import cuda

from tensorfold.cuda.fmath import exact_float64, power_of_two, silu32
from tensorfold.cuda.gemv import output_index
from tensorfold.cuda.ptx import load_width, load_words, mma_s8u8, prefetch_l2
from tensorfold.cuda.quantize import LIMBS, P, quantize_x, step_shape
from tensorfold.device.launch import kernel, kernel_waiting_inside, wait_for_inputs

CHUNK_COLUMNS = 512  # columns of K a float64 partial sum covers (whole groups, whole kernel steps)
TILE_ELEMENTS = 1 << 21  # the twin's D for a tile of outputs holds about this many values


def affine_codes(packed, bits):
    """The codes of packed MLX words [out, K * bits / 32], float64 [out, K] (element 0 of a word in its low bits):
    the words' bytes in memory order (little-endian), each byte one 8-bit code or two 4-bit codes, the low nibble
    first."""
    data = np.ascontiguousarray(packed, dtype="<u4").view(np.uint8)  # [out, K * bits / 8]
    if bits == 8:
        return data.astype(np.float64)
    codes = np.empty((len(packed), 2 * data.shape[1]), np.float64)
    codes[:, 0::2], codes[:, 1::2] = data & 15, data >> 4
    return codes


def gemm_affine(x, packed, scales, biases, bits, group_size):
    """The twin: y float32 [rows, out] for x [rows, K] and an MLX affine weight (packed uint32 [out, K * bits / 32],
    float32 scales and biases [out, K / group_size]), in the arithmetic of the module's docstring."""
    rows, columns = np.shape(x)
    out_features, groups = packed.shape[0], columns // group_size
    X, e, S = quantize_x(x, group_size)
    X_groups = X.reshape(rows, groups, group_size).transpose(1, 0, 2)  # [groups, rows, group_size]
    power = np.ldexp(1.0, e - P)  # [rows, groups]: 2^(e - P), exact
    y = np.empty((rows, out_features), np.float32)
    tile = max(1, TILE_ELEMENTS // (groups * max(rows, group_size)))
    for first in range(0, out_features, tile):
        outs = slice(first, min(first + tile, out_features))
        codes = affine_codes(packed[outs], bits).reshape(-1, groups, group_size).transpose(1, 2, 0)
        D = np.matmul(X_groups, codes)  # [groups, rows, outputs]: exact integers
        s, b = np.asarray(scales[outs], np.float64), np.asarray(biases[outs], np.float64)
        acc = np.zeros((rows, codes.shape[2]))
        chunk_groups = CHUNK_COLUMNS // group_size
        for first_group in range(0, groups, chunk_groups):  # the chunks in order, as the combine adds them
            partial = np.zeros_like(acc)
            for g in range(first_group, min(first_group + chunk_groups, groups)):  # its groups in increasing order
                t = s[None, :, g] * D[g] + b[None, :, g] * S[:, g, None]
                partial = partial + t * power[:, g, None]
            acc = acc + partial
        y[:, outs] = acc.astype(np.float32)
    return y


# --- the kernels (see the module's docstring) ---------------------------------------------------------------------

WARPS = 4  # warps a block
ROUND_ROWS = 16  # rows up to which a call takes the round kernel (one tile of rows, 16-byte loads)
PROMPT_ROW_HALVES = 4  # the prompt kernel's tile: 32 rows a warp
ROUND_TILES = 2  # tiles of 8 outputs a warp of the round kernel (the step's digits serve both)
WIDE_TILES = 4  # and for up to 8 rows of a weight of at least WIDE_OUTPUTS outputs: more codes in flight a warp
WIDE_OUTPUTS = 8192  # (a smaller weight needs the warps more: with 4 tiles it would fill fewer multiprocessors)
PROMPT_TILES = 4  # tiles of the prompt kernel
ROUND_CHUNKS = WARPS  # chunks of K up to which a round's block adds them itself, a warp a chunk (launch_products)
WHOLE_BLOCKS = 4  # blocks a multiprocessor from which a warp walks the whole of K (`whole_fills`)


@functools.cache
def tile_products(bits, group_size, words, row_halves, tiles, ahead=False, early=False, waits=False):
    """The GEMM's work of a warp, a device function, for a weight format (bits, group_size), steps of `words` words of
    codes a lane, tiles of 8 * row_halves rows and `tiles` tiles of 8 outputs a warp: the float64 partial sums of one
    chunk of K. With `ahead`, a step's scales, biases, exponents and S are loaded before its codes, so that all its
    loads are in flight together (where the registers allow it: a round's tile of one row half). With `early`, the codes
    of every step of the chunk are loaded before the first step, so that the warp waits on memory once a chunk, not once
    a step; each step then moves the next step's codes to the front of b_words (constant places keep them in registers,
    where an index that varies would put them in local memory): the round kernel's one-row 4-bit tiles. With `waits`,
    the warp waits for its inputs here (launch.wait_for_inputs), after the early codes' loads or after asking L2 for the
    chunk's weights, which no kernel writes: they come while the kernel before finishes. The caller places the tile:
    lane (g, t) reads the digits of x rows x_rows[rho] (its rows g + 8 rho); tile n holds outputs bases[n] .. bases[n] +
    7 of the weight, whose outputs start at row `first_weight` of packed, scales and biases (an expert's, in a stack of
    experts); the partial sum of chunk c, row out_rows[rho] (none where negative) and the tile's output j goes to
    partials[c * chunk_stride + out_rows[rho] * row_stride + slots[n] + j] (global memory for a separate combine, or the
    block's shared memory), or with `adds` is added to what is there (`whole_tile`: the chunks one after another into
    one sum)."""
    span, mmas = step_shape(bits, words)
    assert 4 * group_size >= span and (span % group_size == 0 or group_size % span == 0), "whole groups a lane"
    assert CHUNK_COLUMNS % span == 0 and CHUNK_COLUMNS % group_size == 0, "whole steps and groups a chunk"
    halves = max(1, span // group_size)  # groups a step covers: lane t holds group t * halves // 4
    steps_a_group = max(1, group_size // span)
    combos = LIMBS * halves * row_halves  # (row half rho, digit l, group h) = ((rho * LIMBS) + l) * halves + h
    tile_mmas = -(-combos // 2)  # mmas a tile of outputs and a mma of the step
    lane_words = 2 * mmas  # words of digits a lane reads a step, a digit row
    accumulators = tiles * tile_mmas * 4
    code_width, digit_width = load_width(words), load_width(lane_words)  # the widest loads a lane's words allow
    low = np.uint32(0x0F0F0F0F)
    # the local arrays' sizes, constants of the closure: numba takes a size that is a name, not an expression
    group_slots, digit_slots, partial_slots = tiles * 2, LIMBS * row_halves, tiles * row_halves * 2
    chunk_steps = CHUNK_COLUMNS // span
    a_slots, b_slots = LIMBS * row_halves * lane_words, tiles * words * (chunk_steps if early else 1)
    scale_slots, row_slots = tiles * 2 * halves, row_halves * halves

    @cuda.jit(device=True)
    def a_word(a_words, c, j, m, mine):
        """The A register of combination c (an mma's tile row) meeting B register j of mma m: the lane's word of
        digit l of row half rho where c's group is the lane's own; zero elsewhere and past the last combination."""
        if c >= combos or c % halves != mine:
            return np.uint32(0)
        q = c // halves % LIMBS * row_halves + c // halves // LIMBS  # the digit row (l, rho) of a_words
        return a_words[q * lane_words + m * 2 + j]

    @cuda.jit(device=True)
    def step_values(exponents, sums, scales, biases, groups, x_rows, group_rows, first_group, step_exponents,
                    step_sums, step_scales, step_biases):
        """The lane's values of the groups a step ends (from `first_group` on): each row's e and S, each output's
        scale and bias."""
        for h in range(halves):
            group = np.uint64(first_group + h)
            for rho in range(row_halves):
                row = np.uint64(x_rows[rho] * groups)
                step_exponents[rho * halves + h] = exponents[row + group]
                step_sums[rho * halves + h] = sums[row + group]
            for n in range(tiles):
                for oo in range(2):
                    at = group_rows[n * 2 + oo] + group
                    held = (n * 2 + oo) * halves + h
                    step_scales[held], step_biases[held] = scales[at], biases[at]

    @cuda.jit(device=True)
    def products(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, partials,
                 chunk_stride, row_stride, out_features, first_weight, chunk, bases, slots, x_rows, out_rows, adds):
        lane = cuda.threadIdx.x % 32
        g, t = lane >> 2, lane % 4
        weight_rows = cuda.local.array(tiles, np.uint64)  # where the codes of the tile's output g start
        group_rows = cuda.local.array(group_slots, np.uint64)  # where the scales of outputs 2t, 2t + 1 start
        for n in range(tiles):
            weight_rows[n] = np.uint64(first_weight + min(bases[n] + g, out_features - 1)) * np.uint64(width)
            for oo in range(2):
                output = first_weight + min(bases[n] + 2 * t + oo, out_features - 1)
                group_rows[n * 2 + oo] = np.uint64(output) * np.uint64(groups)
        digit_rows = cuda.local.array(digit_slots, np.uint64)  # where lane's digits of (l, rho) start
        for q in range(LIMBS * row_halves):
            row = x_rows[q % row_halves]
            digit_rows[q] = np.uint64((q // row_halves * rows_pad + row) * (columns // 4) + t * lane_words)
        acc = cuda.local.array(accumulators, np.int32)
        partial = cuda.local.array(partial_slots, np.float64)
        a_words = cuda.local.array(a_slots, np.uint32)
        b_words = cuda.local.array(b_slots, np.uint32)
        step_exponents = cuda.local.array(row_slots, np.int32)  # the values of the groups the step ends
        step_sums = cuda.local.array(row_slots, np.int32)
        step_scales = cuda.local.array(scale_slots, np.float32)
        step_biases = cuda.local.array(scale_slots, np.float32)
        for i in range(accumulators):
            acc[i] = 0
        for i in range(partial_slots):
            partial[i] = 0.0
        mine = t * halves // 4  # the group of the step this lane's columns are in
        if bases[0] < out_features:  # a warp past the last output has nothing to do (whole warps: mma needs all lanes)
            first_step, end_step = chunk * chunk_steps, min((chunk + 1) * chunk_steps, columns // span)
            if early:  # the codes of every step of the chunk, in flight together
                for i in range(chunk_steps):
                    if first_step + i < end_step:
                        for n in range(tiles):
                            load_words(packed, weight_rows[n] + np.uint64((first_step + i) * 4 * words + t * words),
                                       words, code_width, b_words, (i * tiles + n) * words)
            elif waits:  # ask L2 for the chunk's codes (lane t: a quarter of output g's), scales and biases
                quarter = min(first_step * 4 * words + t * (CHUNK_COLUMNS * bits // 128), end_step * 4 * words - 1)
                for n in range(tiles):
                    prefetch_l2(packed, weight_rows[n] + np.uint64(quarter))
                    for oo in range(2):
                        prefetch_l2(scales, group_rows[n * 2 + oo] + np.uint64(first_step * span // group_size))
                        prefetch_l2(biases, group_rows[n * 2 + oo] + np.uint64(first_step * span // group_size))
            if waits:
                wait_for_inputs()
            for s in range(first_step, end_step):
                ends_groups = (s + 1) % steps_a_group == 0
                first_group = s * span // group_size  # the step's first group, or the group it is inside
                if ends_groups and ahead:
                    step_values(exponents, sums, scales, biases, groups, x_rows, group_rows, first_group,
                                step_exponents, step_sums, step_scales, step_biases)
                for n in range(tiles):  # the codes of output g, this lane's words of the step
                    if not early:
                        load_words(packed, weight_rows[n] + np.uint64(s * 4 * words + t * words), words, code_width,
                                   b_words, n * words)
                for q in range(LIMBS * row_halves):  # the digits of rows g + 8 rho, this lane's words of the step
                    load_words(digits, digit_rows[q] + np.uint64(s * span // 4), lane_words, digit_width, a_words,
                               q * lane_words)
                for m in range(mmas):
                    for n in range(tiles):
                        if bits == 4:
                            b0 = b_words[n * words + m] & low
                            b1 = (b_words[n * words + m] >> np.uint32(4)) & low
                        else:
                            b0, b1 = b_words[n * words + 2 * m], b_words[n * words + 2 * m + 1]
                        for mu in range(tile_mmas):
                            a0 = a_word(a_words, 2 * mu, 0, m, mine)
                            a1 = a_word(a_words, 2 * mu + 1, 0, m, mine)
                            a2 = a_word(a_words, 2 * mu, 1, m, mine)
                            a3 = a_word(a_words, 2 * mu + 1, 1, m, mine)
                            at = (n * tile_mmas + mu) * 4
                            d = mma_s8u8(a0, a1, a2, a3, b0, b1, acc[at], acc[at + 1], acc[at + 2], acc[at + 3])
                            acc[at], acc[at + 1], acc[at + 2], acc[at + 3] = d[0], d[1], d[2], d[3]
                if early:  # the next step's codes to the front (constant places: b_words stays in registers)
                    for j in range(b_slots - tiles * words):
                        b_words[j] = b_words[j + tiles * words]
                if ends_groups:  # the step ends its groups: add them to the partial sums, in order
                    if not ahead:
                        step_values(exponents, sums, scales, biases, groups, x_rows, group_rows, first_group,
                                    step_exponents, step_sums, step_scales, step_biases)
                    for rho in range(row_halves):
                        for h in range(halves):
                            power = power_of_two(step_exponents[rho * halves + h] - P)
                            S = exact_float64(step_sums[rho * halves + h])
                            for n in range(tiles):
                                for oo in range(2):
                                    c = rho * LIMBS * halves + h  # digit 0's combination; digit l's l * halves on
                                    d0 = acc[(n * tile_mmas + c // 2) * 4 + c % 2 * 2 + oo]
                                    c += halves
                                    d1 = acc[(n * tile_mmas + c // 2) * 4 + c % 2 * 2 + oo]
                                    c += halves
                                    d2 = acc[(n * tile_mmas + c // 2) * 4 + c % 2 * 2 + oo]
                                    D = exact_float64(np.int64(d0) + (np.int64(d1) << np.int64(8)) +
                                                      (np.int64(d2) << np.int64(16)))
                                    held = (n * 2 + oo) * halves + h
                                    value = np.float64(step_scales[held]) * D + np.float64(step_biases[held]) * S
                                    partial[(n * row_halves + rho) * 2 + oo] += value * power
                    for i in range(accumulators):
                        acc[i] = 0
            for n in range(tiles):
                for rho in range(row_halves):
                    row = out_rows[rho]
                    for oo in range(2):
                        o = bases[n] + 2 * t + oo
                        if row >= 0 and o < out_features:
                            at = np.uint64(chunk * chunk_stride + row * row_stride + slots[n] + 2 * t + oo)
                            prior = partials[at] if adds else 0.0  # the combine's order: 0.0 + chunk 0 + chunk 1 ...
                            partials[at] = prior + partial[(n * row_halves + rho) * 2 + oo]

    return products


@cuda.jit(device=True)
def warp_tiles(bases, tiles):
    """bases[n] = the first output of the warp's tile n, for blocks of WARPS warps of `tiles` tiles of 8 outputs."""
    for n in range(tiles):
        bases[n] = ((cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32) * tiles + n) * 8


@cuda.jit(device=True)
def lane_rows(x_rows, out_rows, rows, row_halves):
    """A lane's rows of row tile y (the block's): row y * 8 * row_halves + g + 8 rho, which writes nothing (-1)
    from `rows` on (it reads the quantize kernel's zero rows)."""
    for rho in range(row_halves):
        x_rows[rho] = cuda.blockIdx.y * 8 * row_halves + cuda.threadIdx.x % 32 // 4 + 8 * rho
        out_rows[rho] = x_rows[rho] if x_rows[rho] < rows else -1


@functools.cache
def gemm_kernel(bits, group_size, words, row_halves, tiles):
    """The GEMM kernel (`tile_products`): block (x, y, z) takes outputs from (x * WARPS + warp) * tiles * 8 on, the rows
    of row tile y, chunk z of K; rows past the last read the quantize kernel's zero rows and write nothing."""
    products = tile_products(bits, group_size, words, row_halves, tiles, ahead=row_halves == 1)

    @kernel
    def gemm(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, partials, rows,
             out_features):
        x_rows = cuda.local.array(row_halves, np.int64)
        out_rows = cuda.local.array(row_halves, np.int64)
        lane_rows(x_rows, out_rows, rows, row_halves)
        bases = cuda.local.array(tiles, np.int64)
        warp_tiles(bases, tiles)
        products(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, partials,
                 rows * out_features, out_features, out_features, 0, cuda.blockIdx.z, bases, bases, x_rows, out_rows,
                 False)

    return gemm


@functools.cache
def round_tile(bits, group_size, words, row_halves, tiles, chunks, gated, early=False, waits=False):
    """A round block's tile and its combine, as a device function (no partial sums through global memory, no combine
    launch): the block's `chunks` warps take the outputs of `tiles` tiles of 8 from block x * tiles * 8 on (gated: half
    the tiles gate rows from x * tiles * 4 on, half the up rows of the same outputs), of the weight whose outputs start
    at row `first_weight`. Warp w computes chunk w of K (`tile_products`) into shared memory, lane (g, t) on x rows
    x_rows[rho] of its tile rows g + 8 rho; then a thread per (row of the tile, output written) finishes it as the
    combine kernel does (`finish_output`) into the y row y_rows[rho] of that tile row (none where negative), which warp
    0's lanes (g, 0) post for the block. `early`, `waits`: as `tile_products` takes them."""
    products = tile_products(bits, group_size, words, row_halves, tiles, row_halves == 1, early, waits)
    tile_rows, tile_outputs = 8 * row_halves, 8 * tiles
    written = tile_outputs // 2 if gated else tile_outputs  # outputs a block writes
    sum_slots = chunks * tile_rows * tile_outputs  # a name: numba takes a shared array's size as one
    assert not gated or tiles % 2 == 0, "a gated block holds as many up tiles as gate tiles"

    @cuda.jit(device=True)
    def tile(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features,
             first_weight, x_rows, y_rows, y, rows, end1, end2, end3):
        chunk_sums = cuda.shared.array(sum_slots, np.float64)  # [chunk, row of the tile, output of the tile]
        tile_y_rows = cuda.shared.array(tile_rows, np.int64)  # the y row of each row of the tile
        count = out_features // 2 if gated else out_features  # outputs of y
        slot_rows = cuda.local.array(row_halves, np.int64)  # the lane's rows of the tile: its sums' slots
        for rho in range(row_halves):
            slot_rows[rho] = cuda.threadIdx.x % 32 // 4 + 8 * rho
            if cuda.threadIdx.x < 32 and cuda.threadIdx.x % 4 == 0:
                tile_y_rows[slot_rows[rho]] = y_rows[rho]
        bases = cuda.local.array(tiles, np.int64)
        slots = cuda.local.array(tiles, np.int64)
        for n in range(tiles):
            up = gated and n >= tiles // 2
            bases[n] = cuda.blockIdx.x * written + (n - tiles // 2 if up else n) * 8 + (count if up else 0)
            slots[n] = n * 8
        products(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, chunk_sums,
                 tile_rows * tile_outputs, tile_outputs, out_features, first_weight, cuda.threadIdx.x // 32, bases,
                 slots, x_rows, slot_rows, False)
        if waits:
            wait_for_inputs()  # a warp past the last output waited nowhere yet
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, tile_rows * written, cuda.blockDim.x):
            r, j = i // written, i % written
            row, o = tile_y_rows[r], cuda.blockIdx.x * written + j
            if row >= 0 and o < count:
                finish_output(chunk_sums, r * tile_outputs + j, tile_rows * tile_outputs, chunks, written, gated, y,
                              row, o, rows, out_features, end1, end2, end3)

    return tile


@functools.cache
def round_kernel(bits, group_size, words, row_halves, tiles, chunks, gated):
    """The GEMM and its combine in one launch, for a round's few rows (`round_tile`): block (x, y) of `chunks` warps
    takes row tile y; a padded row reads the quantize kernel's zero digits and is finished into no row of y. A tile of
    one row half of 4-bit codes loads its chunk's codes first (`early`), which measured faster there (8-bit codes would
    hold twice the registers). It starts its weights' loads before it waits for x's quantize (`waits`)."""
    tile = round_tile(bits, group_size, words, row_halves, tiles, chunks, gated, row_halves == 1 and bits == 4, True)

    @kernel_waiting_inside  # in `tile`
    def round_gemm(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, rows,
                   out_features, y, end1, end2, end3):
        x_rows = cuda.local.array(row_halves, np.int64)
        y_rows = cuda.local.array(row_halves, np.int64)
        lane_rows(x_rows, y_rows, rows, row_halves)
        tile(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features, 0,
             x_rows, y_rows, y, rows, end1, end2, end3)

    return round_gemm


@cuda.jit(device=True)
def finish_output(partials, at, chunk_stride, chunks, up_offset, gated, y, row, o, rows, out_features, end1, end2,
                  end3):
    """Output o of row `row` from its partial sums (partials[at + c * chunk_stride] for chunk c) added in chunk order:
    float32 into y where `output_index` places it, or gated SiLU(gate) * up with the up row's sums up_offset on."""
    total, up = 0.0, 0.0
    for chunk in range(chunks):
        total += partials[at + chunk * chunk_stride]
        if gated:
            up += partials[at + chunk * chunk_stride + up_offset]
    if gated:
        y[row * (out_features // 2) + o] = silu32(np.float32(total)) * np.float32(up)
    else:
        y[output_index(row, o, rows, out_features, end1, end2, end3)] = np.float32(total)


@functools.cache
def combine_kernel(gated):
    """Thread per (row, output written): `finish_output` on the GEMM kernel's partial sums [chunks, rows, outputs]."""

    @kernel
    def combine(partials, chunks, rows, out_features, y, end1, end2, end3):
        i = cuda.grid(1)
        count = out_features // 2 if gated else out_features
        row, o = i // count, i % count
        if row < rows:
            finish_output(partials, row * out_features + o, rows * out_features, chunks, count, gated, y, row, o,
                          rows, out_features, end1, end2, end3)

    return combine


@cuda.jit(device=True)
def whole_bases(bases, tiles, written, gated, count):
    """bases[n] = the first output of tile n of a warp that writes `written` outputs, from (block x * WARPS + warp) *
    written on; gated, the first tiles / 2 tiles are gate outputs and the rest the up outputs of the same outputs (the
    up rows start at `count`, the outputs written)."""
    first = (cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32) * written
    for n in range(tiles):
        up = gated and n >= tiles // 2
        bases[n] = first + (n - tiles // 2 if up else n) * 8 + (count if up else 0)


@functools.cache
def whole_tile(bits, group_size, words, row_halves, tiles, gated):
    """A warp's tile over the whole of K, finished in the same kernel (no partial sums through global memory, no combine
    launch), as a device function: `tile_products` chunk after chunk of K, each chunk's partial sums added to the warp's
    sums in the block's shared memory in chunk order (the combine's order), then each lane writes its own outputs as
    `finish_output` does. The caller places the tile (bases, from `whole_bases`; x_rows) and names the y row of each row
    half (y_rows, none where negative); y holds `rows` rows, gated [rows, out_features / 2]."""
    products = tile_products(bits, group_size, words, row_halves, tiles)
    tile_rows, tile_outputs = 8 * row_halves, 8 * tiles
    warp_slots = tile_rows * tile_outputs
    sum_slots = WARPS * warp_slots  # a name: numba takes a shared array's size as one
    written_tiles = tiles // 2 if gated else tiles
    assert not gated or tiles % 2 == 0, "a gated warp holds as many up tiles as gate tiles"

    @cuda.jit(device=True)
    def whole(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features,
              first_weight, bases, x_rows, y_rows, y, rows, end1, end2, end3):
        warp_sums = cuda.shared.array(sum_slots, np.float64)  # [warp, row of the tile, output of the tile]
        warp, g, t = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32 // 4, cuda.threadIdx.x % 4
        tile_row = cuda.local.array(row_halves, np.int64)
        slots = cuda.local.array(tiles, np.int64)
        for rho in range(row_halves):
            tile_row[rho] = g + 8 * rho
        for n in range(tiles):
            slots[n] = warp * warp_slots + n * 8
        for chunk in range(-(-columns // CHUNK_COLUMNS)):  # each lane adds to its own slots: no barrier needed
            products(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, warp_sums, 0,
                     tile_outputs, out_features, first_weight, chunk, bases, slots, x_rows, tile_row, chunk > 0)
        count = out_features // 2 if gated else out_features
        for n in range(written_tiles):
            for rho in range(row_halves):
                for oo in range(2):
                    o = bases[n] + 2 * t + oo
                    at = slots[n] + tile_row[rho] * tile_outputs + 2 * t + oo
                    if y_rows[rho] >= 0 and o < count:
                        total = np.float32(warp_sums[at])
                        if gated:  # the up output's sums are written_tiles tiles on
                            y[y_rows[rho] * count + o] = silu32(total) * np.float32(warp_sums[at + written_tiles * 8])
                        else:
                            y[output_index(y_rows[rho], o, rows, out_features, end1, end2, end3)] = total

    return whole


@functools.cache
def whole_kernel(bits, group_size, words, row_halves, tiles, gated):
    """The GEMM over the whole of K and its finish in one launch (`whole_tile`), for a prompt chunk's many rows: block
    (x, y) takes row tile y, and its warp w the outputs from (x * WARPS + w) * written on (written: 8 * tiles, or 4 *
    tiles gated, `whole_bases`)."""
    whole = whole_tile(bits, group_size, words, row_halves, tiles, gated)
    written = 4 * tiles if gated else 8 * tiles

    @kernel
    def gemm_whole(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, rows,
                   out_features, y, end1, end2, end3):
        x_rows = cuda.local.array(row_halves, np.int64)
        y_rows = cuda.local.array(row_halves, np.int64)
        lane_rows(x_rows, y_rows, rows, row_halves)
        bases = cuda.local.array(tiles, np.int64)
        whole_bases(bases, tiles, written, gated, out_features // 2 if gated else out_features)
        whole(digits, exponents, sums, columns, rows_pad, packed, width, scales, biases, groups, out_features, 0,
              bases, x_rows, y_rows, y, rows, end1, end2, end3)

    return gemm_whole
