#version 450
// y[r] = table[tok[r]]: the embedding gather. Twin of backends/cpu/ops.py embed.
#extension GL_GOOGLE_include_directive : require
#include "step.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer E { float table[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
STEP_BLOCK(2)
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // hidden size
    uint y_off;
    uint y_stride;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.n) return;
    uint r = i / p.n, c = i % p.n;
    y[p.y_off + r * p.y_stride + c] = table[step.tok[r] * p.n + c];
}
