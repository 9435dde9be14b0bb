#version 450
// variants: plain= gated=GATED acc=ACC
// y = x * rsqrt(mean(x*x) + eps) * w, row by row; GATED multiplies by silu(z)
// (linear_attn.norm); ACC adds the result to y (y = y + norm: a sandwich norm
// on a sublayer's output, then the residual add). Twin of
// backends/cpu/ops.py rmsnorm (z: gated; residual: acc).
// w is the effective weight (1 + weight for the (1 + w) form, made on the host).
// Row r lives at off + (r / group) * stride + (r % group) * inner, so per-head
// norms can read heads out of a wider projection.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
#ifdef ACC
layout(std430, binding = 2) buffer Y { float y[]; };
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#endif
#ifdef GATED
layout(std430, binding = 3) readonly buffer Z { float z[]; };
#endif
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // columns
    uint group;     // rows per outer stride (1 for plain rows)
    uint x_off;
    uint x_stride;
    uint x_inner;
    uint w_off;
    uint y_off;
    uint y_stride;
    uint y_inner;
    uint z_off;
    uint z_stride;
    uint z_inner;
    float eps;
    float inv_n;    // float32(1 / n)
} p;

uint at(uint r, uint off, uint stride, uint inner) {
    return off + (r / p.group) * stride + (r % p.group) * inner;
}

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
    xb = at(row, p.x_off, p.x_stride, p.x_inner);
    precise float ss;
    X_REDUCE_ROW(ss, x_padded(p.n), sq4);
    precise float ms = ss * p.inv_n;
    float r = x_rsqrt(ms + p.eps);
    uint yb = at(row, p.y_off, p.y_stride, p.y_inner);
#ifdef GATED
    uint zb = at(row, p.z_off, p.z_stride, p.z_inner);
#endif
    for (uint i = 0u; i < p.n; i++) {
        precise float v = (x[xb + i] * r) * w[p.w_off + i];
#ifdef GATED
        v = v * x_silu(z[zb + i]);
#endif
#ifdef ACC
        v = y[yb + i] + v;
#endif
        y[yb + i] = v;
    }
}
