#version 450
// variants: b32=QBLOCK=32u b256=QBLOCK=256u
// Rows of float activations -> q8 blocks of QBLOCK columns: the twin of
// backends/cpu/ops.py quantize_q8 (exact.quantize_q8 and exact.q8_sums).
// Per block d = max|x| * f32(1/127), q = round(x * recip(d)) half to even,
// clamped to [-127, 127]; a block with an inf or NaN gets d = NaN and q = 0,
// one whose d is below the smallest normal gets d = 0 and q = 0. The max is
// exact in any order, so the invocations of a block may combine it freely.
// Output row r at words q_off + r * q_stride (recorder.q8_words):
//   [0, cols/4)                      the int8 values, 4 to a word, column order
//   [cols/4, cols/4 + nb)            d of each block (float bits)
//   [cols/4 + nb, .. + cols/16)      the int sum of each 16 values (q8_sums)
// Grid: (ceil(cols / 256), rows); an invocation quantises 4 columns.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer Q { uint qw[]; };

layout(push_constant) uniform Push {
    uint rows;      // input rows
    uint cols;      // columns, a multiple of QBLOCK
    uint x_off;     // first input float (multiple of 4)
    uint x_stride;  // floats between input rows (multiple of 4)
    uint q_off;     // first output word
    uint q_stride;  // words between output rows
} p;

#define PER_BLOCK (QBLOCK / 4u)     // invocations of a block
#define INV_MAX uintBitsToFloat(0x3c010204u)     // f32(1 / 127)
#define ROUND_MAGIC 12582912.0                   // 1.5 * 2**23
#define MIN_NORMAL uintBitsToFloat(0x00800000u)

shared float amax[64];
shared uint bad[64];
shared int sum4[64];

void main() {
    uint i = gl_LocalInvocationID.x, row = gl_WorkGroupID.y;
    uint c = gl_WorkGroupID.x * 256u + 4u * i;
    bool live = c < p.cols && row < p.rows;
    vec4 v = live ? x4[(p.x_off + row * p.x_stride + c) >> 2] : vec4(0.0);
    uvec4 e = floatBitsToUint(v) & 0x7f800000u;
    vec4 a = abs(v);
    amax[i] = max(max(a.x, a.y), max(a.z, a.w));
    bad[i] = any(equal(e, uvec4(0x7f800000u))) ? 1u : 0u;
    barrier();
    uint first = i / PER_BLOCK * PER_BLOCK;
    float m = 0.0;
    uint inf_nan = 0u;
    for (uint k = 0u; k < PER_BLOCK; k++) {
        m = max(m, amax[first + k]);
        inf_nan |= bad[first + k];
    }
    precise float d = m * INV_MAX;
    bool ok = inf_nan == 0u && d >= MIN_NORMAL;
    float r = x_recip(ok ? d : 1.0);
    ivec4 q;
    for (uint k = 0u; k < 4u; k++) {
        precise float t = v[k] * r;
        precise float u = (t + ROUND_MAGIC) - ROUND_MAGIC;
        u = min(max(u, -127.0), 127.0);
        q[k] = ok ? int(u) : 0;
    }
    sum4[i] = q.x + q.y + q.z + q.w;
    barrier();
    if (!live) return;
    uint base = p.q_off + row * p.q_stride, quarter = p.cols >> 2;
    qw[base + (c >> 2)] = uint(q.x & 0xff) | (uint(q.y & 0xff) << 8) | (uint(q.z & 0xff) << 16)
                          | (uint(q.w & 0xff) << 24);
    if (i == first)
        qw[base + quarter + c / QBLOCK] = inf_nan != 0u ? 0x7fc00000u : (ok ? floatBitsToUint(d) : 0u);
    if ((i & 3u) == 0u)
        qw[base + quarter + p.cols / QBLOCK + (c >> 4)] = uint(sum4[i] + sum4[i + 1u] + sum4[i + 2u] + sum4[i + 3u]);
}
