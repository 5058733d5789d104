// sm80_bwd_hdim256.cu - the sm80 backward kernels (dq, dk, dv) instantiated for head dim 256 (one file per head dim so builds run in parallel and can be restricted).
#include "fat_sm80_bwd.cuh"

template fat_status fat::sm80_bwd<__half, 256>(const fat_params &, cudaStream_t);
template fat_status fat::sm80_bwd<__nv_bfloat16, 256>(const fat_params &, cudaStream_t);
