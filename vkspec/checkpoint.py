"""Hugging Face checkpoints: config.json plus one or more .safetensors files,
memory-mapped.

The safetensors library validates each file (safe_open); tensors are then
read as views of the mapped file and stay in their dtype: a matrix becomes a
formats.matrix.QWeight over its bytes (F32, F16, BF16, and F8_E4M3 with its
128 x 128 block scales ``weight_scale_inv``, kept as a scale per row and 128
columns); vectors (norms, biases, small parameters) are read as float32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .errors import VkspecError
from .formats.matrix import QWeight, from_array

_DTYPES = {"F32": np.float32, "F16": np.uint16, "BF16": np.uint16, "F8_E4M3": np.uint8,
           "I8": np.int8, "U8": np.uint8, "I32": np.int32, "I64": np.int64}
_FORMATS = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F8_E4M3": "fp8"}
FP8_BLOCK = 128     # weight_block_size of FP8 checkpoints


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        try:
            from safetensors import safe_open
            with safe_open(str(path), framework="np") as f:
                names = list(f.keys())
        except Exception as e:
            raise VkspecError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        self.base = 8 + n
        self.meta = {k: v for k, v in header.items() if k != "__metadata__"}
        for name in names:
            info = self.meta[name]
            lo, hi = info["data_offsets"]
            if info["dtype"] not in _DTYPES:
                raise VkspecError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
            if self.base + hi > size:
                raise VkspecError(f"{path}: tensor {name} runs past the end of the file (truncated)")
        self._mm = np.memmap(path, dtype=np.uint8, mode="r") if size > self.base else None

    def raw(self, name: str) -> np.ndarray:
        info = self.meta[name]
        lo, hi = info["data_offsets"]
        dt = np.dtype(_DTYPES[info["dtype"]])
        return self._mm[self.base + lo:self.base + hi].view(dt).reshape(info["shape"])


class Checkpoint:
    """All tensors of a checkpoint directory by name, read lazily."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise VkspecError(f"{self.dir}: no .safetensors files")
        self.where: dict[str, SafetensorsFile] = {}
        for p in files:
            f = SafetensorsFile(p)
            for name in f.meta:
                self.where[name] = f

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self):
        return self.where.keys()

    def shape(self, name: str) -> tuple:
        return tuple(self.where[name].meta[name]["shape"])

    def dtype(self, name: str) -> str:
        return self.where[name].meta[name]["dtype"]

    def file_bytes(self) -> int:
        return sum(f.path.stat().st_size for f in set(self.where.values()))

    def drop_pages(self):
        """See GgufFile.drop_pages."""
        import mmap
        for f in set(self.where.values()):
            if f._mm is not None:
                f._mm._mmap.madvise(mmap.MADV_DONTNEED)

    def _info(self, name: str, shape):
        if name not in self.where:
            raise VkspecError(f"{self.dir}: missing tensor {name}")
        f = self.where[name]
        got = tuple(f.meta[name]["shape"])
        if shape is not None and got != tuple(shape):
            raise VkspecError(f"{f.path}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        return f, f.meta[name]["dtype"]

    def get(self, name: str, shape: tuple | None = None) -> np.ndarray:
        """A tensor as float32 (vectors and small parameters; matrices: matrix())."""
        f, dt = self._info(name, shape)
        raw = f.raw(name)
        if dt == "F32":
            return np.asarray(raw)
        if dt == "F8_E4M3":
            return self._fp8(name, f).astype(np.float32)
        from .formats.matrix import dequantize
        if dt in ("F16", "BF16"):
            return dequantize(from_array(raw.reshape(-1, raw.shape[-1] if raw.ndim else 1),
                                         _FORMATS[dt])).reshape(raw.shape)
        return raw.astype(np.float32)

    def matrix(self, name: str, shape: tuple) -> QWeight:
        """A 2-D (or stacked 3-D, flattened to rows) weight as it is stored."""
        f, dt = self._info(name, shape)
        if dt not in _FORMATS:
            raise VkspecError(f"{f.path}: tensor {name} is {dt}, not a weight format ({', '.join(_FORMATS)})")
        raw = f.raw(name)
        rows, cols = int(np.prod(raw.shape[:-1])), raw.shape[-1]
        if cols % 4:
            raise VkspecError(f"{f.path}: tensor {name} has {cols} columns; vkspec needs a multiple of 4")
        raw2 = raw.reshape(rows, cols)
        if dt != "F8_E4M3":
            return from_array(raw2, _FORMATS[dt])
        return QWeight("fp8", rows, cols, raw2.view(np.uint8), self._fp8_scales(name, f, raw.shape))

    def _fp8_scales(self, name, f, shape) -> np.ndarray:
        sname = name.replace(".weight", ".weight_scale_inv")
        if sname not in self.where:
            raise VkspecError(f"{f.path}: FP8 tensor {name} has no {sname}")
        s = self.get(sname)
        rows, cols = shape[-2], shape[-1]
        blocks = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        if tuple(s.shape[-2:]) != blocks:
            raise VkspecError(f"{f.path}: {sname} has shape {list(s.shape)}, expected "
                              f"{list(blocks)} for {FP8_BLOCK}x{FP8_BLOCK} blocks")
        per_row = np.repeat(s, FP8_BLOCK, axis=-2)[..., :rows, :]        # (..., rows, column blocks)
        return np.ascontiguousarray(per_row.reshape(-1, blocks[1]))

    def _fp8(self, name, f):
        from .formats.matrix import dequantize
        raw = f.raw(name)
        return dequantize(QWeight("fp8", raw.shape[0], raw.shape[1], raw.view(np.uint8),
                                  self._fp8_scales(name, f, raw.shape)))

