#version 450
// The DeltaNet's causal depthwise conv over rows 0..rows-1 of a block, then
// silu; one invocation per channel walks the rows in order. Twin of
// backends/cpu/ops.py conv_step (taps summed in order 0..K-1, from +0).
// The ring (K-1 rows, oldest first) is read from region step.live of the
// state buffer and, after row r, written to region step.slot[r] when it has
// one (a copy slot, for rollback). The last row's region becomes live; the
// live one is never written, so the state before the block stays restorable.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
#include "step.glsl"

// MAX_* come from vkspec/shaders/limits.py (the build's -D defines)

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };     // (channels, K)
layout(std430, binding = 2) buffer R { float ring[]; };           // (regions, K-1, channels)
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
STEP_BLOCK(4)
layout(push_constant) uniform Push {
    uint rows;
    uint channels;
    uint k;         // kernel taps
    uint x_stride;
    uint y_stride;
    uint w_off;     // the layer's kernel in the vectors arena
    uint r_off;     // the layer's ring in the ring arena
} p;

void main() {
    uint c = gl_GlobalInvocationID.x;
    if (c >= p.channels) return;
    uint region = (p.k - 1u) * p.channels, rb = p.r_off;
    float win[MAX_K];
    for (uint t = 0u; t + 1u < p.k; t++) win[t] = ring[rb + step.live * region + t * p.channels + c];
    for (uint r = 0u; r < p.rows; r++) {
        win[p.k - 1u] = x[r * p.x_stride + c];
        precise float acc = 0.0;
        for (uint t = 0u; t < p.k; t++) acc = acc + w[p.w_off + c * p.k + t] * win[t];
        y[r * p.y_stride + c] = x_silu(acc);
        for (uint t = 0u; t + 1u < p.k; t++) win[t] = win[t + 1u];
        uint sl = step.slot[r];
        if (sl != NO_SLOT) {
            for (uint t = 0u; t + 1u < p.k; t++) ring[rb + sl * region + t * p.channels + c] = win[t];
        }
    }
}
