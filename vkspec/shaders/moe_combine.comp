#version 450
// variants: routed= shared=SHARED
// x += sum_j y[r,j] * w[r,j] (the routed experts, in routing order, from +0),
// plus sigmoid(g[r]) * s[r] with SHARED (the shared expert and its gate).
// Twin of backends/cpu/ops.py's moe_combine.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };               // residual stream
layout(std430, binding = 1) readonly buffer Y { float y[]; };      // (rows * k, y_stride)
layout(std430, binding = 2) readonly buffer W { float wt[]; };     // (rows, k)
layout(std430, binding = 3) readonly buffer S { float sh[]; };     // shared expert out
layout(std430, binding = 4) readonly buffer G { float gate[]; };   // its gate logit
layout(push_constant) uniform Push {
    uint rows;
    uint n;
    uint k;
    uint x_off;     // first float of x's first row
    uint x_stride;
    uint y_stride;
    uint s_stride;
    uint g_stride;
    uint g_off;
    uint w_off;     // first routing weight of these rows
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.n) return;
    uint r = i / p.n, c = i % p.n;
    precise float acc = 0.0;
    for (uint j = 0u; j < p.k; j++) acc = acc + y[(r * p.k + j) * p.y_stride + c] * wt[p.w_off + r * p.k + j];
#ifdef SHARED
    acc = acc + x_sigmoid(gate[r * p.g_stride + p.g_off]) * sh[r * p.s_stride + c];
#endif
    uint xi = p.x_off + r * p.x_stride + c;
    precise float v = x[xi] + acc;
    x[xi] = v;
}
