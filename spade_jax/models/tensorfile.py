"""Reading and writing the safetensors format, tensor by tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header
({name: {"dtype", "shape", "data_offsets": [begin, end]}}, plus an optional
"__metadata__" of strings) and the raw little-endian tensor bytes. Reading
memory-maps the file, so a tensor is a zero-copy view and only the slices that
are asked for are ever copied. Writing streams one tensor at a time, so
exporting never holds the whole model on the host.

Multi-file checkpoints follow the Hugging Face convention:
`model.safetensors.index.json` = {"metadata": {...}, "weight_map": {name: file}}.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def dtype_name(dtype) -> str:
  """numpy dtype -> safetensors dtype string."""
  dt = np.dtype(dtype)
  if dt not in _NAMES:
    raise ValueError(f"dtype {dt} has no safetensors code; supported: "
                     f"{sorted(str(d) for d in _NAMES)}.")
  return _NAMES[dt]


class SafetensorsFile:
  """One memory-mapped .safetensors file."""

  def __init__(self, path: str):
    self.path = path
    if not os.path.isfile(path):
      raise FileNotFoundError(f"Safetensors file {path!r} does not exist.")
    with open(path, "rb") as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise ValueError(f"{path!r} is not a safetensors file (shorter than 8 bytes).")
      (n,) = struct.unpack("<Q", raw)
      try:
        header = json.loads(f.read(n))
      except ValueError as e:
        raise ValueError(f"{path!r}: unreadable safetensors header ({e}).") from e
    self.metadata = header.pop("__metadata__", {}) or {}
    self.entries = header
    self._data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if header else None

  def keys(self) -> list[str]:
    return list(self.entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.entries[name]["shape"])

  def get(self, name: str) -> np.ndarray:
    """Zero-copy read-only view of tensor `name`."""
    e = self.entries[name]
    if e["dtype"] not in _DTYPES:
      raise ValueError(f"Tensor {name!r} in {self.path!r} has dtype {e['dtype']}; "
                       f"supported: {sorted(_DTYPES)}.")
    b, end = e["data_offsets"]
    return self._data[b:end].view(_DTYPES[e["dtype"]]).reshape(e["shape"])


class CheckpointReader:
  """Tensors of a directory with `model.safetensors` or a sharded index."""

  def __init__(self, directory: str):
    self.directory = directory
    index = os.path.join(directory, INDEX_FILE)
    single = os.path.join(directory, SINGLE_FILE)
    if os.path.isfile(index):
      with open(index) as f:
        weight_map = json.load(f).get("weight_map")
      if not isinstance(weight_map, dict):
        raise ValueError(f"{index!r} has no 'weight_map' object mapping tensor names "
                         "to files.")
      self._where = dict(weight_map)
    elif os.path.isfile(single):
      self._where = None
    else:
      raise FileNotFoundError(
          f"No weights in {directory!r}: expected {SINGLE_FILE} or {INDEX_FILE} "
          f"(found {sorted(os.listdir(directory)) if os.path.isdir(directory) else 'no such directory'}).")
    self._files: dict[str, SafetensorsFile] = {}
    if self._where is None:
      self._files[SINGLE_FILE] = SafetensorsFile(single)
      self._where = {k: SINGLE_FILE for k in self._files[SINGLE_FILE].keys()}

  def _file(self, fname: str) -> SafetensorsFile:
    if fname not in self._files:
      self._files[fname] = SafetensorsFile(os.path.join(self.directory, fname))
    return self._files[fname]

  def keys(self) -> list[str]:
    return list(self._where)

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def file_of(self, name: str) -> str:
    return os.path.join(self.directory, self._where[name])

  def shape(self, name: str) -> tuple[int, ...]:
    return self._file(self._where[name]).shape(name)

  def get(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise KeyError(f"Tensor {name!r} is not in the checkpoint at {self.directory!r}.")
    return self._file(self._where[name]).get(name)


TensorSpec = tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]


def write_file(path: str, specs: Iterable[TensorSpec],
               metadata: dict[str, str] | None = None) -> int:
  """Writes one safetensors file, calling each spec's producer once, in order.

  Args:
    specs: (name, shape, dtype, produce) tuples; `produce()` returns the array.
    metadata: optional string-to-string metadata.

  Returns:
    Bytes of tensor data written.
  """
  specs = list(specs)
  header, offset = {}, 0
  for name, shape, dtype, _ in specs:
    size = math.prod(shape) * np.dtype(dtype).itemsize
    header[name] = {"dtype": dtype_name(dtype), "shape": list(shape),
                    "data_offsets": [offset, offset + size]}
    offset += size
  if metadata:
    header["__metadata__"] = dict(metadata)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name, shape, dtype, produce in specs:
      arr = np.ascontiguousarray(produce(), dtype=dtype)
      if arr.shape != tuple(shape):
        raise ValueError(f"Tensor {name!r} was declared {tuple(shape)} but produced "
                         f"{arr.shape}.")
      f.write(arr.tobytes())
  os.replace(tmp, path)
  return offset


def _shards(specs: list[TensorSpec], max_bytes: int) -> Iterator[list[TensorSpec]]:
  cur, size = [], 0
  for s in specs:
    n = math.prod(s[1]) * np.dtype(s[2]).itemsize
    if cur and size + n > max_bytes:
      yield cur
      cur, size = [], 0
    cur.append(s)
    size += n
  if cur:
    yield cur


def write_checkpoint(directory: str, specs: Iterable[TensorSpec],
                     max_shard_bytes: int = 5 << 30) -> list[str]:
  """Writes `model.safetensors`, or numbered shards plus the index when larger."""
  os.makedirs(directory, exist_ok=True)
  groups = list(_shards(list(specs), max_shard_bytes))
  meta = {"format": "pt"}
  if len(groups) <= 1:
    write_file(os.path.join(directory, SINGLE_FILE), groups[0] if groups else [], meta)
    return [SINGLE_FILE]
  names, weight_map, total = [], {}, 0
  for i, group in enumerate(groups):
    fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
    total += write_file(os.path.join(directory, fname), group, meta)
    names.append(fname)
    weight_map.update({s[0]: fname for s in group})
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  return names
