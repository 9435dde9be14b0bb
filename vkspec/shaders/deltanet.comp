#version 450
// variants: prep=PREP scan=SCAN
// The gated delta rule over the rows of a block. Twins: backends/cpu/ops.py's
// deltanet_prep (PREP) and deltanet_scan (SCAN).
//   PREP  per row: q <- l2norm(q) * scale, k <- l2norm(k) per key head;
//         beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias))
//         per value head.
//   SCAN  one invocation per (value head h, column j) of the state S (dk x dv)
//         walks the rows: S *= decay; delta = (v_j - S[:,j].k) * beta;
//         S[:,j] += k * delta; o_j = S[:,j].q. The column is read from region
//         step.live and written after row r to region step.slot[r] when it
//         has one (the last row always has: the live region is never written).
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
#include "step.glsl"

// MAX_* come from vkspec/shaders/limits.py (the build's -D defines)

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer M { float mixed[]; };   // conv out (rows, q|k|v)
layout(std430, binding = 1) readonly buffer B { float ba[]; };      // (rows, b|a)
layout(std430, binding = 2) readonly buffer A { float par[]; };     // dt_bias | -exp(A_log)
layout(std430, binding = 3) buffer P { float prep[]; };             // (rows, q|k|beta|decay)
layout(std430, binding = 4) buffer S { float state[]; };            // (regions, nv, dk, dv)
layout(std430, binding = 5) writeonly buffer O { float o[]; };      // (rows, nv*dv)
STEP_BLOCK(6)
layout(push_constant) uniform Push {
    uint rows;
    uint nk;
    uint nv;
    uint dk;
    uint dv;
    uint m_stride;
    uint ba_off;
    uint ba_stride;
    uint o_stride;
    float scale;    // dk ** -0.5
    float eps;      // l2norm's
    uint p_off;     // the layer's dt_bias | -exp(A_log) in the vectors arena
    uint s_off;     // the layer's state in the ssm arena
    uint tiled;     // value head h reads key head h % nk (llama.cpp's tiled order), else h / (nv / nk)
} p;

uint pw() { return 2u * p.nk * p.dk + 2u * p.nv; }   // prep floats per row

uint xb;
vec4 sq4(uint c) {
    vec4 v = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.dk) v[j] = mixed[xb + c + j];
    }
    precise vec4 r = v * v;
    return r;
}

float col[MAX_DK];
uint vb;
vec4 kc4(uint c) {
    vec4 a = vec4(0.0), b = vec4(0.0);
    for (uint j = 0u; j < 4u; j++) {
        if (c + j < p.dk) { a[j] = prep[vb + c + j]; b[j] = col[c + j]; }
    }
    precise vec4 r = a * b;
    return r;
}

void main() {
#if defined(PREP)
    uint i = gl_GlobalInvocationID.x;
    uint per = 2u * p.nk + p.nv;
    if (i >= p.rows * per) return;
    uint r = i / per, j = i % per;
    uint pb = r * pw();
    if (j < 2u * p.nk) {            // q head j, or k head j - nk
        xb = r * p.m_stride + j * p.dk;
        precise float ss;
        X_REDUCE_ROW(ss, x_padded(p.dk), sq4);
        float inv = x_rsqrt(ss + p.eps);
        for (uint t = 0u; t < p.dk; t++) {
            precise float v = mixed[xb + t] * inv;
            if (j < p.nk) v = v * p.scale;
            prep[pb + j * p.dk + t] = v;
        }
    } else {                        // value head h
        uint h = j - 2u * p.nk;
        float b = ba[p.ba_off + r * p.ba_stride + h];
        precise float a = ba[p.ba_off + r * p.ba_stride + p.nv + h] + par[p.p_off + h];
        precise float g = par[p.p_off + p.nv + h] * x_softplus(a);
        prep[pb + 2u * p.nk * p.dk + h] = x_sigmoid(b);
        prep[pb + 2u * p.nk * p.dk + p.nv + h] = x_exp(g);
    }
#elif defined(SCAN)
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.nv * p.dv) return;
    uint h = i / p.dv, j = i % p.dv;
    uint kh = p.tiled != 0u ? h % p.nk : h / (p.nv / p.nk);
    uint region = p.nv * p.dk * p.dv;
    uint sb = h * p.dk * p.dv + j;              // S[h, t, j] = state[.. + t * dv]
    for (uint t = 0u; t < p.dk; t++) col[t] = state[p.s_off + step.live * region + sb + t * p.dv];
    for (uint r = 0u; r < p.rows; r++) {
        uint pb = r * pw();
        float beta = prep[pb + 2u * p.nk * p.dk + h];
        float decay = prep[pb + 2u * p.nk * p.dk + p.nv + h];
        for (uint t = 0u; t < p.dk; t++) {
            precise float v = col[t] * decay;
            col[t] = v;
        }
        vb = pb + (p.nk + kh) * p.dk;           // k
        precise float mem;
        X_REDUCE_ROW(mem, x_padded(p.dk), kc4);
        float vv = mixed[r * p.m_stride + 2u * p.nk * p.dk + h * p.dv + j];
        precise float delta = (vv - mem) * beta;
        for (uint t = 0u; t < p.dk; t++) {
            precise float v = col[t] + prep[vb + t] * delta;
            col[t] = v;
        }
        vb = pb + kh * p.dk;                    // q
        precise float out_;
        X_REDUCE_ROW(out_, x_padded(p.dk), kc4);
        o[r * p.o_stride + h * p.dv + j] = out_;
        uint sl = step.slot[r];
        if (sl != NO_SLOT) {
            for (uint t = 0u; t < p.dk; t++) state[p.s_off + sl * region + sb + t * p.dv] = col[t];
        }
    }
#endif
}
