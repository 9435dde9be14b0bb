#version 450
// Index of the largest value of each row; ties go to the lowest index, NaN
// never wins. Twin of backends/cpu/ops.py argmax.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform Push {
    uint rows;
    uint n;
    uint x_off;
    uint x_stride;
    uint y_off;
} p;

void main() {
    uint row = gl_GlobalInvocationID.x;
    if (row >= p.rows) return;
    uint xb = p.x_off + row * p.x_stride;
    float best = uintBitsToFloat(0xff800000u);
    uint idx = 0u;
    for (uint i = 0u; i < p.n; i++) {
        float v = x[xb + i];
        if (v > best) { best = v; idx = i; }
    }
    y[p.y_off + row] = idx;
}
