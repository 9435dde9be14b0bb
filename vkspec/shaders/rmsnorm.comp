#version 450
// y = x * rsqrt(mean(x*x) + eps) * w, row by row. Twin of exact.rmsnorm.
// w is the effective weight (1 + weight for the (1 + w) form, made on the host).
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // columns
    uint x_off;
    uint x_stride;
    uint w_off;
    uint y_off;
    uint y_stride;
    float eps;
    float inv_n;    // float32(1 / n)
} p;

uint xb;
vec4 sq4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.n) v[j] = x[xb + c + j];
    }
    precise vec4 r = v * v;
    return r;
}

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.rows) return;
    xb = p.x_off + row * p.x_stride;
    precise float ss;
    X_REDUCE_ROW(ss, x_padded(p.n), sq4);
    precise float ms = ss * p.inv_n;
    float r = x_rsqrt(ms + p.eps);
    uint yb = p.y_off + row * p.y_stride;
    for (uint i = 0u; i < p.n; i++) {
        precise float v = (x[xb + i] * r) * w[p.w_off + i];
        y[yb + i] = v;
    }
}
