"""vkspec.formats.ggml: every block type's values equal gguf.quants.dequantize
bit for bit (NaN payloads too, except where two NaNs meet: see assert_bits), on the NumPy path and in the
compiled CPU decoders (backends/cpu/jit_blocks.py); and one hand-built block per type equals values worked
out here from llama.cpp's block layout (ggml-common.h / ggml-quants.c), so a
layout mistake shared by gguf and vkspec would still fail."""

import numpy as np
import pytest

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from vkspec.formats import ggml

NAMES = list(ggml.TYPES)
F16_SPECIALS = [0x0000, 0x8000,                  # +0, -0
                0x0001, 0x8001, 0x03FF, 0x83FF,  # subnormals (smallest, largest)
                0x0400, 0x3C00, 0xB800,          # smallest normal, 1.0, -0.5
                0x7BFF, 0xFBFF,                  # +-65504
                0x7C00, 0xFC00,                  # +-inf
                0x7E00, 0xFE00, 0x7C01, 0x7FFF]  # NaNs: quiet, negative, signalling, all-ones payload

# where a block keeps its f16 fields, its packed scales and its quants
LAYOUT = {
    "Q4_0": dict(f16=[0], quants=(2, 18)),
    "Q4_1": dict(f16=[0, 2], quants=(4, 20)),
    "Q5_0": dict(f16=[0], quants=(2, 22)),
    "Q5_1": dict(f16=[0, 2], quants=(4, 24)),
    "Q8_0": dict(f16=[0], quants=(2, 34)),
    "Q2_K": dict(f16=[80, 82], scales=(0, 16), quants=(16, 80)),
    "Q3_K": dict(f16=[108], scales=(96, 108), quants=(0, 96)),
    "Q4_K": dict(f16=[0, 2], scales=(4, 16), quants=(16, 144)),
    "Q5_K": dict(f16=[0, 2], scales=(4, 16), quants=(16, 176)),
    "Q6_K": dict(f16=[208], scales=(192, 208), quants=(0, 192)),
}
QUANT_FILLS = [0x00, 0xFF, 0x88, 0x10, None]               # None: random bytes
SCALE_FILLS = [0x00, 0xFF, 0x3F, 0xC0, 0x0F, 0xF0, 0x7F, 0x80]  # 6-bit packing extremes, int8 extremes


@pytest.fixture(scope="module")
def jit():
    """The compiled decoders the CPU path runs, by the name of the definition they answer to."""
    from vkspec.backends.cpu import jit_blocks
    from vkspec.formats.matrix import QWeight, no_scales

    def decoder(name):
        t = ggml.TYPES[name]

        def run(blocks):
            blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, t.block_bytes)
            w = QWeight(name.lower(), blocks.shape[0], t.block_elems, blocks, no_scales())
            return jit_blocks.decode(w)
        return run

    fns = {t.dequantize.__name__: decoder(name) for name, t in ggml.TYPES.items()}
    fns["f16_bits_to_f32"] = lambda h: fns["dequantize_f16"](
        np.asarray(h, np.uint16).view(np.uint8).reshape(-1, 2)).reshape(-1)
    return fns


def reference(name, blocks):
    t = ggml.TYPES[name]
    with np.errstate(all="ignore"):
        out = gguf.quants.dequantize(blocks.reshape(-1), GGMLQuantizationType[name])
    return np.asarray(out, dtype=np.float32).reshape(blocks.shape[0], t.block_elems)


def ours(f, blocks):
    with np.errstate(all="ignore"):
        return f(blocks)


def assert_bits(got, want, what, nan_payloads=True):
    """Bit for bit. With nan_payloads=False a NaN equals any NaN: where two NaNs
    meet in one add, NumPy (so gguf) picks either payload depending on the
    array's shape, so the payload is not defined there."""
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    same = got.view(np.uint32) == want.view(np.uint32)
    if not nan_payloads:
        same |= np.isnan(got) & np.isnan(want)
    diff = np.flatnonzero(~same.ravel())
    if diff.size:
        i = diff[0]
        pytest.fail(f"{what}: {diff.size} values differ; first at flat {i}: "
                    f"{got.ravel()[i]!r} ({got.view(np.uint32).ravel()[i]:#010x}) vs "
                    f"{want.ravel()[i]!r} ({want.view(np.uint32).ravel()[i]:#010x})")


def put_f16(blocks, at, bits):
    blocks[:, at] = bits & 0xFF
    blocks[:, at + 1] = bits >> 8


