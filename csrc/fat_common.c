/*
 * fat_common.c - shared, device-independent part of the flash_attn_t core.
 *
 * fat_status_string : one-line text for a status code.
 * fat_effective_window : the (left, right) window every kernel masks with,
 *                        after causal is applied (-1 = unbounded).
 * fat_validate : the ONE place holding every limit of the core.  It reads
 *                only the params struct (and cu_seqlens when asked, which
 *                must then be host memory) and writes a message naming the
 *                offending Python-level argument.
 * No threads, no allocation, no printing.
 */
#include "flash_attn_t.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

const char *fat_status_string(fat_status status)
{
    switch (status) {
    case FAT_OK: return "success";
    case FAT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FAT_ERR_UNSUPPORTED: return "unsupported case (no kernel handles it)";
    case FAT_ERR_CUDA: return "CUDA error";
    case FAT_ERR_OUT_OF_MEMORY: return "out of host memory";
    }
    return "unknown status";
}

void fat_effective_window(const fat_params *p, int *left, int *right)
{
    int l = p->window_left < 0 ? -1 : p->window_left;
    int r = p->window_right < 0 ? -1 : p->window_right;
    if (p->causal)
        r = 0;
    if (left)
        *left = l;
    if (right)
        *right = r;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static fat_status invalid(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg != NULL && msg_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return FAT_ERR_INVALID_ARGUMENT;
}

/* A pointer may be NULL only when its tensor holds no element. */
static int missing(const void *ptr, int64_t numel)
{
    return ptr == NULL && numel > 0;
}

static fat_status check_sizes(const fat_params *p, char *msg, size_t n)
{
    if ((int)p->dtype < FAT_FLOAT32 || (int)p->dtype > FAT_FLOAT64)
        return invalid(msg, n, "q/k/v dtype must be float32, float16, bfloat16 "
                       "or float64, got dtype code %d", (int)p->dtype);
    if (p->b < 0)
        return invalid(msg, n, "q: batch size must be >= 0, got %d", p->b);
    if (p->sq < 0)
        return invalid(msg, n, "q: sequence length must be >= 0, got %d", p->sq);
    if (p->sk < 0)
        return invalid(msg, n, "k: sequence length must be >= 0, got %d", p->sk);
    if (p->hq < 1 || p->hkv < 1)
        return invalid(msg, n, "num_heads: q and k/v need at least one head, "
                       "got %d query heads and %d key/value heads", p->hq, p->hkv);
    if (p->hq % p->hkv != 0)
        return invalid(msg, n, "num_heads: number of query heads (%d) must be "
                       "divisible by number of key/value heads (%d)", p->hq, p->hkv);
    if (p->d < 1 || p->d > FAT_MAX_HEAD_DIM)
        return invalid(msg, n, "head_dim of q/k must be between 1 and %d, got %d",
                       FAT_MAX_HEAD_DIM, p->d);
    if (p->d_v < 1 || p->d_v > FAT_MAX_HEAD_DIM)
        return invalid(msg, n, "v head_dim must be between 1 and %d, got %d",
                       FAT_MAX_HEAD_DIM, p->d_v);
    return FAT_OK;
}

static fat_status check_options(const fat_params *p, char *msg, size_t n)
{
    if (!isfinite(p->softmax_scale))
        return invalid(msg, n, "softmax_scale must be finite, got %g",
                       (double)p->softmax_scale);
    if (p->window_left < -1 || p->window_right < -1)
        return invalid(msg, n, "window_size entries must be >= -1 (-1 = unbounded), "
                       "got (%d, %d)", p->window_left, p->window_right);
    if (!isfinite(p->softcap) || p->softcap < 0.0f)
        return invalid(msg, n, "softcap must be finite and >= 0 (0 = off), got %g",
                       (double)p->softcap);
    return FAT_OK;
}

static fat_status check_one_cu(const int32_t *cu, int b, int64_t total, int max_len,
                               const char *name, char *msg, size_t n)
{
    if (cu[0] != 0)
        return invalid(msg, n, "%s[0] must be 0, got %d", name, (int)cu[0]);
    for (int i = 0; i < b; ++i) {
        int64_t len = (int64_t)cu[i + 1] - cu[i];
        if (len < 0)
            return invalid(msg, n, "%s must be non-decreasing, but %s[%d] = %d > "
                           "%s[%d] = %d", name, name, i, (int)cu[i], name, i + 1,
                           (int)cu[i + 1]);
        if (len > max_len)
            return invalid(msg, n, "%s: sequence %d has length %lld, more than the "
                           "max_seqlen %d", name, i, (long long)len, max_len);
    }
    if ((int64_t)cu[b] != total)
        return invalid(msg, n, "%s[-1] must equal the number of rows (%lld), got %d",
                       name, (long long)total, (int)cu[b]);
    return FAT_OK;
}

static fat_status check_varlen(const fat_params *p, int check_cu, char *msg, size_t n)
{
    int has_q = p->cu_seqlens_q != NULL, has_k = p->cu_seqlens_k != NULL;
    fat_status st;
    if (has_q != has_k)
        return invalid(msg, n, "cu_seqlens_q and cu_seqlens_k must be given together "
                       "(got only %s)", has_q ? "cu_seqlens_q" : "cu_seqlens_k");
    if (!has_q)
        return FAT_OK;
    if (p->total_q < 0)
        return invalid(msg, n, "q: total rows must be >= 0, got %lld",
                       (long long)p->total_q);
    if (p->total_k < 0)
        return invalid(msg, n, "k: total rows must be >= 0, got %lld",
                       (long long)p->total_k);
    if (!check_cu)
        return FAT_OK;
    st = check_one_cu(p->cu_seqlens_q, p->b, p->total_q, p->sq, "cu_seqlens_q", msg, n);
    if (st != FAT_OK)
        return st;
    return check_one_cu(p->cu_seqlens_k, p->b, p->total_k, p->sk, "cu_seqlens_k", msg, n);
}

static fat_status check_pointers(const fat_params *p, int backward, char *msg, size_t n)
{
    int varlen = p->cu_seqlens_q != NULL;
    int64_t rows_q = varlen ? p->total_q : (int64_t)p->b * p->sq;
    int64_t rows_k = varlen ? p->total_k : (int64_t)p->b * p->sk;
    int64_t nq = rows_q * p->hq * p->d, nk = rows_k * p->hkv * p->d;
    int64_t nv = rows_k * p->hkv * p->d_v, no = rows_q * p->hq * p->d_v;
    int64_t nlse = rows_q * p->hq;
    const char *name = NULL;
    if (missing(p->q, nq)) name = "q";
    else if (missing(p->k, nk)) name = "k";
    else if (missing(p->v, nv)) name = "v";
    else if (missing(p->o, no)) name = "out";
    else if (missing(p->lse, nlse)) name = "lse";
    else if (backward && missing(p->dout, no)) name = "dout";
    else if (backward && missing(p->dq, nq)) name = "dq";
    else if (backward && missing(p->dk, nk)) name = "dk";
    else if (backward && missing(p->dv, nv)) name = "dv";
    if (name != NULL)
        return invalid(msg, n, "%s: data pointer is NULL for a non-empty tensor", name);
    return FAT_OK;
}

fat_status fat_validate(const fat_params *p, int backward, int check_cu_seqlens,
                        char *msg, size_t msg_len)
{
    fat_status st;
    if (msg != NULL && msg_len > 0)
        msg[0] = '\0';
    if (p == NULL)
        return invalid(msg, msg_len, "params: NULL parameter block");
    st = check_sizes(p, msg, msg_len);
    if (st == FAT_OK)
        st = check_options(p, msg, msg_len);
    if (st == FAT_OK)
        st = check_varlen(p, check_cu_seqlens, msg, msg_len);
    if (st == FAT_OK)
        st = check_pointers(p, backward, msg, msg_len);
    return st;
}
