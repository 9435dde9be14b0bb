#version 450
// variants: f32=W_F32 f16=W_F16 bf16=W_BF16 int8=W_INT8 int4_g64=W_INT4_G64 fp8=W_FP8 q4_0=W_Q4_0 q4_1=W_Q4_1 q5_0=W_Q5_0 q5_1=W_Q5_1 q8_0=W_Q8_0 q2_k=W_Q2_K q3_k=W_Q3_K q4_k=W_Q4_K q5_k=W_Q5_K q6_k=W_Q6_K f32_serial=W_F32,SERIAL_LANES f16_serial=W_F16,SERIAL_LANES bf16_serial=W_BF16,SERIAL_LANES int8_serial=W_INT8,SERIAL_LANES int4_g64_serial=W_INT4_G64,SERIAL_LANES fp8_serial=W_FP8,SERIAL_LANES q4_0_serial=W_Q4_0,SERIAL_LANES q4_1_serial=W_Q4_1,SERIAL_LANES q5_0_serial=W_Q5_0,SERIAL_LANES q5_1_serial=W_Q5_1,SERIAL_LANES q8_0_serial=W_Q8_0,SERIAL_LANES q2_k_serial=W_Q2_K,SERIAL_LANES q3_k_serial=W_Q3_K,SERIAL_LANES q4_k_serial=W_Q4_K,SERIAL_LANES q5_k_serial=W_Q5_K,SERIAL_LANES q6_k_serial=W_Q6_K,SERIAL_LANES f32_routed=W_F32,ROUTED f16_routed=W_F16,ROUTED bf16_routed=W_BF16,ROUTED int8_routed=W_INT8,ROUTED int4_g64_routed=W_INT4_G64,ROUTED fp8_routed=W_FP8,ROUTED q4_0_routed=W_Q4_0,ROUTED q4_1_routed=W_Q4_1,ROUTED q5_0_routed=W_Q5_0,ROUTED q5_1_routed=W_Q5_1,ROUTED q8_0_routed=W_Q8_0,ROUTED q2_k_routed=W_Q2_K,ROUTED q3_k_routed=W_Q3_K,ROUTED q4_k_routed=W_Q4_K,ROUTED q5_k_routed=W_Q5_K,ROUTED q6_k_routed=W_Q6_K,ROUTED f32_routed_serial=W_F32,ROUTED,SERIAL_LANES f16_routed_serial=W_F16,ROUTED,SERIAL_LANES bf16_routed_serial=W_BF16,ROUTED,SERIAL_LANES int8_routed_serial=W_INT8,ROUTED,SERIAL_LANES int4_g64_routed_serial=W_INT4_G64,ROUTED,SERIAL_LANES fp8_routed_serial=W_FP8,ROUTED,SERIAL_LANES q4_0_routed_serial=W_Q4_0,ROUTED,SERIAL_LANES q4_1_routed_serial=W_Q4_1,ROUTED,SERIAL_LANES q5_0_routed_serial=W_Q5_0,ROUTED,SERIAL_LANES q5_1_routed_serial=W_Q5_1,ROUTED,SERIAL_LANES q8_0_routed_serial=W_Q8_0,ROUTED,SERIAL_LANES q2_k_routed_serial=W_Q2_K,ROUTED,SERIAL_LANES q3_k_routed_serial=W_Q3_K,ROUTED,SERIAL_LANES q4_k_routed_serial=W_Q4_K,ROUTED,SERIAL_LANES q5_k_routed_serial=W_Q5_K,ROUTED,SERIAL_LANES q6_k_routed_serial=W_Q6_K,ROUTED,SERIAL_LANES f32_rowmap=W_F32,ROWMAP f16_rowmap=W_F16,ROWMAP bf16_rowmap=W_BF16,ROWMAP int8_rowmap=W_INT8,ROWMAP int4_g64_rowmap=W_INT4_G64,ROWMAP fp8_rowmap=W_FP8,ROWMAP q4_0_rowmap=W_Q4_0,ROWMAP q4_1_rowmap=W_Q4_1,ROWMAP q5_0_rowmap=W_Q5_0,ROWMAP q5_1_rowmap=W_Q5_1,ROWMAP q8_0_rowmap=W_Q8_0,ROWMAP q2_k_rowmap=W_Q2_K,ROWMAP q3_k_rowmap=W_Q3_K,ROWMAP q4_k_rowmap=W_Q4_K,ROWMAP q5_k_rowmap=W_Q5_K,ROWMAP q6_k_rowmap=W_Q6_K,ROWMAP f32_rowmap_serial=W_F32,ROWMAP,SERIAL_LANES f16_rowmap_serial=W_F16,ROWMAP,SERIAL_LANES bf16_rowmap_serial=W_BF16,ROWMAP,SERIAL_LANES int8_rowmap_serial=W_INT8,ROWMAP,SERIAL_LANES int4_g64_rowmap_serial=W_INT4_G64,ROWMAP,SERIAL_LANES fp8_rowmap_serial=W_FP8,ROWMAP,SERIAL_LANES q4_0_rowmap_serial=W_Q4_0,ROWMAP,SERIAL_LANES q4_1_rowmap_serial=W_Q4_1,ROWMAP,SERIAL_LANES q5_0_rowmap_serial=W_Q5_0,ROWMAP,SERIAL_LANES q5_1_rowmap_serial=W_Q5_1,ROWMAP,SERIAL_LANES q8_0_rowmap_serial=W_Q8_0,ROWMAP,SERIAL_LANES q2_k_rowmap_serial=W_Q2_K,ROWMAP,SERIAL_LANES q3_k_rowmap_serial=W_Q3_K,ROWMAP,SERIAL_LANES q4_k_rowmap_serial=W_Q4_K,ROWMAP,SERIAL_LANES q5_k_rowmap_serial=W_Q5_K,ROWMAP,SERIAL_LANES q6_k_rowmap_serial=W_Q6_K,ROWMAP,SERIAL_LANES
// y[r][m] = dot(x[r], w[m]) for up to 8 input rows, each weight read once.
// Twin of backends/cpu/ops.py gemv. Every output row is exact.py's dot: lane
// l of 32 accumulates columns c*128 + 4l .. +3 into a vec4, folds it
// (x+y)+(z+w), and the lanes combine in the fixed tree s[l] += s[l + stride]
// for stride 16, 8, .., 1. Each input row keeps its own accumulators, so row
// r's bits do not depend on how many rows ran. Two layouts of the same sums
// (the order in which lanes are visited is free; the bits are the same):
// - parallel (the default, for GPUs): the 32 invocations along x are the 32
//   lanes, so neighbouring invocations read neighbouring weight words (at
//   each 128-column step the lanes of a row read one contiguous stretch),
//   and the lane sums combine through shared memory, a barrier between tree
//   levels. A workgroup is 32 x GROUP_ROWS invocations, one row each 32.
// - SERIAL_LANES (for CPU devices, Lavapipe): one invocation walks whole
//   rows (INV_ROWS of them), visiting the lanes 8 at a time, 64 rows a
//   workgroup. Neighbouring invocations read addresses rows apart, which a
//   GPU cannot coalesce. Lavapipe (Mesa 22) makes every storage buffer load
//   a loop over its SIMD lanes, so what costs there is the count of loads:
//   here each input vec4 is read once for INV_ROWS rows, and a 32-column
//   block's words once for its 8 lanes (tests/bench/bench_core.py measures
//   it; the parallel layout has 32 invocations a row and the barriers of
//   the tree).
// Grid: (ceil(rows / push.py's Gemv rows_per_group), 1); ROUTED: (.., pairs).
// Weights in any format of weights.glsl (W_<FORMAT>), rows of row_bytes
// bytes from byte w_off; columns past `cols` are never read (a padded column
// adds +0 to a lane that is never -0: the same bits).
// acc != 0 adds the result to y (the residual stream: x + gemv(w, h) in one pass).
// ROUTED (the experts): workgroup (m, pair) computes rows of expert
// idx[pair]'s matrix (held in device slot slot_of[expert]) for input row
// pair / x_div, into output row pair; a pair whose expert has no slot is
// left alone (the expert tier computes it on the CPU).
// ROWMAP (the MTP head's draft vocabulary): output row m is weight row
// row_of[m], computed by the dispatch whose part holds that row (a matrix
// larger than one buffer is split in parts of part_rows rows from first_row).
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

