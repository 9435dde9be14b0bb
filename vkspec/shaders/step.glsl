// The per-step parameters of a recorded chain, read by shaders at run time.
// Push constants are fixed when a sequence is recorded; what changes from one
// step to the next (tokens, positions, the KV watermark, which recurrent-state
// region is live, where the copy after each row goes) lives in this small
// buffer, written by the host before each replay. The host reads its layout
// from the compiled shader (backends/vulkan/step.py).
#ifndef VKSPEC_STEP_GLSL
#define VKSPEC_STEP_GLSL

#ifndef MAX_ROWS
#error "MAX_ROWS comes from shaders/limits.py: build.py passes it to every shader"
#endif
#define NO_SLOT 0xffffffffu

#define STEP_BLOCK(b)                                                        \
    layout(std430, binding = b) readonly buffer Step {                       \
        uint kv_len;           /* attention rows valid before this block */  \
        uint live;             /* live region of the recurrent state */     \
        uint nrows;                                                          \
        uint pad_;                                                           \
        uint slot[MAX_ROWS];   /* region for the state after row r, or NO_SLOT */       \
        uint tok[MAX_ROWS];                                                  \
        uint pos[MAX_ROWS];    /* position of row r (its KV row) */         \
    } step;

#endif
