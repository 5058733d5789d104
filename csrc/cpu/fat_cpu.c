/*
 * fat_cpu.c - CPU path of flash_attn_t (C11, OpenMP when available).
 *
 * Computes exact attention O = softmax(scale * Q K^T + mask) V and its
 * gradients by tiles (BQ query rows x BK keys), with an online softmax, so
 * extra memory is O(tile x head_dim) per thread plus O(rows x heads x d) for
 * the backward dq accumulator - never O(Sq x Sk).
 *
 * Shapes and masking are those of flash_attn_t.h (dense or varlen).
 *
 * Threads:
 *   forward : one work item = (batch, query head, query block); the item's
 *             thread alone writes those o rows and lse entries.
 *   backward: pass 1, item = (batch, query head): D = rowsum(dO * O).
 *             pass 2, item = (batch, kv head): the thread owns dk/dv of that
 *             kv head and the dq accumulator rows of every query head in its
 *             GQA group, so no atomics are needed and the result does not
 *             depend on the thread count.
 *             pass 3, item = row: converts the dq accumulator to dq's dtype.
 *
 * Internal math is float for float32/float16/bfloat16 inputs and double for
 * float64 inputs: fat_cpu_kernel.h is instantiated once for each.
 */
#include "flash_attn_t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Per-tile work is compiled twice, for AVX2+FMA and for the baseline ISA, and
 * picked at load time, since the build uses no -march flag. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FAT_HOT __attribute__((target_clones("arch=haswell", "default")))
#else
#define FAT_HOT
#endif

#define FAT_BQ 64 /* query rows per tile */
#define FAT_BK 64 /* keys per tile */

/* ---- scalar conversions (round to nearest even on store) ---------------- */

static inline uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t expo = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (expo == 0) {
        float mag = (float)mant * 5.9604644775390625e-8f; /* 2^-24 */
        return sign ? -mag : mag;
    }
    if (expo == 31)
        return bits_float(sign | 0x7f800000u | (mant << 13));
    return bits_float(sign | ((expo + 112u) << 23) | (mant << 13));
}

static inline uint16_t float_to_half(float f)
{
    uint32_t x = float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                /* result is subnormal or zero */
        float t = bits_float(ax) + 0.5f;   /* aligns 2^-24 units, RNE by FPU */
        return (uint16_t)(sign | (float_bits(t) - 0x3f000000u));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1u); /* rebias exponent, RNE mantissa */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float bf16_to_float(uint16_t h)
{
    return bits_float((uint32_t)h << 16);
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* exp(x) for float tiles, written to vectorise (no libm call): range
 * reduction to r in [-ln2/2, ln2/2], degree-6 polynomial (Cephes expf),
 * relative error ~1 ulp; exactly 0 for x < -87 (so exp(-inf) = 0). */
static inline float tile_expf(float x)
{
    const float xc = x < -87.5f ? -87.5f : (x > 88.0f ? 88.0f : x);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float poly = 1.9875691500e-4f;
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    poly = poly * r * r + r + 1.0f;
    const float scaled = poly * bits_float((uint32_t)((int32_t)n + 127) << 23);
    return x < -87.0f ? 0.0f : scaled;
}

/* ---- per-sequence geometry ---------------------------------------------- */

typedef struct {
    int varlen;
    int wl, wr;   /* effective window, -1 = unbounded */
    int group;    /* query heads per kv head */
    int64_t rows_q; /* flat query rows: b * sq (dense) or total_q */
} run_info;

typedef struct {
    int b;
    int sq, sk;
    int64_t rq, rk; /* flat index of the sequence's first q / k row */
    int64_t shift;  /* sk - sq */
} seq_info;

static run_info make_run_info(const fat_params *p)
{
    run_info r;
    r.varlen = p->cu_seqlens_q != NULL;
    fat_effective_window(p, &r.wl, &r.wr);
    r.group = p->hq / p->hkv;
    r.rows_q = r.varlen ? p->total_q : (int64_t)p->b * p->sq;
    return r;
}

static seq_info make_seq_info(const fat_params *p, const run_info *r, int b)
{
    seq_info s;
    s.b = b;
    if (r->varlen) {
        s.rq = p->cu_seqlens_q[b];
        s.rk = p->cu_seqlens_k[b];
        s.sq = (int)(p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b]);
        s.sk = (int)(p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b]);
    } else {
        s.rq = (int64_t)b * p->sq;
        s.rk = (int64_t)b * p->sk;
        s.sq = p->sq;
        s.sk = p->sk;
    }
    s.shift = (int64_t)s.sk - s.sq;
    return s;
}

