#version 450
// variants: f32=W_F32 f16=W_F16 bf16=W_BF16 int8=W_INT8 int4_g64=W_INT4_G64 fp8=W_FP8 q4_0=W_Q4_0 q4_1=W_Q4_1 q5_0=W_Q5_0 q5_1=W_Q5_1 q8_0=W_Q8_0 q2_k=W_Q2_K q3_k=W_Q3_K q4_k=W_Q4_K q5_k=W_Q5_K q6_k=W_Q6_K f32_routed=W_F32,ROUTED f16_routed=W_F16,ROUTED bf16_routed=W_BF16,ROUTED int8_routed=W_INT8,ROUTED int4_g64_routed=W_INT4_G64,ROUTED fp8_routed=W_FP8,ROUTED q4_0_routed=W_Q4_0,ROUTED q4_1_routed=W_Q4_1,ROUTED q5_0_routed=W_Q5_0,ROUTED q5_1_routed=W_Q5_1,ROUTED q8_0_routed=W_Q8_0,ROUTED q2_k_routed=W_Q2_K,ROUTED q3_k_routed=W_Q3_K,ROUTED q4_k_routed=W_Q4_K,ROUTED q5_k_routed=W_Q5_K,ROUTED q6_k_routed=W_Q6_K,ROUTED f32_rowmap=W_F32,ROWMAP f16_rowmap=W_F16,ROWMAP bf16_rowmap=W_BF16,ROWMAP int8_rowmap=W_INT8,ROWMAP int4_g64_rowmap=W_INT4_G64,ROWMAP fp8_rowmap=W_FP8,ROWMAP q4_0_rowmap=W_Q4_0,ROWMAP q4_1_rowmap=W_Q4_1,ROWMAP q5_0_rowmap=W_Q5_0,ROWMAP q5_1_rowmap=W_Q5_1,ROWMAP q8_0_rowmap=W_Q8_0,ROWMAP q2_k_rowmap=W_Q2_K,ROWMAP q3_k_rowmap=W_Q3_K,ROWMAP q4_k_rowmap=W_Q4_K,ROWMAP q5_k_rowmap=W_Q5_K,ROWMAP q6_k_rowmap=W_Q6_K,ROWMAP
// y[r][m] = dot(x[r], w[m]) for up to 8 input rows, each weight read once.
// Twin of backends/cpu/ops.py gemv. One invocation computes one output row,
// visiting the 32 lanes of the canonical order one after another; each input
// row keeps its own accumulators, so row r's bits do not depend on how many
// rows ran. Weights in any format of weights.glsl (W_<FORMAT>), rows of
// row_bytes bytes from byte w_off; columns past `cols` are never read (a
// padded column adds +0 to a lane that is never -0: the same bits).
// acc != 0 adds the result to y (the residual stream: x + gemv(w, h) in one pass).
// ROUTED (the experts): invocation (m, pair) computes one row of expert
// idx[pair]'s matrix (held in device slot slot_of[expert]) for input row
// pair / x_div, into output row pair; a pair whose expert has no slot is
// left alone (the expert tier computes it on the CPU).
// ROWMAP (the MTP head's draft vocabulary): output row m is weight row
// row_of[m], computed by the dispatch whose part holds that row (a matrix
// larger than one buffer is split in parts of part_rows rows from first_row).
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer W { uint wq[]; };
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
    uint cols;      // columns (K, a multiple of 4)
    uint nvec;      // input rows, 1..8 (ROUTED: pairs, one per invocation)
    uint w_off;     // first weight byte
    uint s_off;     // first scale
    uint x_off;     // first input float (multiple of 4)
    uint x_stride;  // floats between input rows (multiple of 4)
    uint y_off;     // first output float
    uint y_stride;  // floats between output rows
    uint row_bytes; // bytes between weight rows
    uint s_stride;  // scales between weight rows
    uint acc;       // 1: y += the result
    uint w_expert;  // ROUTED: weight bytes per expert
    uint s_expert;  // ROUTED: scales per expert
    uint x_div;     // ROUTED: pairs per input row
    uint idx_off;   // ROUTED: first expert index
    uint first_row; // ROWMAP: the part's first weight row
    uint part_rows; // ROWMAP: the part's rows
} p;

#include "weights.glsl"

#define MAXR 8u

uint w_base, s_base;

vec4 load_w(uint wrow, uint col) {
    uint rb = w_base + wrow * p.row_bytes, s0 = s_base + wrow * p.s_stride;
#if defined(W_F32)
    uint i = (rb >> 2) + col;
    return uintBitsToFloat(uvec4(wq[i], wq[i + 1u], wq[i + 2u], wq[i + 3u]));
#else
    return vec4(w_value(rb, s0, col), w_value(rb, s0, col + 1u), w_value(rb, s0, col + 2u),
                w_value(rb, s0, col + 3u));
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
        if (p.acc != 0u) {
            precise float v = y[o] + st[r][0];
            y[o] = v;
        } else {
            y[o] = st[r][0];
        }
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
    if (wrow < p.first_row || wrow >= p.first_row + p.part_rows) return;
    wrow -= p.first_row;
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
