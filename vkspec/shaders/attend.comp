#version 450
// variants: scores=SCORES softmax=SOFTMAX out=OUT out_gated=OUT,GATED
// Causal attention of row r (position pos[r]) over cache rows 0..pos[r], in
// three passes (twin of backends/cpu/ops.py attend):
//   SCORES  s[r,h,l] = dot(q[r,h], k[l,kvh]) * scale     one invocation per l
//   SOFTMAX p[r,h,:] = softmax(s[r,h,0..pos[r]])          one per (r, h)
//   OUT     o[r,h,d] = dot(p[r,h,:], v[:,kvh,d])          one per d
// GATED multiplies o by sigmoid(gate), the gated attention's output gate.
// kvh = h / (heads / kv_heads) (grouped-query attention).
// A sliding window (window > 0) keeps the keys lo..pos[r], lo = max(0,
// pos[r] + 1 - window): distances 0..window-1. A key the row does not attend
// (before lo, past pos[r]) has probability +0 and its value is never read, so
// the reductions keep the whole row's order (a key's lane is its position mod
// 128); the steps before lo's 128-column block are skipped.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
#include "step.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };    // queries / gates
layout(std430, binding = 1) readonly buffer K { float kv[]; };   // k or v cache
layout(std430, binding = 2) buffer S { float s[]; };             // scores, then probs
layout(std430, binding = 3) writeonly buffer O { float o[]; };
STEP_BLOCK(4)
layout(push_constant) uniform Push {
    uint rows;
    uint heads;
    uint kv_heads;
    uint hd;
    uint q_stride;  // floats between rows of q (and of the gate)
    uint q_hstride; // floats between heads of q
    uint gate_off;  // first gate float
    uint s_stride;  // floats between (row, head) score rows (>= context)
    uint o_off;
    uint o_stride;
    float scale;
    uint kv_off;    // the layer's first float of the cache arena
    uint window;    // keys at distance 0..window-1 (0: every earlier key)
} p;

uint kvh(uint h) { return h / (p.heads / p.kv_heads); }
uint qb, kb, sb, vcol, len, lo;

vec4 qk4(uint c) {
    vec4 a = vec4(0.0), b = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.hd) { a[j] = q[qb + c + j]; b[j] = kv[kb + c + j]; }
    }
    precise vec4 r = a * b;
    return r;
}

float m_;
vec4 e4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j >= lo && c + j < len) {
            precise float d = s[sb + c + j] - m_;
            v[j] = x_exp(d);
        }
    }
    return v;
}

vec4 pv4(uint c) {
    vec4 a = vec4(0.0), b = vec4(0.0);
    uint row = p.kv_heads * p.hd;
    for (uint j = 0u; j < 4u; j++) {
        if (c + j >= lo && c + j < len) { a[j] = s[sb + c + j]; b[j] = kv[(c + j) * row + vcol]; }
    }
    precise vec4 r = a * b;
    return r;
}

void main() {
    uint rh = gl_GlobalInvocationID.y;      // row * heads + head
    if (rh >= p.rows * p.heads) return;
    uint r = rh / p.heads, h = rh % p.heads;
    len = step.pos[r] + 1u;
    lo = (p.window != 0u && len > p.window) ? len - p.window : 0u;
    uint first = lo / REDUCE_STRIDE * REDUCE_STRIDE;
    sb = rh * p.s_stride;
#if defined(SCORES)
    uint l = gl_GlobalInvocationID.x;
    if (l >= len || l < lo) return;
    qb = r * p.q_stride + h * p.q_hstride;
    kb = p.kv_off + (l * p.kv_heads + kvh(h)) * p.hd;
    precise float dot_;
    X_REDUCE_ROW(dot_, x_padded(p.hd), qk4);
    precise float v = dot_ * p.scale;
    s[sb + l] = v;
#elif defined(SOFTMAX)
    if (gl_GlobalInvocationID.x != 0u) return;
    m_ = s[sb + lo];
    for (uint i = lo + 1u; i < len; i++) m_ = max(m_, s[sb + i]);
    precise float sum;
    X_REDUCE_ROW_FROM(sum, first, x_padded(len), e4);
    float inv = x_recip(sum);
    for (uint i = lo; i < len; i++) {
        precise float d = s[sb + i] - m_;
        precise float v = x_exp(d) * inv;
        s[sb + i] = v;
    }
#elif defined(OUT)
    uint d = gl_GlobalInvocationID.x;
    if (d >= p.hd) return;
    vcol = p.kv_off + kvh(h) * p.hd + d;
    precise float v;
    X_REDUCE_ROW_FROM(v, first, x_padded(len), pv4);
#ifdef GATED
    v = v * x_sigmoid(q[p.gate_off + r * p.q_stride + h * p.q_hstride + d]);
#endif
    o[p.o_off + r * p.o_stride + h * p.hd + d] = v;
#endif
}
