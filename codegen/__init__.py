"""Code generation: an SProgram becomes a kernel (CUDA sm_90a), compiled and launched by the runtime."""
