"""numcheck's own implementations: the eager yardstick, chunked and recomputing linear+CE, Triton kernels, FP8 linears, vocabulary-parallel linear+CE."""
