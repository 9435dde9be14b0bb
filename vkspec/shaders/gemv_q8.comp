#version 450
// variants: int8=W_INT8 int4_g64=W_INT4_G64 q4_0=W_Q4_0 q4_1=W_Q4_1 q5_0=W_Q5_0 q5_1=W_Q5_1 q8_0=W_Q8_0 q2_k=W_Q2_K q3_k=W_Q3_K q4_k=W_Q4_K q5_k=W_Q5_K q6_k=W_Q6_K int8_routed=W_INT8,ROUTED int4_g64_routed=W_INT4_G64,ROUTED q4_0_routed=W_Q4_0,ROUTED q4_1_routed=W_Q4_1,ROUTED q5_0_routed=W_Q5_0,ROUTED q5_1_routed=W_Q5_1,ROUTED q8_0_routed=W_Q8_0,ROUTED q2_k_routed=W_Q2_K,ROUTED q3_k_routed=W_Q3_K,ROUTED q4_k_routed=W_Q4_K,ROUTED q5_k_routed=W_Q5_K,ROUTED q6_k_routed=W_Q6_K,ROUTED int8_rowmap=W_INT8,ROWMAP int4_g64_rowmap=W_INT4_G64,ROWMAP q4_0_rowmap=W_Q4_0,ROWMAP q4_1_rowmap=W_Q4_1,ROWMAP q5_0_rowmap=W_Q5_0,ROWMAP q5_1_rowmap=W_Q5_1,ROWMAP q8_0_rowmap=W_Q8_0,ROWMAP q2_k_rowmap=W_Q2_K,ROWMAP q3_k_rowmap=W_Q3_K,ROWMAP q4_k_rowmap=W_Q4_K,ROWMAP q5_k_rowmap=W_Q5_K,ROWMAP q6_k_rowmap=W_Q6_K,ROWMAP int8_serial=W_INT8,SERIAL_LANES int4_g64_serial=W_INT4_G64,SERIAL_LANES q4_0_serial=W_Q4_0,SERIAL_LANES q4_1_serial=W_Q4_1,SERIAL_LANES q5_0_serial=W_Q5_0,SERIAL_LANES q5_1_serial=W_Q5_1,SERIAL_LANES q8_0_serial=W_Q8_0,SERIAL_LANES q2_k_serial=W_Q2_K,SERIAL_LANES q3_k_serial=W_Q3_K,SERIAL_LANES q4_k_serial=W_Q4_K,SERIAL_LANES q5_k_serial=W_Q5_K,SERIAL_LANES q6_k_serial=W_Q6_K,SERIAL_LANES int8_routed_serial=W_INT8,ROUTED,SERIAL_LANES int4_g64_routed_serial=W_INT4_G64,ROUTED,SERIAL_LANES q4_0_routed_serial=W_Q4_0,ROUTED,SERIAL_LANES q4_1_routed_serial=W_Q4_1,ROUTED,SERIAL_LANES q5_0_routed_serial=W_Q5_0,ROUTED,SERIAL_LANES q5_1_routed_serial=W_Q5_1,ROUTED,SERIAL_LANES q8_0_routed_serial=W_Q8_0,ROUTED,SERIAL_LANES q2_k_routed_serial=W_Q2_K,ROUTED,SERIAL_LANES q3_k_routed_serial=W_Q3_K,ROUTED,SERIAL_LANES q4_k_routed_serial=W_Q4_K,ROUTED,SERIAL_LANES q5_k_routed_serial=W_Q5_K,ROUTED,SERIAL_LANES q6_k_routed_serial=W_Q6_K,ROUTED,SERIAL_LANES int8_rowmap_serial=W_INT8,ROWMAP,SERIAL_LANES int4_g64_rowmap_serial=W_INT4_G64,ROWMAP,SERIAL_LANES q4_0_rowmap_serial=W_Q4_0,ROWMAP,SERIAL_LANES q4_1_rowmap_serial=W_Q4_1,ROWMAP,SERIAL_LANES q5_0_rowmap_serial=W_Q5_0,ROWMAP,SERIAL_LANES q5_1_rowmap_serial=W_Q5_1,ROWMAP,SERIAL_LANES q8_0_rowmap_serial=W_Q8_0,ROWMAP,SERIAL_LANES q2_k_rowmap_serial=W_Q2_K,ROWMAP,SERIAL_LANES q3_k_rowmap_serial=W_Q3_K,ROWMAP,SERIAL_LANES q4_k_rowmap_serial=W_Q4_K,ROWMAP,SERIAL_LANES q5_k_rowmap_serial=W_Q5_K,ROWMAP,SERIAL_LANES q6_k_rowmap_serial=W_Q6_K,ROWMAP,SERIAL_LANES
// y[r][m] = the q8 dot of input row r with weight row m, for up to 8 input
// rows: the twin of backends/cpu/ops.py gemv_q8 (exact.q8_dot). The input
// is quantize_q8.comp's output (QB-column blocks: int8 words, d, 16-column
// sums). Per float block b the integer sums s1 (and the min term s2) are
// exact, then exact.q8_combine: (dw * dx) * float(s1) [+|- (m * dx) *
// float(s2)]; block b goes to lane b mod 8 in order from +0, and the lanes
// fold 4, 2, 1 (exact.q8_reduce). The 8 invocations along x of a row are
// those 8 lanes, so each walks its own blocks in the definition's order; the
// fold goes through shared memory.
// Grid: (ceil(rows / 8), 1); ROUTED: (.., pairs). ROUTED and ROWMAP as in
// gemv.comp (gemv_rows.glsl). NVEC (input rows; ROUTED: 1) is a
// specialization constant, so the per-row loops unroll and their arrays
// stay in registers.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(constant_id = 0) const uint NVEC = 1u;
#define LANES 8u                // exact.Q8_LANES
#ifdef SERIAL_LANES
#define GROUP_ROWS 64u          // push.py Gemv.Q8_ROWS_PER_GROUP["serial"]
layout(local_size_x = 64) in;
#else
#define GROUP_ROWS 8u           // push.py Gemv.Q8_ROWS_PER_GROUP["parallel"]
layout(local_size_x = 8, local_size_y = 8) in;
#endif

