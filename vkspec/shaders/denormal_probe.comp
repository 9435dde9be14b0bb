#version 450
// Does the device preserve float32 denormals? (backends/vulkan/device.py probe_denormals)
layout(local_size_x = 1) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
void main() {
    precise float prod = a[0] * a[1];   // a denormal result
    precise float sum = a[2] + a[3];    // a denormal input
    precise float scaled = a[2] * a[4];
    o[0] = prod;
    o[1] = sum;
    o[2] = scaled;
}
