// The rows of a GEMV dispatch, shared by gemv.comp and gemv_q8.comp: the
// buffers other than the input (binding 2, the including shader's), the push
// block (push.py Gemv), and which weight rows, input rows and output rows a
// workgroup has in the ROUTED and ROWMAP variants.
#ifndef VKSPEC_GEMV_ROWS_GLSL
#define VKSPEC_GEMV_ROWS_GLSL

layout(std430, binding = 0) readonly buffer W { uint wq[]; };
layout(std430, binding = 1) readonly buffer S { float scales[]; };
layout(std430, binding = 3) buffer Y { float y[]; };
#ifdef ROUTED
layout(std430, binding = 4) readonly buffer I { uint idx[]; };
layout(std430, binding = 5) readonly buffer M { uint slot_of[]; };   // expert -> device slot
#endif
#ifdef ROWMAP
layout(std430, binding = 4) readonly buffer RM { uint row_of[]; };
#endif

layout(push_constant) uniform Push {
    uint rows;      // output rows (M)
    uint cols;      // columns (K, a multiple of 4)
    uint nvec;      // input rows, 1..8 (ROUTED: pairs, one per workgroup along y)
    uint w_off;     // first weight byte
    uint s_off;     // first scale
    uint x_off;     // first input float (multiple of 4; gemv_q8: first word of its q8 rows)
    uint x_stride;  // floats (gemv_q8: words) between input rows (multiple of 4)
    uint y_off;     // first output float
    uint y_stride;  // floats between output rows
    uint row_bytes; // bytes between weight rows
    uint s_stride;  // scales between weight rows
    uint acc;       // 1: y += the result
    uint w_expert;  // ROUTED: weight bytes per expert
    uint s_expert;  // ROUTED: scales per expert
    uint x_div;     // ROUTED: pairs per input row
    uint idx_off;   // ROUTED: first expert index
    uint first_row; // ROWMAP: the part's first weight row
    uint part_rows; // ROWMAP: the part's rows
} p;

#include "weights.glsl"

#define MAXR 8u

uint w_base, s_base, nvec, x_off, y_off;

// This dispatch's operands for input pair `pair` (ROUTED; else 0); false
// when there is nothing to compute: a pair past the list, or an expert
// without a device slot (the same for a whole workgroup).
bool operands(uint pair) {
    w_base = p.w_off;
    s_base = p.s_off;
    nvec = min(p.nvec, MAXR);
    x_off = p.x_off;
    y_off = p.y_off;
#ifdef ROUTED
    if (pair >= p.nvec) return false;
    uint e = slot_of[idx[p.idx_off + pair]];
    if (e == 0xffffffffu) return false;
    w_base += e * p.w_expert;
    s_base += e * p.s_expert;
    nvec = 1u;
    x_off += (pair / p.x_div) * p.x_stride;
    y_off += pair * p.y_stride;
#endif
    return true;
}

// The weight row of output row `row`; false when this dispatch has none
// (past the rows, or ROWMAP: a row another part holds).
bool weight_row(uint row, out uint wrow) {
    wrow = row;
    if (row >= p.rows) return false;
#ifdef ROWMAP
    wrow = row_of[row];
    if (wrow < p.first_row || wrow >= p.first_row + p.part_rows) return false;
    wrow -= p.first_row;
#endif
    return true;
}

void put(uint r, uint row, float v) {
    uint o = y_off + r * p.y_stride + row;
    if (p.acc != 0u) {
        precise float t = y[o] + v;
        y[o] = t;
    } else {
        y[o] = v;
    }
}

#endif
