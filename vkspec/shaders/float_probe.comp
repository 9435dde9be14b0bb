#version 450
// The float32 behaviour vkspec relies on, one case per workgroup: the start-up
// probe (backends/vulkan/probe.py; the cases and their exact answers are in
// vkspec/ieee.py). Inputs come from a buffer, so nothing folds at compile time.
layout(local_size_x = 1) in;
layout(std430, binding = 0) readonly buffer C { uvec4 c[]; };   // op, a, b, c (bits)
layout(std430, binding = 1) writeonly buffer O { uint o[]; };

#define OP_ADD 0u
#define OP_SUB 1u
#define OP_MUL 2u
#define OP_MIN 3u
#define OP_MAX 4u
#define OP_GT 5u
#define OP_MULADD 6u

void main() {
    uint i = gl_WorkGroupID.x;
    uvec4 k = c[i];
    float a = uintBitsToFloat(k.y);
    float b = uintBitsToFloat(k.z);
    float d = uintBitsToFloat(k.w);
    precise float r = 0.0;
    if (k.x == OP_ADD) {
        r = a + b;
    } else if (k.x == OP_SUB) {
        r = a - b;
    } else if (k.x == OP_MUL) {
        r = a * b;
    } else if (k.x == OP_MIN) {
        r = min(a, b);
    } else if (k.x == OP_MAX) {
        r = max(a, b);
    } else if (k.x == OP_GT) {
        o[i] = a > b ? 1u : 0u;
        return;
    } else if (k.x == OP_MULADD) {
        precise float p = a * b;      // as the shaders write it: two roundings
        r = p + d;
    }
    o[i] = floatBitsToUint(r);
}
