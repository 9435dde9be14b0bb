#version 450
// y = gelu_tanh(g) * u, the GELU-tanh gated MLP's activation (Gemma 3), from
// the exact core's sigmoid (x_gelu_tanh: no driver tanh); g and u are the two
// halves of one [gate; up] projection row. Twin of backends/cpu/ops.py gelu_mul.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // width of g (and of u, which follows it)
    uint x_stride;
    uint y_stride;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.n) return;
    uint r = i / p.n, c = i % p.n;
    precise float v = x_gelu_tanh(x[r * p.x_stride + c]) * x[r * p.x_stride + p.n + c];
    y[r * p.y_stride + c] = v;
}
