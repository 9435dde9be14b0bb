"""Read a GGUF file's header, metadata and tensor table once, fast.

Why not ``gguf.GGUFReader``: it builds every metadata value as Python objects
(a ReaderField per key and, for each string of an array, two NumPy memmap
slices plus list entries), and ``contents()`` walks them again: seconds for
a large vocabulary. This reader makes one pass over the
memory-mapped header with ``struct``: numeric arrays become typed NumPy views
of the mapping (no copy), string arrays one Python list built in that pass
(faster than a NumPy object array); the string loop is nearly all of its
time. tests/test_gguf_reader.py prints both times.

The ``gguf`` package stays the authority for what it is good at: the type
constants, ``GGML_QUANT_SIZES``, the writer (tests) and the dequantization
(vkspec.formats.ggml is tested against it).

Bad input is refused with one VkspecError line naming the file (and the key
or tensor): bad magic, unsupported version, truncation anywhere, counts that
cannot fit in what is left of the file (checked before anything of that size
is allocated), unknown value or tensor types, tensor data that does not fit
its type and shape, overlaps, duplicates. The file is opened read-only.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import VkspecError
from .pages import ask_page_size

MAGIC = b"GGUF"
VERSIONS = (2, 3)                  # what gguf.GGUFReader reads; v1 had 32-bit counts
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                       # GGML_MAX_DIMS

V = GGUFValueType
_SCALAR = {                        # value type -> (struct format, numpy dtype)
    V.UINT8: ("<B", "<u1"), V.INT8: ("<b", "<i1"), V.UINT16: ("<H", "<u2"), V.INT16: ("<h", "<i2"),
    V.UINT32: ("<I", "<u4"), V.INT32: ("<i", "<i4"), V.FLOAT32: ("<f", "<f4"), V.BOOL: ("<?", "?"),
    V.UINT64: ("<Q", "<u8"), V.INT64: ("<q", "<i8"), V.FLOAT64: ("<d", "<f8"),
}
_STRUCTS = {t: struct.Struct(fmt) for t, (fmt, _) in _SCALAR.items()}
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
# the fewest bytes one more item can take, for checking a count before looping over it
_MIN_KV = 8 + 4 + 1                # key length, value type, a 1-byte value
_MIN_TENSOR = 8 + 4 + 4 + 8        # name length, n_dims, type, offset
_MIN_ITEM = {V.STRING: 8, V.ARRAY: 4 + 8}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]         # GGUF order: shape[0] is the contiguous row (numpy's last axis)
    offset: int                    # absolute byte offset in the file
    nbytes: int

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))


@dataclass
class GgufContents:
    path: Path
    version: int
    alignment: int
    data_offset: int               # where the tensor data section starts
    file_size: int
    metadata: dict[str, Any]       # scalars as Python values, arrays as np.ndarray or list[str]
    value_types: dict[str, tuple[GGUFValueType, ...]]   # (type,) or (ARRAY, item type)
    tensors: dict[str, TensorInfo]  # in file order
    _map: Any = field(default=None, repr=False)   # the mmap: views into it keep it alive

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapped file (no copy)."""
        t = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def tensor_blocks(self, name: str) -> np.ndarray:
        """The tensor's bytes as (n_blocks, block_bytes), what vkspec.formats.ggml takes."""
        t = self.tensors[name]
        return self.tensor_bytes(name).reshape(-1, GGML_QUANT_SIZES[t.ggml_type][1])


