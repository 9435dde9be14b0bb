"""Weight formats: how a matrix is held in memory and what its values are.

* quant.py: f32, bf16 and the formats vkspec quantises to while loading
  (int8 with a scale per row, int4 with a scale per 64 columns);
* ggml.py: GGUF's block formats (F16, BF16, Q4_0 ... Q6_K), the executable
  definition of a GGUF weight's value (bit for bit gguf.quants.dequantize).
"""
