"""The push-constant block of every shader as the host fills it: one struct per
shader, field for field in the block's order (the ggml-vulkan way).

Every field is keyword-only; a field without a default must be given at
every dispatch (a forgotten one is an error, never a silent 0), and the ones
with a default are offsets and parameters of variants that do not read them.
`vkspec/shaders/build.py` checks every compiled variant's block against its
struct here (names, order, byte offsets, types) and fails the build on any
difference; `pack` writes a struct into the uint32 words kp pushes.

Standard library only: the build hook loads this file before vkspec's
dependencies are installed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

GLSL_TYPES = {"u32": "uint", "i32": "int", "f32": "float"}
u32 = i32 = int          # annotations name the GLSL type; the values are Python numbers
f32 = float


@dataclass(kw_only=True)
class Argmax:
    rows: u32
    n: u32
    x_off: u32 = 0
    x_stride: u32
    y_off: u32 = 0


@dataclass(kw_only=True)
class Attend:
    rows: u32
    heads: u32
    kv_heads: u32
    hd: u32
    q_stride: u32 = 0      # floats between rows of q (and of the gate)
    q_hstride: u32 = 0     # floats between heads of q
    gate_off: u32 = 0      # first gate float
    s_stride: u32          # floats between (row, head) score rows (>= context)
    o_off: u32 = 0
    o_stride: u32 = 0
    scale: f32
    kv_off: u32 = 0        # the layer's first float of the cache arena
    window: u32 = 0        # keys at distance 0..window-1 (0: every earlier key)


@dataclass(kw_only=True)
class BiasAdd:
    rows: u32
    n: u32                 # bias length (columns)
    x_off: u32 = 0         # acc: first float of x (o_proj's output)
    x_stride: u32 = 0
    y_off: u32 = 0
    y_stride: u32
    b_off: u32 = 0         # the bias in the vectors arena


@dataclass(kw_only=True)
class ConvStep:
    rows: u32
    channels: u32
    k: u32                 # kernel taps
    x_stride: u32
    y_stride: u32
    w_off: u32 = 0         # the layer's kernel in the vectors arena
    r_off: u32 = 0         # the layer's ring in the ring arena


@dataclass(kw_only=True)
class CoreEval:
    n: u32
    op: u32                # index in vkspec.exact.ELEMENTWISE


@dataclass(kw_only=True)
class Deltanet:
    rows: u32
    nk: u32
    nv: u32
    dk: u32
    dv: u32
    m_stride: u32
    ba_off: u32
    ba_stride: u32
    o_stride: u32
    scale: f32             # dk ** -0.5
    eps: f32               # the L2 norm's
    p_off: u32 = 0         # the layer's dt_bias | -exp(A_log) in the vectors arena
    s_off: u32 = 0         # the layer's state in the ssm arena
    tiled: u32 = 0         # ModelConfig.linear_v_tiled


@dataclass(kw_only=True)
class Embed:
    rows: u32
    n: u32                 # hidden size
    y_off: u32 = 0
    y_stride: u32
    row_bytes: u32
    s_stride: u32 = 0
    first_row: u32 = 0
    part_rows: u32
    scale: f32 = 1.0       # the rows times this (Gemma's sqrt(hidden)); times 1 changes no bit


@dataclass(kw_only=True)
class Fill:
    n: u32
    x_off: u32 = 0
    y_off: u32 = 0


@dataclass(kw_only=True)
class Gemv:
    # output rows per workgroup in each lane layout of gemv.comp (a class
    # attribute, not a field): "parallel" 32 x 2 invocations, the 32 lanes of
    # 2 rows; "serial" 64 / INV_ROWS invocations of INV_ROWS rows each
    # (recorder.gemv_spec). A dispatch has
    # ceil(rows / ROWS_PER_GROUP[layout]) workgroups along x.
    ROWS_PER_GROUP = {"parallel": 2, "serial": 64}
    # gemv_q8.comp (the same block; x_off and x_stride in words of q8 rows):
    # "parallel" 8 x 8 invocations, the 8 lanes of 8 rows; "serial" 64 rows
    Q8_ROWS_PER_GROUP = {"parallel": 8, "serial": 64}

    rows: u32              # output rows (M)
    cols: u32              # columns (K, a multiple of 4)
    nvec: u32              # input rows, 1..8 (routed: pairs, one per workgroup along y)
    w_off: u32 = 0         # first weight byte
    s_off: u32 = 0         # first scale
    x_off: u32 = 0         # first input float (multiple of 4)
    x_stride: u32          # floats between input rows (multiple of 4)
    y_off: u32 = 0         # first output float
    y_stride: u32          # floats between output rows
    row_bytes: u32         # bytes between weight rows
    s_stride: u32 = 0      # scales between weight rows
    acc: u32 = 0           # 1: y += the result (the residual stream)
    w_expert: u32 = 0      # routed: weight bytes per expert
    s_expert: u32 = 0      # routed: scales per expert
    x_div: u32 = 0         # routed: pairs per input row
    idx_off: u32 = 0       # routed: first expert index
    first_row: u32 = 0     # rowmap: the part's first weight row
    part_rows: u32 = 0     # rowmap: the part's rows


@dataclass(kw_only=True)
class QuantizeQ8:
    rows: u32              # input rows
    cols: u32              # columns, a multiple of the block
    x_off: u32 = 0         # first input float (multiple of 4)
    x_stride: u32          # floats between input rows (multiple of 4)
    q_off: u32 = 0         # first output word
    q_stride: u32          # words between output rows (>= recorder.q8_words)


@dataclass(kw_only=True)
class MoeCombine:
    rows: u32
    n: u32
    k: u32
    x_off: u32             # first float of x's first row
    x_stride: u32
    y_stride: u32
    s_stride: u32
    g_stride: u32
    g_off: u32
    w_off: u32             # first routing weight of these rows


@dataclass(kw_only=True)
class Rmsnorm:
    rows: u32
    n: u32                 # columns
    group: u32 = 1         # rows per outer stride (1 for plain rows)
    x_off: u32 = 0
    x_stride: u32 = 0
    x_inner: u32 = 0
    w_off: u32 = 0
    y_off: u32 = 0
    y_stride: u32 = 0
    y_inner: u32 = 0
    z_off: u32 = 0
    z_stride: u32 = 0
    z_inner: u32 = 0
    eps: f32
    inv_n: f32             # float32(1 / n)


@dataclass(kw_only=True)
class Rope:
    rows: u32
    heads: u32
    hd: u32
    rot: u32               # rotary dims (even), 0 for none
    x_off: u32 = 0
    x_stride: u32          # floats between rows
    x_hstride: u32         # floats between heads
    y_off: u32 = 0
    y_stride: u32          # floats between rows (cache: between positions)


@dataclass(kw_only=True)
class Route:
    rows: u32
    n: u32                 # experts
    k: u32
    x_stride: u32
    normalize: u32
    y_off: u32             # first output (the layer's rows of the routing buffers)


@dataclass(kw_only=True)
class SiluMul:
    rows: u32
    n: u32                 # width of g (and of u, which follows it)
    x_stride: u32
    y_stride: u32


@dataclass(kw_only=True)
class GeluMul:
    rows: u32
    n: u32                 # width of g (and of u, which follows it)
    x_stride: u32
    y_stride: u32


@dataclass(kw_only=True)
class Softmax:
    rows: u32
    n: u32
    x_off: u32 = 0
    x_stride: u32
    y_off: u32 = 0
    y_stride: u32


# shader stem -> its struct (a shader missing here has no push constants)
PUSH = {"argmax": Argmax, "attend": Attend, "bias_add": BiasAdd, "conv_step": ConvStep, "core_eval": CoreEval,
        "deltanet": Deltanet, "embed": Embed, "fill": Fill, "gelu_mul": GeluMul, "gemv": Gemv,
        "gemv_q8": Gemv, "quantize_q8": QuantizeQ8,
        "moe_combine": MoeCombine, "rmsnorm": Rmsnorm, "rope": Rope, "route": Route,
        "silu_mul": SiluMul, "softmax": Softmax}


def glsl_fields(cls) -> list[tuple[str, str]]:
    """(name, GLSL type) of a struct's fields, in the block's order."""
    return [(f.name, GLSL_TYPES[f.type]) for f in fields(cls)]


def pack(value) -> bytes:
    """The struct as the block's bytes (every field 4 bytes, in block order)."""
    fmt = {"uint": "I", "int": "i", "float": "f"}
    out = []
    for name, typ in glsl_fields(type(value)):
        v = getattr(value, name)
        if typ == "uint" and not 0 <= int(v) < 1 << 32:
            raise ValueError(f"{type(value).__name__}.{name} is a uint, got {v}")
        out.append(struct.pack("<" + fmt[typ], float(v) if typ == "float" else int(v)))
    return b"".join(out)


def check(stem: str, block, variant: str = "") -> list[str]:
    """Differences between a shader's reflected push block (vkspec.shaders.spirv
    Block or None) and its struct here; empty when they agree."""
    cls = PUSH.get(stem)
    where = variant or stem
    if cls is None:
        return [] if block is None else [f"{where}: has a push-constant block but push.py has no struct for it"]
    if block is None:
        return [f"{where}: push.py declares {cls.__name__} but the shader has no push-constant block"]
    want = [(n, t, 4 * i) for i, (n, t) in enumerate(glsl_fields(cls))]
    got = [(m.name, m.type, m.offset) for m in block.members]
    if want == got:
        return []
    return [f"{where}: push block {got} != push.py {cls.__name__} {want}"]

