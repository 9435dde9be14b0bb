#version 450
// MoE routing of each row: softmax over the router logits, the top k experts
// (ties to the lower index), their weights renormalised when asked. Twin of
// backends/cpu/ops.py's route.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

// MAX_* come from vkspec/shaders/limits.py (the build's -D defines)

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { uint idx[]; };     // (rows, k)
layout(std430, binding = 2) writeonly buffer W { float wt[]; };     // (rows, k)
layout(push_constant) uniform Push {
    uint rows;
    uint n;         // experts
    uint k;
    uint x_stride;
    uint normalize;
    uint y_off;     // first output (the layer's rows of the routing buffers)
} p;

uint xb;
float m_;
vec4 e4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.n) {
            precise float d = logits[xb + c + j] - m_;
            v[j] = x_exp(d);
        }
    }
    return v;
}

float top[MAX_K];
vec4 t4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) if (c + j < p.k) v[j] = top[c + j];
    return v;
}

void main() {
    uint r = gl_GlobalInvocationID.x;
    if (r >= p.rows) return;
    xb = r * p.x_stride;
    m_ = logits[xb];
    for (uint i = 1u; i < p.n; i++) m_ = max(m_, logits[xb + i]);
    precise float s;
    X_REDUCE_ROW(s, x_padded(p.n), e4);
    float inv = x_recip(s);
    float prob[MAX_E];
    for (uint i = 0u; i < p.n; i++) {
        precise float d = logits[xb + i] - m_;
        precise float v = x_exp(d) * inv;
        prob[i] = v;
    }
    uint taken[MAX_K];
    for (uint j = 0u; j < p.k; j++) {
        uint best = 0xffffffffu;
        for (uint i = 0u; i < p.n; i++) {
            bool used = false;
            for (uint t = 0u; t < j; t++) used = used || taken[t] == i;
            if (!used && (best == 0xffffffffu || prob[i] > prob[best])) best = i;
        }
        taken[j] = best;
        top[j] = prob[best];
    }
    float scale = 1.0;
    if (p.normalize != 0u) {
        precise float sum;
        X_REDUCE_ROW(sum, x_padded(p.k), t4);
        scale = x_recip(sum);
    }
    for (uint j = 0u; j < p.k; j++) {
        precise float v = top[j] * scale;
        idx[p.y_off + r * p.k + j] = taken[j];
        wt[p.y_off + r * p.k + j] = p.normalize != 0u ? v : top[j];
    }
}
