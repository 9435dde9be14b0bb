#version 450
// variants: zero=ZERO copy=COPY
// Device memory moves without arithmetic: zero n words, or copy n words
// (fresh state; moving live recurrent state into a grown buffer; uploads and
// readbacks through their staging buffers). Each invocation strides over the
// words, so one dispatch size (one pipeline per pair of buffers) serves any n.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform Push {
    uint n;
    uint x_off;
    uint y_off;
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 64u;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
#ifdef ZERO
        y[p.y_off + i] = 0u;
#else
        y[p.y_off + i] = x[p.x_off + i];
#endif
    }
}
