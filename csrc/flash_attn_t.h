/*
 * flash_attn_t.h - the one public header of the flash_attn_t core.
 *
 * Exact attention O = softmax(scale * Q K^T + mask) V, computed by tiles with
 * an online softmax, never materialising the Sq x Sk score matrix.
 *
 * Layouts (all strides in ELEMENTS, the last dimension contiguous):
 *   dense : q (B, Sq, Hq, D)   k (B, Sk, Hkv, D)   v (B, Sk, Hkv, Dv)
 *           o (B, Sq, Hq, Dv)  lse (B, Hq, Sq) fp32
 *   varlen: cu_seqlens_q/k (B + 1) int32 prefix sums; q (total_q, Hq, D),
 *           k (total_k, Hkv, D), v (total_k, Hkv, Dv), o (total_q, Hq, Dv),
 *           lse (Hq, total_q) fp32.  Batch strides are ignored; sq and sk
 *           hold the largest sequence lengths.
 * Query head h reads key/value head h / (Hq / Hkv) (MQA/GQA, K/V never
 * repeated).  Masking, per query row i and key column j of one sequence:
 *   shift = sk - sq (bottom-right alignment, as FlashAttention >= 2.1)
 *   j <= i + shift + window_right   (when window_right >= 0)
 *   j >= i + shift - window_left    (when window_left  >= 0)
 * causal forces window_right = 0.  softcap > 0 replaces the scaled score s by
 * softcap * tanh(s / softcap).  A row with no visible key gives o = 0,
 * lse = -inf and zero gradients.
 *
 * No torch type, no exceptions and no exit() below this header: every entry
 * point returns a fat_status; fat_validate explains a bad argument in text
 * that names it.
 */
#ifndef FLASH_ATTN_T_H
#define FLASH_ATTN_T_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FAT_OK = 0,
    FAT_ERR_INVALID_ARGUMENT = 1, /* an argument breaks a documented limit */
    FAT_ERR_UNSUPPORTED = 2,      /* valid, but no kernel handles this case */
    FAT_ERR_CUDA = 3,             /* a CUDA call or launch failed */
    FAT_ERR_OUT_OF_MEMORY = 4     /* a host allocation failed */
} fat_status;

typedef enum {
    FAT_FLOAT32 = 0,
    FAT_FLOAT16 = 1,
    FAT_BFLOAT16 = 2,
    FAT_FLOAT64 = 3 /* CPU only: for gradcheck */
} fat_dtype;

/* CUDA kernel families; AUTO takes the fastest one that handles the case. */
typedef enum {
    FAT_BACKEND_AUTO = 0,
    FAT_BACKEND_SM80 = 1, /* mma.sync: every GPU from Ampere on */
    FAT_BACKEND_SM90A = 2 /* wgmma + TMA: Hopper (compute capability 9.0) */
} fat_backend;

/* Largest head dim of Q/K and of V. */
#define FAT_MAX_HEAD_DIM 256

typedef struct {
    /* forward inputs and outputs */
    const void *q, *k, *v;
    void *o;
    float *lse; /* required: the backward pass recomputes P from it */

    /* backward inputs (o and lse above) and outputs; dk, dv have k, v's shapes */
    const void *dout;
    void *dq, *dk, *dv;

    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    int64_t lse_batch_stride, lse_head_stride; /* rows are contiguous */

    int b, sq, sk, hq, hkv;
    int d, d_v; /* head dims of q/k and of v */
    fat_dtype dtype;

    double softmax_scale; /* double so float64 inputs keep full precision */
    int causal;
    int window_left, window_right; /* -1 = unbounded */
    double softcap;                /* 0 = off */
    int deterministic;             /* backward: bitwise reproducible */

    /* varlen: (b + 1) int32 prefix sums, or both NULL for dense batches */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int64_t total_q, total_k; /* varlen: rows of q and k */

    void *workspace; /* scratch of fat_*_workspace_bytes(); may be NULL if 0 */
    size_t workspace_bytes;

    fat_backend backend; /* CUDA: kernel family to use (AUTO = best) */
} fat_params;

/* What a CUDA call did: the kernel family that ran, or why none could. */
typedef struct {
    fat_backend ran;
    char message[192];
} fat_cuda_info;

/* One-line meaning of a status. */
const char *fat_status_string(fat_status status);

/* Every limit of the core. On failure writes a message naming the argument
 * (q, k, v, out, softmax_scale, window_size, softcap, cu_seqlens_q, ...)
 * into msg (if not NULL). backward != 0 also checks the gradient pointers.
 * check_cu_seqlens != 0 reads cu_seqlens (host memory only). */
fat_status fat_validate(const fat_params *p, int backward,
                        int check_cu_seqlens, char *msg, size_t msg_len);

/* The window after causal is applied: what every kernel masks with. */
void fat_effective_window(const fat_params *p, int *left, int *right);

/* CPU path (C11 + OpenMP). All pointers are host memory. */
fat_status fat_fwd_cpu(const fat_params *p);
fat_status fat_bwd_cpu(const fat_params *p);

/* CUDA path: device pointers, work queued on stream, on the current device.
 * Needs float16/bfloat16, head dims that are multiples of 8, 16-byte aligned
 * pointers and strides that are multiples of 8 elements; other cases return
 * FAT_ERR_UNSUPPORTED with the reason in info->message (info may be NULL).
 * The backward pass needs p->workspace of fat_bwd_cuda_workspace_bytes(p)
 * bytes of device memory.  In a build without CUDA they return
 * FAT_ERR_UNSUPPORTED. */
struct CUstream_st;
fat_status fat_fwd_cuda(const fat_params *p, struct CUstream_st *stream,
                        fat_cuda_info *info);
fat_status fat_bwd_cuda(const fat_params *p, struct CUstream_st *stream,
                        fat_cuda_info *info);
size_t fat_bwd_cuda_workspace_bytes(const fat_params *p);

#ifdef __cplusplus
}
#endif

#endif /* FLASH_ATTN_T_H */
