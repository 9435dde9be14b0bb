#version 450
// y = exp(x - max x) * recip(sum exp(x - max x)), row by row. Twin of backends/cpu/ops.py softmax.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows;
    uint n;
    uint x_off;
    uint x_stride;
    uint y_off;
    uint y_stride;
} p;

uint xb;
float m;
vec4 e4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.n) {
            precise float d = x[xb + c + j] - m;
            v[j] = x_exp(d);
        }
    }
    return v;
}

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.rows) return;
    xb = p.x_off + row * p.x_stride;
    m = x[xb];
    for (uint i = 1u; i < p.n; i++) m = max(m, x[xb + i]);
    precise float s;
    X_REDUCE_ROW(s, x_padded(p.n), e4);
    float inv = x_recip(s);
    uint yb = p.y_off + row * p.y_stride;
    for (uint i = 0u; i < p.n; i++) {
        precise float d = x[xb + i] - m;
        precise float v = x_exp(d) * inv;
        y[yb + i] = v;
    }
}