def edge_blocks(name, rng):
    """Specials in every f16 field (each pair of them where a block has two)
    over several quant fills; then packed-scale extremes over the quant fills
    with ordinary and special f16 values."""
    t, lay = ggml.TYPES[name], LAYOUT[name]
    q0, q1 = lay["quants"]
    out = []

    def block(f16s, quant_fill, scale_fill=None):
        b = rng.integers(0, 256, t.block_bytes, dtype=np.uint8).reshape(1, -1)
        for at, bits in zip(lay["f16"], f16s):
            put_f16(b, at, bits)
        if quant_fill is not None:
            b[:, q0:q1] = quant_fill
        if "scales" in lay and scale_fill is not None:
            s0, s1 = lay["scales"]
            b[:, s0:s1] = scale_fill
        out.append(b)

    pairs = [(a, c) for a in F16_SPECIALS for c in F16_SPECIALS] if len(lay["f16"]) == 2 \
        else [(a,) for a in F16_SPECIALS]
    for f16s in pairs:
        for fill in QUANT_FILLS:
            block(f16s, fill, 0xFF)
    if "scales" in lay:
        s0, s1 = lay["scales"]
        third = (s1 - s0) // 3
        for a in SCALE_FILLS:
            for b in SCALE_FILLS:
                for c in SCALE_FILLS:
                    fill = np.array([a] * third + [b] * third + [c] * (s1 - s0 - 2 * third), np.uint8)
                    for f16 in (0x3C00, 0x0001, 0x7BFF, 0x8000):
                        for qfill in (0x00, 0xFF, None):
                            block([f16, 0xB800][:len(lay["f16"])], qfill, fill)
    return np.concatenate(out)


# --- the table ------------------------------------------------------------------------

def test_table_agrees_with_the_gguf_package():
    for name, t in ggml.TYPES.items():
        g = GGMLQuantizationType[name]
        assert (t.type_id, t.block_elems, t.block_bytes) == (int(g), *GGML_QUANT_SIZES[g])
        assert ggml.BY_ID[t.type_id] is t
    assert set(NAMES) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


# --- f16 -> f32 by integer bit manipulation ---------------------------------------------

def test_f16_widening_equals_numpys_for_all_65536_patterns_payloads_included(jit):
    h = np.arange(1 << 16, dtype=np.uint32)
    want = h.astype(np.uint16).view(np.float16).astype(np.float32)
    assert_bits(ours(ggml.f16_bits_to_f32, h), want, "numpy path")
    assert_bits(jit["f16_bits_to_f32"](h), want, "numba path")


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_16_bit_types_for_all_65536_patterns(name, jit):
    blocks = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    want = reference(name, blocks)
    t = ggml.TYPES[name]
    assert_bits(ours(t.dequantize, blocks), want, "numpy path")
    assert_bits(jit[t.dequantize.__name__](blocks), want, "numba path")


def test_f32_keeps_every_bit(jit):
    bits = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x3F800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                     0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x12345678], dtype=np.uint32)
    blocks = bits.view(np.uint8).reshape(-1, 4)
    want = bits.view(np.float32).reshape(-1, 1)
    assert_bits(reference("F32", blocks), want, "gguf")
    assert_bits(ours(ggml.dequantize_f32, blocks), want, "numpy path")
    assert_bits(jit["dequantize_f32"](blocks), want, "numba path")


# --- every type against gguf.quants.dequantize ------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_random_blocks_equal_gguf(name, jit):
    t = ggml.TYPES[name]
    rng = np.random.default_rng(list(ggml.TYPES).index(name))
    blocks = rng.integers(0, 256, (2000, t.block_bytes), dtype=np.uint8)
    want = reference(name, blocks)
    assert_bits(ours(t.dequantize, blocks), want, "numpy path", nan_payloads=False)
    assert_bits(jit[t.dequantize.__name__](blocks), want, "numba path", nan_payloads=False)


@pytest.mark.parametrize("name", list(LAYOUT))
def test_edge_blocks_equal_gguf(name, jit):
    t = ggml.TYPES[name]
    blocks = edge_blocks(name, np.random.default_rng(7))
    want = reference(name, blocks)
    assert_bits(ours(t.dequantize, blocks), want, "numpy path", nan_payloads=False)
    assert_bits(jit[t.dequantize.__name__](blocks), want, "numba path", nan_payloads=False)
    # the edges are really there: infinities, NaNs, signed zeros in the output
    assert np.isnan(want).any() and np.isinf(want).any()
    assert (want.view(np.uint32) == 0x80000000).any() and (want.view(np.uint32) == 0).any()


