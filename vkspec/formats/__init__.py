"""Weight storage formats, each defined by executable code: what value a stored
block of bytes stands for (``ggml``: the GGUF block types)."""
