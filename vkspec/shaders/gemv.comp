#version 450
// variants: f32=W_F32 bf16=W_BF16 q8=W_Q8 q4=W_Q4 f32_acc=W_F32,ACC bf16_acc=W_BF16,ACC q8_acc=W_Q8,ACC q4_acc=W_Q4,ACC f32_routed=W_F32,ROUTED bf16_routed=W_BF16,ROUTED q8_routed=W_Q8,ROUTED q4_routed=W_Q4,ROUTED f32_rowmap=W_F32,ROWMAP bf16_rowmap=W_BF16,ROWMAP q8_rowmap=W_Q8,ROWMAP q4_rowmap=W_Q4,ROWMAP
// y[r][m] = dot(x[r], w[m]) for up to 8 input rows, each weight read once.
// Twin of backends/cpu/ops.py gemv. One invocation computes one output row, visiting
// the 32 lanes of the canonical order one after another; each input row keeps
// its own accumulators, so row r's bits do not depend on how many rows ran.
// ACC adds the result to y (the residual stream: x + gemv(w, h) in one pass).
// ROUTED (the experts): invocation (m, pair) computes one row of expert
// idx[pair]'s matrix (held in device slot slot_of[expert]) for input row
// pair / x_div, into output row pair; a pair whose expert has no slot is
// left alone (the expert tier computes it on the CPU).
// ROWMAP (the MTP head's draft vocabulary): output row m is weight row
// row_of[m], so the lm_head scores only the listed ids.
// Weights: W_F32 rows of float; W_BF16 f32 values that are bf16 values, as
// their high halves (2 per uint, column 2i low): half the bytes, same values;
// W_Q8 int8 x per-row scale (4 per uint);
// W_Q4 unsigned nibble - 8, x scale per 64 columns (8 per uint).
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;

#ifdef W_F32
layout(std430, binding = 0) readonly buffer W { vec4 w4[]; };
#else
layout(std430, binding = 0) readonly buffer W { uint wq[]; };
#endif
layout(std430, binding = 1) readonly buffer S { float scales[]; };
layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 3) buffer Y { float y[]; };
#ifdef ROUTED
layout(std430, binding = 4) readonly buffer I { uint idx[]; };
layout(std430, binding = 5) readonly buffer M { uint slot_of[]; };   // expert -> device slot
#endif
#ifdef ROWMAP
layout(std430, binding = 4) readonly buffer RM { uint row_of[]; };
#endif

layout(push_constant) uniform Push {
    uint rows;      // output rows (M)
    uint cols;      // columns, padded to a multiple of 128
    uint nvec;      // input rows, 1..8 (ROUTED: pairs, one per invocation)
    uint w_off;     // first weight element (floats for f32, uints otherwise)
    uint s_off;     // first scale
    uint x_off;     // first input float (multiple of 4)
    uint x_stride;  // floats between input rows (multiple of 4)
    uint y_off;     // first output float
    uint y_stride;  // floats between output rows
    uint w_expert;  // ROUTED: weight elements per expert
    uint s_expert;  // ROUTED: scales per expert
    uint x_div;     // ROUTED: pairs per input row
    uint idx_off;   // ROUTED: first expert index
} p;

#define MAXR 8u

uint w_base, s_base;

vec4 load_w(uint row, uint col) {
#if defined(W_F32)
    return w4[(w_base + row * p.cols + col) >> 2];
#elif defined(W_BF16)
    uint i = w_base + ((row * p.cols + col) >> 1);
    uint a = wq[i], b = wq[i + 1u];
    return vec4(uintBitsToFloat(a << 16), uintBitsToFloat(a & 0xffff0000u),
                uintBitsToFloat(b << 16), uintBitsToFloat(b & 0xffff0000u));
#elif defined(W_Q8)
    int u = int(wq[w_base + ((row * p.cols + col) >> 2)]);
    vec4 q = vec4(bitfieldExtract(u, 0, 8), bitfieldExtract(u, 8, 8),
                  bitfieldExtract(u, 16, 8), bitfieldExtract(u, 24, 8));
    precise vec4 r = q * scales[s_base + row];
    return r;
#elif defined(W_Q4)
    uint u = wq[w_base + ((row * p.cols + col) >> 3)] >> ((col & 4u) * 4u);
    vec4 q = vec4(ivec4(u & 15u, (u >> 4) & 15u, (u >> 8) & 15u, (u >> 12) & 15u) - 8);
    precise vec4 r = q * scales[s_base + row * (p.cols >> 6) + (col >> 6)];
    return r;
#endif
}

// Called with a constant row count, so that after inlining the driver can
// unroll the row loops and keep acc and st in registers: with a variable
// count Lavapipe kept them in memory and a 4096 x 192 gemv took ~11 ms
// instead of ~1.7 ms.
void rows_of(uint row, uint wrow, uint x_off, uint y_off, const uint nvec) {
    float st[MAXR][6];
    uint sp = 0u;
    for (uint i = 0u; i < REDUCE_LANES; i++) {
        uint lane = x_tree_lane(i);
        precise vec4 acc[MAXR];
        for (uint r = 0u; r < MAXR; r++) acc[r] = vec4(0.0);
        for (uint c = lane * 4u; c < p.cols; c += REDUCE_STRIDE) {
            vec4 wv = load_w(wrow, c);
            for (uint r = 0u; r < nvec; r++) {
                acc[r] = acc[r] + x4[(x_off + r * p.x_stride + c) >> 2] * wv;
            }
        }
        for (uint r = 0u; r < nvec; r++) st[r][sp] = x_fold4(acc[r]);
        sp++;
        for (uint j = i + 1u; (j & 1u) == 0u; j >>= 1) {
            for (uint r = 0u; r < nvec; r++) {
                precise float t = st[r][sp - 2u] + st[r][sp - 1u];
                st[r][sp - 2u] = t;
            }
            sp--;
        }
    }
    for (uint r = 0u; r < nvec; r++) {
        uint o = y_off + r * p.y_stride + row;
#ifdef ACC
        precise float v = y[o] + st[r][0];
        y[o] = v;
#else
        y[o] = st[r][0];
#endif
    }
}

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.rows) return;
    w_base = p.w_off;
    s_base = p.s_off;
    uint nvec = p.nvec, x_off = p.x_off, y_off = p.y_off;
#ifdef ROWMAP
    uint wrow = row_of[row];
#else
    uint wrow = row;
#endif
#ifdef ROUTED
    uint pair = gl_GlobalInvocationID.y;
    if (pair >= p.nvec) return;
    uint e = slot_of[idx[p.idx_off + pair]];
    if (e == 0xffffffffu) return;
    w_base += e * p.w_expert;
    s_base += e * p.s_expert;
    nvec = 1u;
    x_off += (pair / p.x_div) * p.x_stride;
    y_off += pair * p.y_stride;
#endif
    switch (nvec) {
    case 1u: rows_of(row, wrow, x_off, y_off, 1u); break;
    case 2u: rows_of(row, wrow, x_off, y_off, 2u); break;
    case 3u: rows_of(row, wrow, x_off, y_off, 3u); break;
    case 4u: rows_of(row, wrow, x_off, y_off, 4u); break;
    case 5u: rows_of(row, wrow, x_off, y_off, 5u); break;
    case 6u: rows_of(row, wrow, x_off, y_off, 6u); break;
    case 7u: rows_of(row, wrow, x_off, y_off, 7u); break;
    default: rows_of(row, wrow, x_off, y_off, 8u); break;
    }
}
