/*
 * fat_cuda.cu - the CUDA entry points of the core (flash_attn_t.h):
 * fat_fwd_cuda, fat_bwd_cuda, fat_bwd_cuda_workspace_bytes.
 *
 * Checks what every kernel needs (dtype, head dims multiple of 8, 16-byte
 * aligned pointers, strides multiple of 8 elements, compute capability),
 * picks the kernel family (sm90a on compute capability 9.0 when compiled and
 * the case is covered, else sm80) and the smallest compiled head dim that
 * holds max(d, d_v), and launches on the given stream.  Which head dims and
 * families exist is decided at build time (setup.py defines FAT_HDIM_<D>
 * and FAT_WITH_SM90A); the tables below are the only list of them.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdarg.h>
#include <stdio.h>

#include "fat_cuda_internal.h"

namespace {

typedef fat_status (*launch_fn)(const fat_params &, cudaStream_t);

struct HeadDimKernels {
    int d;
    launch_fn fwd_f16, fwd_bf16, bwd_f16, bwd_bf16;
};

#define FAT_SM80_ENTRY(D)                                                                   \
    {D, fat::sm80_fwd<__half, D>, fat::sm80_fwd<__nv_bfloat16, D>, fat::sm80_bwd<__half, D>, \
     fat::sm80_bwd<__nv_bfloat16, D>}
#define FAT_SM90_ENTRY(D) {D, fat::sm90_fwd<__half, D>, fat::sm90_fwd<__nv_bfloat16, D>, nullptr, nullptr}

const HeadDimKernels kSm80Kernels[] = {
#ifdef FAT_HDIM_32
    FAT_SM80_ENTRY(32),
#endif
#ifdef FAT_HDIM_64
    FAT_SM80_ENTRY(64),
#endif
#ifdef FAT_HDIM_96
    FAT_SM80_ENTRY(96),
#endif
#ifdef FAT_HDIM_128
    FAT_SM80_ENTRY(128),
#endif
#ifdef FAT_HDIM_192
    FAT_SM80_ENTRY(192),
#endif
#ifdef FAT_HDIM_256
    FAT_SM80_ENTRY(256),
#endif
    {0, nullptr, nullptr, nullptr, nullptr}};

const HeadDimKernels kSm90Kernels[] = {
#ifdef FAT_WITH_SM90A
#ifdef FAT_HDIM_64
    FAT_SM90_ENTRY(64),
#endif
#ifdef FAT_HDIM_128
    FAT_SM90_ENTRY(128),
#endif
#ifdef FAT_HDIM_256
    FAT_SM90_ENTRY(256),
#endif
#endif
    {0, nullptr, nullptr, nullptr, nullptr}};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
fat_status unsupported(fat_cuda_info *info, const char *fmt, ...) {
    if (info) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(info->message, sizeof info->message, fmt, ap);
        va_end(ap);
    }
    return FAT_ERR_UNSUPPORTED;
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

bool strides_ok(int64_t batch, int64_t row, int64_t head, bool varlen) {
    return (varlen || batch % 8 == 0) && row % 8 == 0 && head % 8 == 0;
}

/* Pointer and stride limits of the 16-byte loads and stores. */
fat_status check_layout(const fat_params *p, bool backward, fat_cuda_info *info) {
    const bool varlen = p->cu_seqlens_q != nullptr;
    if (p->dtype != FAT_FLOAT16 && p->dtype != FAT_BFLOAT16)
        return unsupported(info, "q: CUDA kernels take float16 or bfloat16");
    if (p->d % 8 != 0 || p->d_v % 8 != 0)
        return unsupported(info, "q/v: CUDA kernels need head dims that are multiples of 8, "
                                 "got %d and %d", p->d, p->d_v);
    const bool ptrs = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) && aligned16(p->o) &&
                      (!backward || (aligned16(p->dout) && aligned16(p->dq) &&
                                     aligned16(p->dk) && aligned16(p->dv)));
    const bool strides =
        strides_ok(p->q_batch_stride, p->q_row_stride, p->q_head_stride, varlen) &&
        strides_ok(p->k_batch_stride, p->k_row_stride, p->k_head_stride, varlen) &&
        strides_ok(p->v_batch_stride, p->v_row_stride, p->v_head_stride, varlen) &&
        strides_ok(p->o_batch_stride, p->o_row_stride, p->o_head_stride, varlen) &&
        (!backward ||
         (strides_ok(p->do_batch_stride, p->do_row_stride, p->do_head_stride, varlen) &&
          strides_ok(p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride, varlen) &&
          strides_ok(p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride, varlen) &&
          strides_ok(p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride, varlen)));
    if (!ptrs || !strides)
        return unsupported(info, "q/k/v: CUDA kernels need 16-byte aligned data and strides "
                                 "that are multiples of 8 elements");
    return FAT_OK;
}

