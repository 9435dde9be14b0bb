#version 450
// variants: inplace= acc=ACC
// A projection's bias, row by row: y += b (the biases of a fused q|k|v row,
// in place), or, ACC, y += x + b (o_proj's output and bias, then the residual
// stream: x + (W a + b) as the CPU adds them). Twin of backends/cpu/ops.py bias_add.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
#ifdef ACC
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
#else
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
#endif
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // bias length (columns)
    uint x_off;
    uint x_stride;
    uint y_off;
    uint y_stride;
    uint b_off;     // the bias in the vectors arena
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.n) return;
    uint r = i / p.n, c = i % p.n;
    uint yi = p.y_off + r * p.y_stride + c;
#ifdef ACC
    precise float v = x[p.x_off + r * p.x_stride + c] + b[p.b_off + c];
    precise float s = y[yi] + v;
    y[yi] = s;
#else
    precise float v = y[yi] + b[p.b_off + c];
    y[yi] = v;
#endif
}