def read_gguf(path) -> GgufContents:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 4 + 4 + 8 + 8:
                raise VkspecError(f"{path}: truncated GGUF header ({size} bytes; a header is 24)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ask_page_size(mm, size)                 # before any read faults a page in
    except OSError as e:
        raise VkspecError(f"{path}: cannot read ({e.strerror or e})") from None
    return _Parser(path, mm, size).parse()


class _Parser:
    def __init__(self, path: Path, mm: mmap.mmap, size: int):
        self.path, self.mm, self.size, self.p = path, mm, size, 0

    def fail(self, message: str):
        raise VkspecError(f"{self.path}: {message}")

    def need(self, n: int, what: str):
        if self.p + n > self.size:
            self.fail(f"truncated: {what} needs {n} bytes at byte {self.p}, "
                      f"the file ends at {self.size}")

    def count_fits(self, count: int, min_each: int, what: str):
        left = self.size - self.p
        if count * min_each > left:
            self.fail(f"{what} claims {count} entries, which cannot fit in the {left} bytes "
                      f"left in the file (truncated or corrupt)")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32(self.mm, self.p)[0]
        self.p += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64(self.mm, self.p)[0]
        self.p += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = self.mm[self.p:self.p + n]
        self.p += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    # --- header and metadata ------------------------------------------------------------
    def parse(self) -> GgufContents:
        magic = self.mm[0:4]
        if magic != MAGIC:
            self.fail(f"not a GGUF file (starts with {magic!r}, expected {MAGIC!r})")
        self.p = 4
        version = self.u32("version")
        if version not in VERSIONS:
            if int.from_bytes(version.to_bytes(4, "little"), "big") in (1,) + VERSIONS:
                self.fail("big-endian GGUF is not supported")
            self.fail(f"GGUF version {version} is not supported (supported: 2, 3)")
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("metadata count")
        self.count_fits(n_kv, _MIN_KV, "the header's metadata count")
        metadata, value_types = {}, {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            if key in metadata:
                self.fail(f"metadata key {key} appears twice")
            vtype = self.value_type(self.u32(f"type of metadata {key}"), f"metadata {key}")
            if vtype == V.ARRAY:
                itype = self.value_type(self.u32(f"item type of metadata {key}"), f"metadata {key}'s items")
                metadata[key] = self.array(itype, key)
                value_types[key] = (V.ARRAY, itype)
            else:
                metadata[key] = self.scalar(vtype, key)
                value_types[key] = (vtype,)
        alignment = self.alignment(metadata, value_types)
        self.count_fits(n_tensors, _MIN_TENSOR, "the header's tensor count")
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        data_offset = -(-self.p // alignment) * alignment
        tensors = self.place(infos, data_offset, alignment)
        return GgufContents(self.path, version, alignment, data_offset, self.size, metadata,
                            value_types, tensors, self.mm)

    def value_type(self, raw: int, what: str) -> GGUFValueType:
        try:
            return V(raw)
        except ValueError:
            self.fail(f"{what}: unknown GGUF value type {raw}")

    def scalar(self, vtype: GGUFValueType, key: str):
        if vtype == V.STRING:
            return self.string(f"value of {key}")
        s = _STRUCTS[vtype]
        self.need(s.size, f"value of {key}")
        v = s.unpack_from(self.mm, self.p)[0]
        self.p += s.size
        return v

    def array(self, itype: GGUFValueType, key: str):
        count = self.u64(f"length of {key}")
        if itype in _SCALAR:
            dtype = np.dtype(_SCALAR[itype][1])
            self.count_fits(count, dtype.itemsize, f"metadata array {key}")
            out = np.frombuffer(self.mm, dtype=dtype, count=count, offset=self.p)
            self.p += count * dtype.itemsize
            return out
        self.count_fits(count, _MIN_ITEM[itype], f"metadata array {key}")
        if itype == V.STRING:
            return self.strings(count, key)
        out = []
        for i in range(count):            # arrays of arrays: rare, kept simple
            sub = self.value_type(self.u32(f"item type of {key}[{i}]"), f"metadata {key}[{i}]")
            out.append(self.array(sub, f"{key}[{i}]"))
        return out

    def strings(self, count: int, key: str) -> list[str]:
        """One pass, one list: the inner loop is the whole cost of a vocabulary."""
        mm, p, size, u64 = self.mm, self.p, self.size, _U64
        out = [None] * count
        try:
            for i in range(count):
                n = u64(mm, p)[0]
                p += 8
                if p + n > size:
                    break
                out[i] = mm[p:p + n].decode("utf-8")
                p += n
            else:
                self.p = p
                return out
        except struct.error:          # the length itself runs past the end
            p = size
        except UnicodeDecodeError:
            self.fail(f"metadata {key}[{i}] is not UTF-8")
        self.p = p
        self.fail(f"truncated: metadata {key} ends past the end of the file ({size} bytes) "
                  f"at entry {i} of {count}")

    def alignment(self, metadata, value_types) -> int:
        a = metadata.get("general.alignment")
        if a is None:
            return DEFAULT_ALIGNMENT
        if value_types["general.alignment"] != (V.UINT32,):
            self.fail(f"general.alignment has type {value_types['general.alignment'][0].name}, "
                      "expected UINT32")
        if a == 0 or a & (a - 1):
            self.fail(f"general.alignment {a} is not a power of two")
        return a

    # --- tensor table -------------------------------------------------------------------
    def tensor_info(self, i: int):
        name = self.string(f"name of tensor #{i}")
        n_dims = self.u32(f"dimension count of tensor {name}")
        if n_dims > MAX_DIMS:
            self.fail(f"tensor {name}: {n_dims} dimensions (at most {MAX_DIMS})")
        shape = tuple(self.u64(f"shape of tensor {name}") for _ in range(n_dims))
        raw = self.u32(f"type of tensor {name}")
        rel = self.u64(f"offset of tensor {name}")
        try:
            gtype = GGMLQuantizationType(raw)
        except ValueError:
            self.fail(f"tensor {name}: unknown ggml type {raw}")
        return name, gtype, shape, rel

    def place(self, infos, data_offset: int, alignment: int) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for name, gtype, shape, rel in infos:
            if name in tensors:
                self.fail(f"tensor {name} appears twice")
            block, type_size = GGML_QUANT_SIZES[gtype]
            elems = 1
            for d in shape:
                elems *= d
            row = shape[0] if shape else 1
            if row % block:
                self.fail(f"tensor {name}: {gtype.name} shape {list(shape)}: row length {row} "
                          f"is not a multiple of the block size {block}")
            if rel % alignment:
                self.fail(f"tensor {name}: data offset {rel} is not a multiple of the alignment {alignment}")
            nbytes = elems // block * type_size
            start = data_offset + rel
            if start + nbytes > self.size:
                self.fail(f"tensor {name}: {gtype.name} shape {list(shape)} needs {nbytes} bytes at "
                          f"{start}, past the end of the file ({self.size} bytes): truncated "
                          "or a size that does not match its type and shape")
            tensors[name] = TensorInfo(name, gtype, shape, start, nbytes)
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                self.fail(f"tensor {a.name}: its {a.nbytes} bytes at {a.offset} overlap tensor "
                          f"{b.name} at {b.offset} (a size that does not match its type and shape)")
        return tensors
