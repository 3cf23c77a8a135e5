"""Reading and writing the safetensors format, with every check a hostile or broken file needs.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor name to its dtype,
shape and [begin, end) byte range in the data that follows, and the data. Nothing in it is executable, and nothing
here ever unpickles. bf16 tensors are read and kept as their uint16 bit patterns (NumPy has no bf16 type).
"""
import json
import math
import os
import struct

import numpy as np

from tensorfold.errors import CheckpointError
from tensorfold.model.files import brief, open_checkpoint_file, parse_json

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32,
          "U8": np.uint8, "I64": np.int64, "F64": np.float64, "U16": np.uint16}
MAX_HEADER_BYTES = 100 << 20  # the format's own limit on the JSON header
MAX_DIMS = 32  # more than any tensor has, and within what every NumPy reshapes to
MAX_NAME_CHARS = 1024  # a tensor name must print on one line of an error message


class TensorInfo:
    """Where one tensor lives: its file, dtype name, shape and absolute byte range."""

    __slots__ = ("begin", "dtype", "end", "name", "path", "shape")

    def __init__(self, name, path, dtype, shape, begin, end):
        self.name, self.path, self.dtype, self.shape, self.begin, self.end = name, path, dtype, tuple(shape), begin, end

    def read(self) -> np.ndarray:
        """The tensor's values (bf16 as uint16 bits)."""
        with open_checkpoint_file(self.path) as f:
            f.seek(self.begin)
            data = f.read(self.end - self.begin)
        if len(data) != self.end - self.begin:
            raise CheckpointError(f"tensor {self.name}: {self.path} is truncated")
        return np.frombuffer(data, dtype=DTYPES[self.dtype]).reshape(self.shape).copy()


def read_header(path) -> dict[str, TensorInfo]:
    """Parse and check the header of one safetensors file: every tensor's dtype, shape and byte range.

    Byte counts are Python integers, so no shape can wrap around to a small size; every range must lie inside the
    file, and no two tensors may share a byte.
    """
    with open_checkpoint_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a safetensors file: it is {size} bytes long")
        (header_bytes,) = struct.unpack("<Q", head)
        if header_bytes > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path} is not a safetensors file: header length {header_bytes} is over the "
                                  f"format's limit of {MAX_HEADER_BYTES} bytes")
        if header_bytes > size - 8:
            raise CheckpointError(f"{path} is not a safetensors file or is truncated: header length {header_bytes}, "
                                  f"file size {size}")
        header = parse_json(f.read(header_bytes), f"{path}: the safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    data_start = 8 + header_bytes
    tensors = {name: _tensor_info(path, name, entry, data_start, size - data_start)
               for name, entry in header.items() if name != "__metadata__"}
    _check_no_overlap(path, tensors.values(), data_start)
    return tensors


def _tensor_info(path, name: str, entry, data_start: int, data_bytes: int) -> TensorInfo:
    """One header entry, checked: a known dtype, a shape of non-negative ints, a byte range of exactly its size."""
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise CheckpointError(f"{path}: tensor name {brief(name)} is not a printable name of at most "
                              f"{MAX_NAME_CHARS} characters")
    where = f"tensor {name} in {path}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise CheckpointError(f"{where}: malformed header entry {brief(entry)} (expected an object with dtype, "
                              f"shape and data_offsets)")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"{where}: unsupported dtype {brief(dtype)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_size(d) for d in shape):
        raise CheckpointError(f"{where}: invalid shape {brief(shape)} (expected a list of at most {MAX_DIMS} "
                              f"non-negative integers)")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_size(o) for o in offsets):
        raise CheckpointError(f"{where}: invalid data_offsets {brief(offsets)} (expected [begin, end], "
                              f"non-negative integers)")
    begin, end = offsets
    expected = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if end - begin != expected:
        raise CheckpointError(f"{where}: byte range [{begin}, {end}) does not hold {dtype} {brief(shape)} "
                              f"({brief(expected)} bytes)")
    if end > data_bytes:
        raise CheckpointError(f"{where}: the file is truncated (the tensor ends at byte {data_start + end}, the "
                              f"file has {data_start + data_bytes})")
    return TensorInfo(name, path, dtype, shape, data_start + begin, data_start + end)


def _check_no_overlap(path, tensors, data_start: int) -> None:
    """Refuse two tensors that share a byte: each tensor's data must be its own."""
    previous = None
    for info in sorted((t for t in tensors if t.end > t.begin), key=lambda t: t.begin):
        if previous is not None and info.begin < previous.end:
            raise CheckpointError(f"{path}: tensors {previous.name} and {info.name} overlap (data bytes "
                                  f"[{previous.begin - data_start}, {previous.end - data_start}) and "
                                  f"[{info.begin - data_start}, {info.end - data_start}))")
        if previous is None or info.end > previous.end:
            previous = info


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0  # JSON true is an int in Python


def write_file(path, tensors: dict[str, tuple[str, np.ndarray]], metadata: dict | None = None) -> None:
    """Write `{name: (dtype name, array)}` as one safetensors file (bf16 given as uint16 bits)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, array) in tensors.items():
        blob = np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
