// sm80_fwd_hdim128.cu - the sm80 forward kernel instantiated for head dim 128 (one file per head dim so builds run in parallel and can be restricted).
#include "fat_sm80_fwd.cuh"

template fat_status fat::sm80_fwd<__half, 128>(const fat_params &, cudaStream_t);
template fat_status fat::sm80_fwd<__nv_bfloat16, 128>(const fat_params &, cudaStream_t);
