"""Hugging Face checkpoints: config.json plus one or more .safetensors files, memory-mapped.

The safetensors library validates each file (safe_open); tensors are then read
as memory maps of the file (NumPy has no bfloat16 or float8 dtype, so those
are widened to float32 exactly: bf16 by a 16-bit shift, FP8 e4m3 through its
256-entry table times the block scale ``weight_scale_inv``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .errors import VkspecError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8,
           "I8": np.int8, "U8": np.uint8, "I32": np.int32, "I64": np.int64}


def _fp8_e4m3_table() -> np.ndarray:
    b = np.arange(256, dtype=np.uint32)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    v = np.where((e == 15) & ((b & 7) == 7), np.nan, v)     # e4m3fn: only S.1111.111 is NaN
    return (s * v).astype(np.float32)


FP8_E4M3 = _fp8_e4m3_table()
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

    def get(self, name: str, shape: tuple | None = None) -> np.ndarray:
        """The tensor as float32, checked against the expected shape."""
        if name not in self.where:
            raise VkspecError(f"{self.dir}: missing tensor {name}")
        f = self.where[name]
        info = f.meta[name]
        got = tuple(info["shape"])
        if shape is not None and got != tuple(shape):
            raise VkspecError(f"{f.path}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        raw = f.raw(name)
        dt = info["dtype"]
        if dt == "F32":
            return np.asarray(raw)
        if dt == "F16":
            return raw.astype(np.float32)
        if dt == "BF16":
            return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if dt == "F8_E4M3":
            w = FP8_E4M3[raw]
            sname = name.replace(".weight", ".weight_scale_inv")
            if sname not in self.where:
                raise VkspecError(f"{f.path}: FP8 tensor {name} has no {sname}")
            s = self.get(sname)
            blocks = (-(-got[0] // FP8_BLOCK), -(-got[1] // FP8_BLOCK))
            if s.shape != blocks:
                raise VkspecError(f"{f.path}: {sname} has shape {list(s.shape)}, expected "
                                  f"{list(blocks)} for {FP8_BLOCK}x{FP8_BLOCK} blocks")
            full = np.repeat(np.repeat(s, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:got[0], :got[1]]
            return (w * full).astype(np.float32)
        return raw.astype(np.float32)
