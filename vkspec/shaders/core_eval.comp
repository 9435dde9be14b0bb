#version 450
// y[i] = f(x[i]) for one core function picked by `op`: exposes the exact
// core's functions one by one, so tests compare each with its NumPy twin.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n;
    uint op;   // index in vkspec.exact.ELEMENTWISE
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    float v = x[i];
    float r;
    switch (p.op) {
        case 0u: r = x_exp(v); break;
        case 1u: r = x_log(v); break;
        case 2u: r = x_recip(v); break;
        case 3u: r = x_rsqrt(v); break;
        case 4u: r = x_sigmoid(v); break;
        case 5u: r = x_silu(v); break;
        case 6u: r = x_softplus(v); break;
        case 7u: r = x_log1p(v); break;
        case 8u: r = x_gelu_tanh(v); break;
        default: r = v; break;
    }
    y[i] = r;
}