// uvec4s: a 16-column group's values are one load (on Lavapipe the count
// of loads, not of bytes, sets the speed); rows start on whole uvec4s
layout(std430, binding = 2) readonly buffer Q { uvec4 q4[]; };
uint qw(uint i) { return q4[i >> 2][i & 3u]; }
#include "gemv_rows.glsl"
#include "weights_int.glsl"

#ifndef SERIAL_LANES
shared float lanes[MAXR * LANES * GROUP_ROWS];
#endif

// The contributions v[r] of float block b of the weight row at rb (outside
// scales at s0) for each input row (its q8 row at word xr[r]): the integer
// sums, then exact.q8_combine.
void block_sums(uint rb, uint s0, uint b, uint nb, uint xr[MAXR], out float v[MAXR]) {
    uint quarter = p.cols >> 2;
    uint o = rb + b * WI_BLOCK_BYTES;
    int s1[MAXR];
#if QB_32
    uint w[8];
    float dw, mw;
    wi_block32(o, s0, b, w, dw, mw);
    for (uint r = 0u; r < NVEC; r++) {
        uint c = (xr[r] >> 2) + 2u * b;
        uvec4 a0 = q4[c], a1 = q4[c + 1u];
        s1[r] = wi_dot4(w[0], a0.x) + wi_dot4(w[1], a0.y) + wi_dot4(w[2], a0.z) + wi_dot4(w[3], a0.w)
                + wi_dot4(w[4], a1.x) + wi_dot4(w[5], a1.y) + wi_dot4(w[6], a1.z) + wi_dot4(w[7], a1.w);
    }
#else
    for (uint r = 0u; r < NVEC; r++) s1[r] = 0;
    for (uint e = 0u; e < QB; e += 16u) {
        int sc = wi_scale(o, e);
        uint w0 = wi_word(o, e), w1 = wi_word(o, e + 4u), w2 = wi_word(o, e + 8u), w3 = wi_word(o, e + 12u);
        for (uint r = 0u; r < NVEC; r++) {
            uvec4 a = q4[(xr[r] + ((b * QB + e) >> 2)) >> 2];
            s1[r] += sc * (wi_dot4(w0, a.x) + wi_dot4(w1, a.y) + wi_dot4(w2, a.z) + wi_dot4(w3, a.w));
        }
    }
    float dw = wi_d(o);
#ifdef WI_MIN
    float mw = wi_min(o);
#endif
#endif
    for (uint r = 0u; r < NVEC; r++) {
        float dx = uintBitsToFloat(qw(xr[r] + quarter + b));
        precise float t = (dw * dx) * float(s1[r]);
#ifdef WI_MIN
        precise float u = (mw * dx) * float(wi_min_term(o, xr[r] + quarter + nb + b * (QB / 16u)));
#if WI_MIN > 0
        t = t + u;
#else
        t = t - u;
#endif
#endif
        v[r] = t;
    }
}

