"""The weight formats, in NumPy: bf16 bit patterns and MLX affine quantization (packed codes with a bf16 scale
and bias per group of columns).

An MLX affine weight stores, for each output row and each group of `group_size` columns, a scale and a bias; a
weight is `scale * code + bias`, with the codes packed `32 // bits` to a uint32, element 0 in the lowest bits.
"""
import numpy as np

from tensorfold.numerics.floats import fma_rn_twin


def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """float32 values to bf16 bit patterns, rounding to nearest even; NaN stays a quiet NaN. The sum fits 32 bits for
    every pattern but a NaN's (-inf's, the largest that is not, gives 0xFF807FFF), and a NaN's is replaced."""
    values = np.asarray(values, np.float32)
    bits = values.view(np.uint32)
    one, half = np.uint32(1), np.uint32(0x7FFF)
    rounded = ((bits + half + ((bits >> np.uint32(16)) & one)) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def significant_bits(values):
    """The significant bits of each float32 value (int array): 0 for a zero, else the bits from the highest set one
    of its significand (the implicit one of a normal number included) to the lowest set one."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    fraction = (bits & np.uint32(0x7FFFFF)).astype(np.int64)
    significand = np.where(bits & np.uint32(0x7F800000), fraction | (1 << 23), fraction)
    lowest = significand & -significand  # the lowest set bit alone
    return np.where(significand == 0, 0, np.floor(np.log2(np.maximum(significand, 1))).astype(np.int64)
                    - np.floor(np.log2(np.maximum(lowest, 1))).astype(np.int64) + 1)


def affine_rows(packed, scales, biases, bits, group_size, outs):
    """Dequantize the rows `outs` of an affine-quantized weight: float32 [len(outs), K]."""
    per_word = 32 // bits
    words = packed[outs]  # [rows, K / per_word]
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)  # element e of a word sits at bit bits * e
    codes = ((words[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)).reshape(len(words), -1)
    return fma_rn_twin(np.repeat(scales[outs], group_size, axis=1), codes.astype(np.float32),
                       np.repeat(biases[outs], group_size, axis=1))


def quantize_affine(weight, bits, group_size):
    """MLX affine quantization of a float32 [out, in]: (packed uint32 codes, bf16 scales, bf16 biases).

    Per group of `group_size` columns: bias = the group minimum, scale = range / (2^bits - 1), both rounded to
    bf16 first, so the codes are chosen against the scales the file stores.
    """
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // group_size, group_size).astype(np.float32)
    low, high = groups.min(axis=2), groups.max(axis=2)
    levels = (1 << bits) - 1
    scale_bits = f32_to_bf16(np.maximum((high - low) / levels, np.float32(1e-8)))
    bias_bits = f32_to_bf16(low)
    scales = (scale_bits.astype(np.uint32) << 16).view(np.float32)
    biases = (bias_bits.astype(np.uint32) << 16).view(np.float32)
    codes = np.clip(np.rint((groups - biases[:, :, None]) / scales[:, :, None]), 0, levels).astype(np.uint32)
    codes = codes.reshape(out_features, in_features // (32 // bits), 32 // bits)
    shifts = (np.arange(32 // bits, dtype=np.uint32) * bits)[None, None, :]
    packed = np.bitwise_or.reduce(codes << shifts, axis=2).astype(np.uint32)  # element 0 in the lowest bits
    return packed, scale_bits, bias_bits
