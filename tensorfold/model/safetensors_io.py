"""Reading and writing the safetensors format, with every check a hostile or broken file needs.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor name to its dtype,
shape and [begin, end) byte range in the data that follows, and the data. Nothing in it is executable, and nothing
here ever unpickles. bf16 tensors are read and kept as their uint16 bit patterns (NumPy has no bf16 type).
"""
import json
import os
import struct

import numpy as np

from tensorfold.errors import CheckpointError

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32,
          "U8": np.uint8, "I64": np.int64, "F64": np.float64, "U16": np.uint16}
MAX_HEADER_BYTES = 100 << 20  # the format's own limit on the JSON header


class TensorInfo:
    """Where one tensor lives: its file, dtype name, shape and absolute byte range."""

    __slots__ = ("name", "path", "dtype", "shape", "begin", "end")

    def __init__(self, name, path, dtype, shape, begin, end):
        self.name, self.path, self.dtype, self.shape, self.begin, self.end = name, path, dtype, tuple(shape), begin, end

    def read(self) -> np.ndarray:
        """The tensor's values (bf16 as uint16 bits)."""
        with open(self.path, "rb") as f:
            f.seek(self.begin)
            data = f.read(self.end - self.begin)
        if len(data) != self.end - self.begin:
            raise CheckpointError(f"tensor {self.name}: {self.path} is truncated")
        return np.frombuffer(data, dtype=DTYPES[self.dtype]).reshape(self.shape).copy()


def read_header(path) -> dict[str, TensorInfo]:
    """Parse and check the header of one safetensors file: every tensor's dtype, shape and byte range."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a safetensors file: it is {size} bytes long")
        (header_bytes,) = struct.unpack("<Q", head)
        if header_bytes > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path} is not a safetensors file or is truncated: header length {header_bytes}")
        try:
            header = json.loads(f.read(header_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    data_start = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CheckpointError(f"tensor {name} in {path}: malformed header entry {entry!r}") from None
        if dtype not in DTYPES:
            raise CheckpointError(f"tensor {name} in {path}: unsupported dtype {dtype}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"tensor {name} in {path}: invalid shape {shape}")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        if not (isinstance(begin, int) and isinstance(end, int)) or end - begin != expected or begin < 0:
            raise CheckpointError(f"tensor {name} in {path}: byte range [{begin}, {end}) does not hold "
                                  f"{dtype} {list(shape)} ({expected} bytes)")
        if data_start + end > size:
            raise CheckpointError(f"tensor {name} in {path}: the file is truncated (the tensor ends at byte "
                                  f"{data_start + end}, the file has {size})")
        tensors[name] = TensorInfo(name, path, dtype, shape, data_start + begin, data_start + end)
    return tensors


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
