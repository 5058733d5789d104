/*
 * fat_sm80_bwd_workspace.cu - fat::sm80_bwd_workspace_bytes, the device
 * scratch the sm80 backward needs for compiled head dim padded_d: the fp32 dq
 * accumulator (rows_q, hq, padded_d) and lse_log2, dot (hq, rows_q), each
 * 256-byte aligned (layout in fat_sm80_bwd.cuh).  Defined once, here.
 */
#include "fat_sm80_bwd.cuh"

size_t fat::sm80_bwd_workspace_bytes(const fat_params &p, int padded_d) {
    return bwd80::workspace_layout(p, padded_d).total;
}
