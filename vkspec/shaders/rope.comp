#version 450
// variants: rows=ROWS cache=CACHE
// Partial RoPE: the first rot features of each head become
// x*cos + rotate_half(x)*sin, with cos/sin rows of the host's tables at the
// row's position; the rest pass through. Twin of backends/cpu/ops.py's rope;
// CACHE (its cache argument) writes row r to the cache row at its position
// (the KV store; with rot = 0 it is a plain copy, which is how V enters).
#extension GL_GOOGLE_include_directive : require
#include "step.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Cos { float cos_t[]; };   // the op table names a binding by its block (cos is GLSL's)
layout(std430, binding = 2) readonly buffer Sin { float sin_t[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
STEP_BLOCK(4)
layout(push_constant) uniform Push {
    uint rows;
    uint heads;
    uint hd;
    uint rot;       // rotary dims (even), 0 for none
    uint x_off;
    uint x_stride;  // floats between rows
    uint x_hstride; // floats between heads
    uint y_off;
    uint y_stride;  // floats between rows (CACHE: between positions)
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.heads * p.hd) return;
    uint d = i % p.hd, h = (i / p.hd) % p.heads, r = i / (p.hd * p.heads);
    uint xb = p.x_off + r * p.x_stride + h * p.x_hstride;
    uint pos = step.pos[r];
    float v = x[xb + d];
    if (d < p.rot) {
        uint half_ = p.rot / 2u;
        float rh = d < half_ ? -x[xb + d + half_] : x[xb + d - half_];
        precise float t = v * cos_t[pos * p.rot + d] + rh * sin_t[pos * p.rot + d];
        v = t;
    }
#ifdef CACHE
    y[p.y_off + pos * p.y_stride + h * p.hd + d] = v;
#else
    y[p.y_off + r * p.y_stride + h * p.hd + d] = v;
#endif
}
