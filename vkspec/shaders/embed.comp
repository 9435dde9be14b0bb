#version 450
// variants: f32=W_F32 f16=W_F16 bf16=W_BF16 int8=W_INT8 int4_g64=W_INT4_G64 fp8=W_FP8 q4_0=W_Q4_0 q4_1=W_Q4_1 q5_0=W_Q5_0 q5_1=W_Q5_1 q8_0=W_Q8_0 q2_k=W_Q2_K q3_k=W_Q3_K q4_k=W_Q4_K q5_k=W_Q5_K q6_k=W_Q6_K
// y[r] = table[tok[r]]: the embedding gather, the row's values decoded from
// the table's format (weights.glsl), times scale. Twin of backends/cpu/ops.py embed. A
// table larger than one buffer is split in parts (first_row, part_rows): the
// dispatch of the part holding the token writes its row.
#extension GL_GOOGLE_include_directive : require
#include "step.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint wq[]; };
layout(std430, binding = 1) readonly buffer S { float scales[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
STEP_BLOCK(3)
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // hidden size
    uint y_off;
    uint y_stride;
    uint row_bytes;
    uint s_stride;
    uint first_row;
    uint part_rows;
    float scale;    // the rows times this (Gemma's sqrt(hidden)); times 1 changes no bit
} p;

#include "weights.glsl"

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.n) return;
    uint r = i / p.n, c = i % p.n, t = step.tok[r];
    if (t < p.first_row || t >= p.first_row + p.part_rows) return;
    t -= p.first_row;
    precise float v = w_value(t * p.row_bytes, t * p.s_stride, c) * p.scale;
    y[p.y_off + r * p.y_stride + c] = v;
}