def test_whole_tensor_helper_and_zero_blocks():
    data = np.random.default_rng(1).integers(0, 256, 3 * 144, dtype=np.uint8)
    with np.errstate(all="ignore"):
        got = ggml.dequantize(data, "Q4_K")
    assert_bits(got, reference("Q4_K", data.reshape(3, 144)).reshape(-1), "flat")
    assert ggml.dequantize_q4_k(np.zeros((0, 144), np.uint8)).shape == (0, 256)


# --- one block per type, worked out by hand from llama.cpp's layout ------------------------
# Values are chosen so every result is exact; each case lists a few elements.

def _half(x):
    return {1.0: 0x3C00, 0.5: 0x3800, 0.25: 0x3400, 0.125: 0x3000, 2.0: 0x4000,
            -1.0: 0xBC00}[x]


def _block(size, **fields):
    b = np.zeros(size, np.uint8)
    for at, v in fields.get("halves", {}).items():
        b[at], b[at + 1] = _half(v) & 0xFF, _half(v) >> 8
    for at, v in fields.get("bytes", {}).items():
        b[at] = v
    return b


def hand_cases():
    """name -> (one block, {element: value})."""
    c = {}
    c["F32"] = (np.array([0x00, 0x00, 0xC0, 0x3F], np.uint8), {0: 1.5})
    c["F16"] = (np.array([0xFF, 0x7B], np.uint8), {0: 65504.0})
    c["BF16"] = (np.array([0xC0, 0xBF], np.uint8), {0: -1.5})
    # block_q4_0 {half d; u8 qs[16]}: y[j] = (qs[j] & 15) - 8, y[j+16] = (qs[j] >> 4) - 8, times d
    b = _block(18, halves={0: 0.5}, bytes={2 + j: 0x88 for j in range(16)})
    b[2], b[2 + 15] = 0x9F, 0x08
    c["Q4_0"] = (b, {0: 3.5, 16: 0.5, 1: 0.0, 15: 0.0, 31: -4.0})
    # block_q4_1 {half d, m; u8 qs[16]}: d * q + m
    b = _block(20, halves={0: 0.25, 2: -1.0})
    b[4 + 3] = 0x5A
    c["Q4_1"] = (b, {3: 10 * 0.25 - 1, 19: 5 * 0.25 - 1, 0: -1.0})
    # block_q5_0 {half d; u8 qh[4]; u8 qs[16]}: bit j of qh (LE u32) is bit 4 of y[j]; minus 16
    b = _block(22, halves={0: 1.0}, bytes={2: 0x01, 4: 0x02})     # bits 0 and 17
    b[6] = 0x23
    c["Q5_0"] = (b, {0: (3 + 16) - 16, 16: 2 - 16, 1: -16.0, 17: (0 + 16) - 16})
    # block_q5_1 {half d, m; u8 qh[4]; u8 qs[16]}
    b = _block(24, halves={0: 0.5, 2: 2.0}, bytes={7: 0x80})       # bit 31
    b[8 + 15] = 0xF1
    c["Q5_1"] = (b, {15: 1 * 0.5 + 2, 31: (15 + 16) * 0.5 + 2, 0: 2.0})
    # block_q8_0 {half d; i8 qs[32]}
    b = _block(34, halves={0: 0.125}, bytes={2: 0x80, 2 + 31: 0x7F, 2 + 5: 0xFF})
    c["Q8_0"] = (b, {0: -128 * 0.125, 31: 127 * 0.125, 5: -0.125, 1: 0.0})
    # block_q2_K {u8 scales[16]; u8 qs[64]; half d, dmin}: scale byte = sc | mn << 4, one per 16
    # values; each 32 qs bytes are read 4 times at shifts 0, 2, 4, 6 (128 values per 32 bytes)
    b = _block(84, halves={80: 1.0, 82: 0.5}, bytes={0: 0x32, 2: 0x15, 4: 0x07, 6: 0xF1, 9: 0x24})
    b[16 + 0] = 0xE4                    # 2-bit fields 0, 1, 2, 3 at shifts 0, 2, 4, 6
    b[16 + 32 + 16 + 3] = 0x03          # second half, shift 0, second 16: element 128 + 16 + 3
    c["Q2_K"] = (b, {0: 2 * 0 - 3 * 0.5, 32: 5 * 1 - 1 * 0.5, 64: 7 * 2 - 0.0, 96: 1 * 3 - 15 * 0.5,
                     147: 4 * 3 - 2 * 0.5})
    # block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}: the aux[] unpacking of
    # dequantize_row_q3_K gives scale k (k < 4) = (s[k] & 15) | (s[8+k] & 3) << 4,
    # scale 4+k = (s[4+k] & 15) | (s[8+k] >> 2 & 3) << 4, scale 8+k = (s[k] >> 4) | (s[8+k] >> 4 & 3) << 4,
    # scale 12+k = (s[4+k] >> 4) | (s[8+k] >> 6) << 4; value = d * (scale - 32) * q, q = 2 bits,
    # minus 4 where hmask bit (4 * half + pass) of byte l is clear
    b = _block(110, halves={108: 0.5}, bytes={96 + 0: 0x21, 96 + 4: 0x30, 96 + 8: 0x92})
    # scale 0 = 1 | 2 << 4 = 33; scale 4 = 0; scale 8 = 2 | 1 << 4 = 18; scale 12 = 3 | 2 << 4 = 35
    b[32 + 0], b[0] = 0x02, 0x11        # qs[0]; hmask[0]: bits 0 (half 0, pass 0) and 4 (half 1, pass 0)
    b[32 + 32] = 0x03                   # qs[32]: second half
    c["Q3_K"] = (b, {0: 0.5 * 1 * 2, 1: 0.5 * 1 * -4, 64: 0.5 * -32 * -4, 128: 0.5 * -14 * 3,
                     192: 0.5 * 3 * -4})
    # block_q4_K {half d, dmin; u8 scales[12]; u8 qs[128]}: get_scale_min_k4: j < 4: sc = s[j] & 63,
    # mn = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, mn = (s[j+4] >> 4) | (s[j] >> 6) << 4.
    # 64 values per 32 qs bytes: low nibbles with pair 2c, high nibbles with pair 2c + 1
    b = _block(144, halves={0: 2.0, 2: 1.0}, bytes={4 + 0: 0xC5, 4 + 4: 0x43, 4 + 8: 0x72})
    b[16 + 0], b[16 + 64] = 0x9A, 0x0F
    # pair 0: sc 5, mn 3; pair 4: sc 2 | 3 << 4 = 50, mn 7 | 1 << 4 = 23
    c["Q4_K"] = (b, {0: 2 * 5 * 10 - 3, 31: -3.0, 32: 0.0, 128: 2 * 50 * 15 - 23, 160: 0.0})
    # block_q5_K {half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K, plus 16 where
    # bit u of qh[l] is set (u = 2c for the low nibbles of chunk c, 2c + 1 for the high)
    b = _block(176, halves={0: 1.0, 2: 0.5},
               bytes={4 + 0: 0x01, 4 + 4: 0x02, 4 + 1: 0x03, 4 + 5: 0x04, 4 + 2: 0x40, 4 + 10: 0x31})
    b[16 + 0], b[16 + 5] = 0x41, 0x02   # qh
    b[48 + 0], b[48 + 5], b[48 + 96] = 0x21, 0xF0, 0x0A
    # pair 0: sc 1 mn 2; pair 1: sc 3 mn 4; pair 6: sc 1 | 1 << 4 = 17, mn 3
    c["Q5_K"] = (b, {0: 1 * (1 + 16) - 0.5 * 2, 32: 3 * 2 - 0.5 * 4, 5: 1 * 0 - 0.5 * 2,
                     37: 3 * (15 + 16) - 0.5 * 4, 192: 17 * (10 + 16) - 0.5 * 3, 224: 0.0})
    # block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: per 128 values, l < 32:
    # y[l] = ql[l] & 15 | (qh[l] & 3) << 4, y[l+32] = ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4,
    # y[l+64] = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4, y[l+96] = ql[l+32] >> 4 | (qh[l] >> 6) << 4,
    # each minus 32, times d * scale[l / 16 + 0, 2, 4, 6]; then ql += 64, qh += 32, scales += 8
    b = _block(210, halves={208: 0.25},
               bytes={192 + 0: 2, 192 + 2: 0xFD, 192 + 4: 4, 192 + 6: 0x7F, 192 + 8: 0x80})
    b[0], b[32], b[128] = 0x5F, 0x01, 0xC9
    c["Q6_K"] = (b, {0: 0.25 * 2 * (31 - 32), 32: 0.25 * -3 * (33 - 32), 64: 0.25 * 4 * (5 - 32),
                     96: 0.25 * 127 * (48 - 32), 128: 0.25 * -128 * -32})
    return c


@pytest.mark.parametrize("name", NAMES)
def test_one_block_worked_out_by_hand(name, jit):
    block, expect = hand_cases()[name]
    t = ggml.TYPES[name]
    blocks = block.reshape(1, t.block_bytes)
    for what, got in (("gguf", reference(name, blocks)), ("numpy path", t.dequantize(blocks)),
                      ("numba path", jit[t.dequantize.__name__](blocks))):
        for e, v in expect.items():
            assert got[0, e] == np.float32(v), (what, name, e, got[0, e], v)