/* Element offset of row i (local to the sequence), head h of a tensor. */
static inline int64_t elem_offset(const run_info *r, const seq_info *s, int64_t row0,
                                  int64_t i, int h, int64_t batch_stride,
                                  int64_t row_stride, int64_t head_stride)
{
    int64_t base = r->varlen ? (row0 + i) * row_stride
                             : (int64_t)s->b * batch_stride + i * row_stride;
    return base + (int64_t)h * head_stride;
}

static inline int64_t lse_offset(const fat_params *p, const run_info *r,
                                 const seq_info *s, int64_t i, int h)
{
    int64_t base = r->varlen ? s->rq : (int64_t)s->b * p->lse_batch_stride;
    return base + (int64_t)h * p->lse_head_stride + i;
}

/* First visible key of query row i (may be > last when none is visible). */
static inline int64_t first_key(const run_info *r, const seq_info *s, int64_t i)
{
    int64_t lo = r->wl >= 0 ? i + s->shift - r->wl : 0;
    return lo < 0 ? 0 : lo;
}

static inline int64_t last_key(const run_info *r, const seq_info *s, int64_t i)
{
    int64_t hi = r->wr >= 0 ? i + s->shift + r->wr : (int64_t)s->sk - 1;
    return hi > (int64_t)s->sk - 1 ? (int64_t)s->sk - 1 : hi;
}

/* First / last query row that sees key j (rows outside [0, sq) clipped). */
static inline int64_t first_row(const run_info *r, const seq_info *s, int64_t j)
{
    int64_t lo = r->wr >= 0 ? j - s->shift - r->wr : 0;
    return lo < 0 ? 0 : lo;
}

static inline int64_t last_row(const run_info *r, const seq_info *s, int64_t j)
{
    int64_t hi = r->wl >= 0 ? j - s->shift + r->wl : (int64_t)s->sq - 1;
    return hi > (int64_t)s->sq - 1 ? (int64_t)s->sq - 1 : hi;
}

static inline void set_flag(int *flag)
{
#ifdef _OPENMP
#pragma omp atomic write
#endif
    *flag = 1;
}

/* ---- the tile kernels, once per accumulation type ----------------------- */

#define REAL float
#define FAT_T(name) name##_f32
#define REAL_EXP tile_expf
#define REAL_LOG logf
#define REAL_TANH tanhf
#define FAT_EXACT_LSE 0
#include "fat_cpu_kernel.h"
#undef REAL
#undef FAT_T
#undef REAL_EXP
#undef REAL_LOG
#undef REAL_TANH
#undef FAT_EXACT_LSE

#define REAL double
#define FAT_T(name) name##_f64
#define REAL_EXP exp
#define REAL_LOG log
#define REAL_TANH tanh
#define FAT_EXACT_LSE 1 /* backward recomputes lse in double */
#include "fat_cpu_kernel.h"
#undef REAL
#undef FAT_T
#undef REAL_EXP
#undef REAL_LOG
#undef REAL_TANH
#undef FAT_EXACT_LSE

/* ---- entry points -------------------------------------------------------- */

fat_status fat_fwd_cpu(const fat_params *p)
{
    fat_status st = fat_validate(p, 0, 1, NULL, 0);
    if (st != FAT_OK)
        return st;
    return p->dtype == FAT_FLOAT64 ? fwd_all_f64(p, NULL) : fwd_all_f32(p, NULL);
}

fat_status fat_bwd_cpu(const fat_params *p)
{
    fat_status st = fat_validate(p, 1, 1, NULL, 0);
    if (st != FAT_OK)
        return st;
    return p->dtype == FAT_FLOAT64 ? bwd_all_f64(p) : bwd_all_f32(p);
}