// rows per workgroup: push.py's Gemv.rows_per_group, which sizes the grid
#ifdef SERIAL_LANES
// An invocation computes INV_ROWS weight rows (reading each input vec4 once
// for all of them), 64 rows a workgroup. NVEC, the input rows (the push's
// nvec), INV_ROWS and the workgroup's width are specialization constants
// (recorder.gemv_spec), so each pipeline holds the code of one count.
layout(constant_id = 0) const uint NVEC = 1u;
layout(constant_id = 1) const uint INV_ROWS = 1u;
layout(local_size_x = 64, local_size_x_id = 2) in;
#define MAX_INV_ROWS 4u
#ifdef ROUTED
#define ROWS_IN 1u
#else
#define ROWS_IN NVEC
#endif
#else
#define GROUP_ROWS 2u
layout(local_size_x = 32, local_size_y = 2) in;
#endif

layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
#include "gemv_rows.glsl"

#ifdef SERIAL_LANES
// The folded sums of lanes 8g..8g+7 of each input row for the invocation's
// INV_ROWS weight rows: at each 128-column step these lanes read one
// 32-column block of each row (w_block32), and each input vec4 is read once
// for all the rows. Every array here is indexed by constants once the driver
// unrolls the loops, so it stays in registers (an array indexed by a variable
// stays in memory on Lavapipe, which made the gemv several times slower).
void lane_group(uint rb[MAX_INV_ROWS], uint s0[MAX_INV_ROWS], bool live[MAX_INV_ROWS], uint g,
                out float f[MAX_INV_ROWS][MAXR][8]) {
    precise vec4 acc[MAX_INV_ROWS][MAXR][8];
    for (uint k = 0u; k < INV_ROWS; k++)
        for (uint r = 0u; r < ROWS_IN; r++)
            for (uint t = 0u; t < 8u; t++) acc[k][r][t] = vec4(0.0);
    for (uint c = 32u * g; c < p.cols; c += REDUCE_STRIDE) {
        vec4 wv[MAX_INV_ROWS][8];
        for (uint k = 0u; k < INV_ROWS; k++) {
            if (live[k]) w_block32(rb[k], s0[k], c, p.cols, wv[k]);
        }
        for (uint t = 0u; t < 8u; t++) {
            if (c + 4u * t < p.cols) {
                for (uint r = 0u; r < ROWS_IN; r++) {
                    vec4 xv = x4[(x_off + r * p.x_stride + c + 4u * t) >> 2];
                    for (uint k = 0u; k < INV_ROWS; k++) acc[k][r][t] = acc[k][r][t] + xv * wv[k][t];
                }
            }
        }
    }
    for (uint k = 0u; k < INV_ROWS; k++)
        for (uint r = 0u; r < ROWS_IN; r++)
            for (uint t = 0u; t < 8u; t++) f[k][r][t] = x_fold4(acc[k][r][t]);
}