int compute_capability() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return 10 * major + minor;
}

/* Smallest compiled head dim holding both head dims, or nullptr. */
const HeadDimKernels *find_head_dim(const HeadDimKernels *table, const fat_params *p) {
    const int need = p->d > p->d_v ? p->d : p->d_v;
    for (const HeadDimKernels *e = table; e->d != 0; ++e)
        if (e->d >= need) return e;
    return nullptr;
}

int largest_head_dim(const HeadDimKernels *table) {
    int d = 0;
    for (const HeadDimKernels *e = table; e->d != 0; ++e) d = e->d;
    return d;
}

fat_status finish(fat_status st, fat_cuda_info *info) {
    if (st == FAT_ERR_CUDA && info)
        snprintf(info->message, sizeof info->message, "kernel launch failed: %s",
                 cudaGetErrorString(cudaGetLastError()));
    return st;
}

fat_status run(const fat_params *p, cudaStream_t stream, fat_cuda_info *info, bool backward) {
    if (info) {
        info->ran = FAT_BACKEND_AUTO;
        info->message[0] = '\0';
    }
    fat_status st = check_layout(p, backward, info);
    if (st != FAT_OK) return st;
    const int cc = compute_capability();
    if (cc < 80) return unsupported(info, "q: CUDA kernels need compute capability >= 8.0, "
                                          "this GPU has %d.%d", cc / 10, cc % 10);
    if (p->b == 0 || p->hq == 0 || p->sq == 0) return FAT_OK;
    if (backward && p->workspace_bytes < fat_bwd_cuda_workspace_bytes(p))
        return unsupported(info, "workspace: %zu bytes given, %zu needed", p->workspace_bytes,
                           fat_bwd_cuda_workspace_bytes(p));
    const bool f16 = p->dtype == FAT_FLOAT16;

    /* sm90a: the forward on Hopper; it declines (UNSUPPORTED, nothing
     * launched) what TMA cannot describe, and AUTO then falls back to sm80 */
    if (!backward && p->backend != FAT_BACKEND_SM80 && cc == 90) {
        const HeadDimKernels *e = find_head_dim(kSm90Kernels, p);
        st = e ? (f16 ? e->fwd_f16 : e->fwd_bf16)(*p, stream) : FAT_ERR_UNSUPPORTED;
        if (st != FAT_ERR_UNSUPPORTED) {
            if (info) info->ran = FAT_BACKEND_SM90A;
            return finish(st, info);
        }
    }
    if (!backward && p->backend == FAT_BACKEND_SM90A)
        return unsupported(info, "FLASH_ATTN_T_BACKEND=sm90a: the sm90a kernels do not cover "
                                 "this case (head dim %d, compute capability %d.%d, this "
                                 "build's sm90a head dims up to %d)",
                           p->d > p->d_v ? p->d : p->d_v, cc / 10, cc % 10,
                           largest_head_dim(kSm90Kernels));
    const HeadDimKernels *e = find_head_dim(kSm80Kernels, p);
    if (!e)
        return unsupported(info, "q: no CUDA kernel compiled for head dim %d (this build "
                                 "has head dims up to %d)", p->d > p->d_v ? p->d : p->d_v,
                           largest_head_dim(kSm80Kernels));
    if (info) info->ran = FAT_BACKEND_SM80;
    launch_fn fn = backward ? (f16 ? e->bwd_f16 : e->bwd_bf16) : (f16 ? e->fwd_f16 : e->fwd_bf16);
    return finish(fn(*p, stream), info);
}

} /* namespace */

extern "C" fat_status fat_fwd_cuda(const fat_params *p, struct CUstream_st *stream,
                                   fat_cuda_info *info) {
    return run(p, stream, info, false);
}

extern "C" fat_status fat_bwd_cuda(const fat_params *p, struct CUstream_st *stream,
                                   fat_cuda_info *info) {
    return run(p, stream, info, true);
}

extern "C" size_t fat_bwd_cuda_workspace_bytes(const fat_params *p) {
    const HeadDimKernels *e = find_head_dim(kSm80Kernels, p);
    return e ? fat::sm80_bwd_workspace_bytes(*p, e->d) : 0;
}