void main() {
    uint row = gl_WorkGroupID.x * GROUP_ROWS + gl_LocalInvocationID.y, wrow;
#ifdef SERIAL_LANES
    row = gl_WorkGroupID.x * GROUP_ROWS + gl_LocalInvocationID.x;
#endif
    // a whole workgroup has one pair, so this return skips no barrier
    if (!operands(gl_WorkGroupID.y)) return;
    bool live = weight_row(row, wrow);
    uint rb = w_base + wrow * p.row_bytes, s0 = s_base + wrow * p.s_stride, nb = p.cols / QB;
    uint xr[MAXR];
    for (uint r = 0u; r < NVEC; r++) xr[r] = x_off + r * p.x_stride;
    float v[MAXR];
#ifdef SERIAL_LANES
    // one invocation walks the 8 lanes of its row (Lavapipe: no barriers);
    // a lane's sum is indexed by the block, so it lives in memory, but it
    // is touched once a block, not once a column
    if (!live) return;
    precise float acc[MAXR * LANES];
    for (uint i = 0u; i < NVEC * LANES; i++) acc[i] = 0.0;
    for (uint b = 0u; b < nb; b++) {
        block_sums(rb, s0, b, nb, xr, v);
        for (uint r = 0u; r < NVEC; r++) acc[r * LANES + (b & 7u)] = acc[r * LANES + (b & 7u)] + v[r];
    }
    for (uint r = 0u; r < NVEC; r++) {
        uint i = r * LANES;
        for (uint l = 0u; l < 4u; l++) acc[i + l] = acc[i + l] + acc[i + l + 4u];
        for (uint l = 0u; l < 2u; l++) acc[i + l] = acc[i + l] + acc[i + l + 2u];
        precise float t = acc[i] + acc[i + 1u];
        put(r, row, t);
    }
#else
    // the 8 invocations along x are the 8 lanes; the fold goes through
    // shared memory
    uint lane = gl_LocalInvocationID.x, me = gl_LocalInvocationIndex;
    precise float acc[MAXR];
    for (uint r = 0u; r < NVEC; r++) acc[r] = 0.0;
    for (uint b = lane; live && b < nb; b += LANES) {
        block_sums(rb, s0, b, nb, xr, v);
        for (uint r = 0u; r < NVEC; r++) acc[r] = acc[r] + v[r];
    }
    for (uint r = 0u; r < NVEC; r++) lanes[r * LANES * GROUP_ROWS + me] = acc[r];
    barrier();
    for (uint stride = LANES / 2u; stride > 1u; stride >>= 1) {
        if (lane < stride) {
            for (uint r = 0u; r < NVEC; r++) {
                uint i = r * LANES * GROUP_ROWS + me;
                precise float t = lanes[i] + lanes[i + stride];
                lanes[i] = t;
            }
        }
        barrier();
    }
    if (lane == 0u && live) {
        for (uint r = 0u; r < NVEC; r++) {
            uint i = r * LANES * GROUP_ROWS + me;
            precise float t = lanes[i] + lanes[i + 1u];
            put(r, row, t);
        }
    }
#endif
}