// An invocation walks INV_ROWS whole rows. The tree's stride 16 joins lane
// group 0 with 2 (a) and group 1 with 3 (b), stride 8 a with b, then 4, 2, 1.
// The groups run in a loop, not unrolled, so the pipeline holds one copy of
// lane_group: Lavapipe compiles it in seconds, not minutes.
void main() {
    if (!operands(gl_GlobalInvocationID.y)) return;
    uint rb[MAX_INV_ROWS], s0[MAX_INV_ROWS], rows[MAX_INV_ROWS];
    bool live[MAX_INV_ROWS];
    for (uint k = 0u; k < INV_ROWS; k++) {
        uint wrow;
        rows[k] = gl_GlobalInvocationID.x * INV_ROWS + k;
        live[k] = weight_row(rows[k], wrow);
        rb[k] = w_base + wrow * p.row_bytes;
        s0[k] = s_base + wrow * p.s_stride;
    }
    float a[MAX_INV_ROWS][MAXR][8], b[MAX_INV_ROWS][MAXR][8];
    for (uint g = 0u; g < REDUCE_LANES / 8u; g++) {
        float f[MAX_INV_ROWS][MAXR][8];
        lane_group(rb, s0, live, g, f);
        for (uint k = 0u; k < INV_ROWS; k++) {
            for (uint r = 0u; r < ROWS_IN; r++) {
                for (uint t = 0u; t < 8u; t++) {
                    precise float ua = a[k][r][t] + f[k][r][t];
                    precise float ub = b[k][r][t] + f[k][r][t];
                    if (g == 0u) a[k][r][t] = f[k][r][t];
                    else if (g == 1u) b[k][r][t] = f[k][r][t];
                    else if (g == 2u) a[k][r][t] = ua;
                    else b[k][r][t] = ub;
                }
            }
        }
    }
    for (uint k = 0u; k < INV_ROWS; k++) {
        for (uint r = 0u; r < ROWS_IN; r++) {
            for (uint t = 0u; t < 8u; t++) { precise float v = a[k][r][t] + b[k][r][t]; a[k][r][t] = v; }
            for (uint t = 0u; t < 4u; t++) { precise float v = a[k][r][t] + a[k][r][t + 4u]; a[k][r][t] = v; }
            for (uint t = 0u; t < 2u; t++) { precise float v = a[k][r][t] + a[k][r][t + 2u]; a[k][r][t] = v; }
            precise float v = a[k][r][0] + a[k][r][1];
            if (live[k]) put(r, rows[k], v);
        }
    }
}

