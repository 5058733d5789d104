/*
 * fat_cuda_internal.h - what the CUDA dispatcher (fat_cuda.cu) and the kernel
 * files share.  Not installed; the public API is flash_attn_t.h.
 *
 * A kernel family runs one compiled head dim D (a multiple of 32 or 64, see
 * below) for one element type T (__half or __nv_bfloat16).  The dispatcher
 * has already checked, before calling it:
 *   - p.dtype is FAT_FLOAT16/FAT_BFLOAT16 and T matches it;
 *   - p.d and p.d_v are multiples of 8 and <= D (columns in [d, D) are
 *     zero-filled on load and never stored);
 *   - every pointer is 16-byte aligned and every row and head stride is a
 *     multiple of 8 elements (so any row starts 16-byte aligned);
 *   - the work is not empty (b, hq, sq, sk all > 0).
 * Masking: fat_effective_window(&p, &left, &right) on the host gives the
 * window after causal; key j is visible from query i of one sequence when
 * j < sk and (right < 0 || j <= i + sk - sq + right) and
 * (left < 0 || j >= i + sk - sq - left).  A query row with no visible key
 * gets o = 0, lse = -inf and zero gradients.
 * Launchers return FAT_ERR_CUDA when a launch fails (cudaGetLastError).
 */
#ifndef FAT_CUDA_INTERNAL_H
#define FAT_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "flash_attn_t.h"

namespace fat {

/* sm80 (mma.sync) forward: o and lse of p. */
template <typename T, int D> fat_status sm80_fwd(const fat_params &p, cudaStream_t stream);

/* sm80 backward: dq, dk, dv of p; p.workspace holds at least
 * sm80_bwd_workspace_bytes(p, D) bytes of device memory (any content). */
template <typename T, int D> fat_status sm80_bwd(const fat_params &p, cudaStream_t stream);
size_t sm80_bwd_workspace_bytes(const fat_params &p, int padded_d);

/* sm90a (wgmma + TMA) forward, same contract as sm80_fwd, for D in {64, 128,
 * 256}; dense and varlen.  Returns FAT_ERR_UNSUPPORTED (nothing launched, the
 * caller may fall back to sm80_fwd) when TMA cannot describe a tensor: a
 * batch stride that is not a multiple of 8 elements (when b > 1), a stride
 * that is not positive, or more than 65535 heads or batches. */
template <typename T, int D> fat_status sm90_fwd(const fat_params &p, cudaStream_t stream);

} /* namespace fat */

#endif /* FAT_CUDA_INTERNAL_H */