#else
#define GROUP_INV (REDUCE_LANES * GROUP_ROWS)

// the lane sum of input row r of invocation i at sums[r * GROUP_INV + i]
shared float sums[MAXR * GROUP_INV];

// Each input row's accumulator is a variable of its own: the guards test a
// uniform count, so they do not diverge, and no array is indexed by it (such
// an array stays in memory on Lavapipe). One copy of the loop for every
// count: eight copies specialised by a switch ran slower on Lavapipe.
#define X_ROW(k) (x4[(x_off + (k) * p.x_stride + c) >> 2])
#define ACC_STEP(k) if (nvec > uint(k)) a##k = a##k + X_ROW(uint(k)) * wv
#define ACC_OUT(k) if (nvec > uint(k)) sums[uint(k) * GROUP_INV + me] = x_fold4(a##k)

void main() {
    uint lane = gl_LocalInvocationID.x, me = gl_LocalInvocationIndex;
    uint row = gl_WorkGroupID.x * GROUP_ROWS + gl_LocalInvocationID.y, wrow;
    // a whole workgroup has one pair, so this return skips no barrier
    if (!operands(gl_WorkGroupID.y)) return;
    bool live = weight_row(row, wrow);
    precise vec4 a0 = vec4(0.0), a1 = vec4(0.0), a2 = vec4(0.0), a3 = vec4(0.0),
                 a4 = vec4(0.0), a5 = vec4(0.0), a6 = vec4(0.0), a7 = vec4(0.0);
    if (live) {
        uint rb = w_base + wrow * p.row_bytes, s0 = s_base + wrow * p.s_stride;
        for (uint c = lane * 4u; c < p.cols; c += REDUCE_STRIDE) {
            vec4 wv = w_vec4(rb, s0, c);
            ACC_STEP(0); ACC_STEP(1); ACC_STEP(2); ACC_STEP(3);
            ACC_STEP(4); ACC_STEP(5); ACC_STEP(6); ACC_STEP(7);
        }
    }
    ACC_OUT(0); ACC_OUT(1); ACC_OUT(2); ACC_OUT(3);
    ACC_OUT(4); ACC_OUT(5); ACC_OUT(6); ACC_OUT(7);
    // the tree's levels 16, 8, 4, 2 here, 1 at the output; every invocation
    // of the workgroup reaches every barrier
    barrier();
    for (uint stride = REDUCE_LANES / 2u; stride > 1u; stride >>= 1) {
        if (lane < stride) {
            for (uint r = 0u; r < nvec; r++) {
                uint i = r * GROUP_INV + me;
                precise float t = sums[i] + sums[i + stride];
                sums[i] = t;
            }
        }
        barrier();
    }
    if (lane == 0u && live) {
        for (uint r = 0u; r < nvec; r++) {
            uint i = r * GROUP_INV + me;
            precise float t = sums[i] + sums[i + 1u];
            put(r, row, t);
        }
    }
}
#endif
