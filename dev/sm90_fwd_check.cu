/*
 * sm90_fwd_check.cu - standalone GPU check and benchmark of the sm90a
 * forward kernel (csrc/cuda/fat_sm90_fwd.cuh), in the style of llm.c's
 * dev/cuda files: random inputs on the device, a naive fp32 reference
 * kernel, first mismatches and max errors with PASS/FAIL per case, then
 * cudaEvent timings (warm-up, median of 10) of the D = 128 bf16 case with
 * batch * seqlen = 16k tokens and 16 heads of 128, in TFLOPS
 * (4 * B * H * Sq * Sk * D, halved for causal), for each kernel variant
 * of variants_128, variants_64 and variants_256 below.
 * Correctness: sm90_fwd itself on the full case list (fp16 and bf16), every
 * timed variant on the short list (which has more tiles than SMs).
 *
 * build: nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
 *            dev/sm90_fwd_check.cu csrc/fat_common.c -o /tmp/sm90_check
 * run:   /tmp/sm90_check           correctness, then timing
 *        /tmp/sm90_check check     correctness only
 *        /tmp/sm90_check thread-store  both, with O stored by threads, not TMA
 *        /tmp/sm90_check one D S [causal [variant]]   sm90_fwd (or variant
 *                                  number v of enum Variant) at one shape (for ncu)
 *        /tmp/sm90_check table D [variant]   the timing table of sm90_fwd (or
 *                                  variant v) only, no correctness (A/B builds)
 *        /tmp/sm90_tl timeline D S causal variant path   (built with
 *                                  -DFAT_SM90_TIMELINE -Idev) the event timeline
 *                                  of variant v's first CTAs (dev/sm90_timeline.cuh)
 * Exit status 0 when every case passes.
 *
 * Layouts are the public ones (flash_attn_t.h); the output has 8 padding
 * columns per head and lse 5 padding rows per head, both filled with NaN
 * bits before the run, to catch stores outside the valid region.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#ifdef FAT_SM90_TIMELINE
#include "sm90_timeline.cuh" /* before the kernel: its stamp hooks record */
#endif
#include "cuda/fat_sm90_fwd.cuh"

#define CUDA_CHECK(call)                                                                        \
    do {                                                                                        \
        cudaError_t err_ = (call);                                                              \
        if (err_ != cudaSuccess) {                                                              \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__,     \
                    __LINE__);                                                                  \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* The variants the check and the timing table cover (configs: VariantConfig
 * below).  "wide" is BN176 at D = 128, BN192 at D = 64 (none at D = 256);
 * "persistent": one CTA per SM running jobs in cta_tile's order ("carry":
 * with the next tile's first S under the epilogue, FwdConfig::kCarryS);
 * "3wg": three consumer warpgroups (192-row tiles, D = 64 only); "4wg": four
 * (256-row tiles on 64-key blocks, D = 64 only); "ones": the row sums from
 * the P V GEMM (FwdConfig::kSumByMma, D = 64 only). */
enum Variant {
    SERIAL, OVERLAP, PINGPONG, WIDE, OVERLAP_PERSIST, PINGPONG_PERSIST, WIDE_PERSIST,
    TRIPLE, TRIPLE_PINGPONG, TRIPLE_PINGPONG_3STAGES, TRIPLE_PINGPONG_PERSIST,
    OVERLAP_PERSIST_CARRY, PINGPONG_PERSIST_CARRY, TRIPLE_PINGPONG_PERSIST_CARRY, QUAD_PINGPONG_PERSIST,
    QUAD_PINGPONG_PERSIST_CARRY, PINGPONG_PERSIST_ONES, WIDE_PERSIST_ONES, TRIPLE_PINGPONG_PERSIST_ONES,
    PINGPONG_PERSIST_CARRY_ONES, DEFAULT
};
static const char *variant_names[] = {"serial (v1)", "overlap", "overlap+pingpong", "pingpong wide",
                                      "overlap persistent", "pingpong persistent", "pingpong wide persistent",
                                      "3wg overlap", "3wg pingpong", "3wg pingpong 3 stages",
                                      "3wg pingpong persistent", "overlap persistent carry",
                                      "pingpong persistent carry", "3wg pingpong persistent carry",
                                      "4wg BN64 pingpong persistent", "4wg BN64 pingpong persistent carry",
                                      "pingpong persistent ones", "pingpong n192 persistent ones",
                                      "3wg pingpong persistent ones", "pingpong persistent carry ones",
                                      "default (sm90_fwd)"};
static const char *variant_name(Variant v, int d) {
    if (v == WIDE) return d == 128 ? "pingpong n176" : "pingpong n192";
    if (v == WIDE_PERSIST) return d == 128 ? "pingpong n176 persistent" : "pingpong n192 persistent";
    return variant_names[v];
}
/* Checked on the short list and timed, per head dim (DEFAULT is also checked
 * on the full list); the persistent lists are timed after the others (D = 64
 * and 128 keep two Q buffers, D = 256 one; benchmarks/NOTES.md). */
static const std::vector<Variant> variants_128 = {SERIAL, OVERLAP, WIDE, DEFAULT};
static const std::vector<Variant> variants_64 = {OVERLAP, PINGPONG, WIDE, TRIPLE, TRIPLE_PINGPONG,
                                                 TRIPLE_PINGPONG_3STAGES, DEFAULT};
static const std::vector<Variant> variants_256 = {OVERLAP, PINGPONG, DEFAULT};
/* D = 256 overlap persistent spills 20 bytes (ptxas): not built */
static const std::vector<Variant> persistent_128 = {OVERLAP_PERSIST, PINGPONG_PERSIST, WIDE_PERSIST,
                                                    OVERLAP_PERSIST_CARRY, PINGPONG_PERSIST_CARRY};
static const std::vector<Variant> persistent_64 = {OVERLAP_PERSIST, PINGPONG_PERSIST, WIDE_PERSIST,
                                                   TRIPLE_PINGPONG_PERSIST, OVERLAP_PERSIST_CARRY,
                                                   PINGPONG_PERSIST_CARRY, TRIPLE_PINGPONG_PERSIST_CARRY,
                                                   QUAD_PINGPONG_PERSIST, QUAD_PINGPONG_PERSIST_CARRY,
                                                   PINGPONG_PERSIST_ONES, WIDE_PERSIST_ONES, TRIPLE_PINGPONG_PERSIST_ONES,
                                                   PINGPONG_PERSIST_CARRY_ONES};
static const std::vector<Variant> persistent_256 = {PINGPONG_PERSIST};

struct Case {
    int b, hq, hkv, sq, sk, d, dv;
    int causal, wl, wr;
    float softcap;
    int varlen; /* sequences of varied lengths, sq / sk being the longest */
};

/* ---- device helpers ------------------------------------------------------------ */

__device__ __host__ inline uint32_t hash_u32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* x[i] = uniform in (-1.7, 1.7): about unit variance. */
template <typename T> __global__ void fill_random(T *x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash_u32((uint32_t)i * 2654435761u ^ hash_u32(seed + (uint32_t)(i >> 32)));
        x[i] = fat::elem<T>::from_float(((h >> 8) * (1.f / 16777216.f) * 2.f - 1.f) * 1.7f);
    }
}

/* The naive reference: one thread per (batch, head, query row), fp32, two
 * passes over the keys.  o_ref is (rows, hq, dv) compact, lse_ref (hq, rows)
 * with rows = all query rows of the batch (b * sq or total_q). */
template <typename T>
__global__ void ref_attention(fat_params p, int wl, int wr, float *o_ref, float *lse_ref, int64_t rows) {
    const int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int i = (int)(id % p.sq), h = (int)(id / p.sq % p.hq), b = (int)(id / p.sq / p.hq);
    if (b >= p.b) return;
    const fat::SeqInfo s = fat::seq_info(p.cu_seqlens_q, p.cu_seqlens_k, b, p.sq, p.sk);
    if (i >= s.sq) return;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int kvh = h / (p.hq / p.hkv);
    const T *q = (const T *)p.q + (varlen ? (s.q_start + i) * p.q_row_stride
                                          : b * p.q_batch_stride + i * p.q_row_stride) + h * p.q_head_stride;
    const T *k0 = (const T *)p.k + (varlen ? s.k_start * p.k_row_stride : b * p.k_batch_stride) + kvh * p.k_head_stride;
    const T *v0 = (const T *)p.v + (varlen ? s.k_start * p.v_row_stride : b * p.v_batch_stride) + kvh * p.v_head_stride;
    const int64_t shift = s.sk - s.sq;
    int64_t lo = wl >= 0 ? i + shift - wl : 0, hi = wr >= 0 ? i + shift + wr : s.sk - 1;
    lo = lo < 0 ? 0 : lo;
    hi = hi > s.sk - 1 ? s.sk - 1 : hi;
    auto score = [&](int64_t j) {
        float acc = 0.f;
        for (int c = 0; c < p.d; ++c)
            acc += fat::elem<T>::to_float(q[c]) * fat::elem<T>::to_float(k0[j * p.k_row_stride + c]);
        float x = acc * (float)p.softmax_scale;
        return p.softcap > 0 ? (float)p.softcap * tanhf(x / (float)p.softcap) : x;
    };
    float mx = -INFINITY;
    for (int64_t j = lo; j <= hi; ++j) mx = fmaxf(mx, score(j));
    float acc[FAT_MAX_HEAD_DIM];
    for (int c = 0; c < p.d_v; ++c) acc[c] = 0.f;
    float sum = 0.f;
    for (int64_t j = lo; j <= hi; ++j) {
        const float e = expf(score(j) - mx);
        sum += e;
        for (int c = 0; c < p.d_v; ++c) acc[c] += e * fat::elem<T>::to_float(v0[j * p.v_row_stride + c]);
    }
    const int64_t row = (varlen ? s.q_start : (int64_t)b * p.sq) + i;
    for (int c = 0; c < p.d_v; ++c) o_ref[(row * p.hq + h) * p.d_v + c] = sum > 0 ? acc[c] / sum : 0.f;
    lse_ref[h * rows + row] = sum > 0 ? mx + logf(sum) : -INFINITY;
}

/* ---- one problem on the device --------------------------------------------------------- */

struct Problem {
    fat_params p;
    int wl, wr;
    int64_t rows_q, rows_k;
    std::vector<int32_t> cu_q, cu_k; /* host copies (varlen) */
    void *q, *k, *v, *o;
    float *lse;
    int32_t *cu_q_dev, *cu_k_dev;
};

static void make_varlen_lengths(const Case &c, std::vector<int32_t> &cu_q, std::vector<int32_t> &cu_k) {
    cu_q.assign(1, 0);
    cu_k.assign(1, 0);
    for (int i = 0; i < c.b; ++i) {
        /* the longest first, then shorter ones, one of them tiny */
        const int lq = i == 0 ? c.sq : (i % 3 == 1 ? 1 : c.sq / (i + 1) + 3);
        const int lk = i == 0 ? c.sk : (i % 3 == 2 ? 1 : c.sk / (i + 2) + 5);
        cu_q.push_back(cu_q.back() + std::min(lq, c.sq));
        cu_k.push_back(cu_k.back() + std::min(lk, c.sk));
    }
}

template <typename T> static Problem make_problem(const Case &c, uint32_t seed) {
    Problem pr;
    memset(&pr.p, 0, sizeof(pr.p));
    fat_params &p = pr.p;
    p.b = c.b, p.sq = c.sq, p.sk = c.sk, p.hq = c.hq, p.hkv = c.hkv, p.d = c.d, p.d_v = c.dv;
    p.dtype = fat::sm90::kIsHalf<T> ? FAT_FLOAT16 : FAT_BFLOAT16;
    p.softmax_scale = 1.0 / sqrt((double)c.d);
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.softcap = c.softcap;
    fat_effective_window(&p, &pr.wl, &pr.wr);
    pr.cu_q_dev = pr.cu_k_dev = nullptr;
    if (c.varlen) {
        make_varlen_lengths(c, pr.cu_q, pr.cu_k);
        pr.rows_q = pr.cu_q.back();
        pr.rows_k = pr.cu_k.back();
        CUDA_CHECK(cudaMalloc(&pr.cu_q_dev, (c.b + 1) * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc(&pr.cu_k_dev, (c.b + 1) * sizeof(int32_t)));
        CUDA_CHECK(cudaMemcpy(pr.cu_q_dev, pr.cu_q.data(), (c.b + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(pr.cu_k_dev, pr.cu_k.data(), (c.b + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));
        p.cu_seqlens_q = pr.cu_q_dev;
        p.cu_seqlens_k = pr.cu_k_dev;
        p.total_q = pr.rows_q;
        p.total_k = pr.rows_k;
    } else {
        pr.rows_q = (int64_t)c.b * c.sq;
        pr.rows_k = (int64_t)c.b * c.sk;
    }
    const int o_head_stride = c.dv + 8; /* 8 padding columns per head */
    p.q_head_stride = c.d, p.q_row_stride = (int64_t)c.hq * c.d, p.q_batch_stride = (int64_t)c.sq * p.q_row_stride;
    p.k_head_stride = c.d, p.k_row_stride = (int64_t)c.hkv * c.d, p.k_batch_stride = (int64_t)c.sk * p.k_row_stride;
    p.v_head_stride = c.dv, p.v_row_stride = (int64_t)c.hkv * c.dv, p.v_batch_stride = (int64_t)c.sk * p.v_row_stride;
    p.o_head_stride = o_head_stride, p.o_row_stride = (int64_t)c.hq * o_head_stride;
    p.o_batch_stride = (int64_t)c.sq * p.o_row_stride;
    p.lse_head_stride = c.varlen ? pr.rows_q + 5 : c.sq + 5; /* 5 padding rows per head */
    p.lse_batch_stride = (int64_t)c.hq * p.lse_head_stride;
    const int64_t nq = pr.rows_q * p.q_row_stride, nk = pr.rows_k * p.k_row_stride, nv = pr.rows_k * p.v_row_stride;
    const int64_t no = pr.rows_q * p.o_row_stride;
    const int64_t nlse = (c.varlen ? 1 : c.b) * p.lse_batch_stride;
    CUDA_CHECK(cudaMalloc(&pr.q, std::max<int64_t>(nq, 8) * sizeof(T)));
    CUDA_CHECK(cudaMalloc(&pr.k, std::max<int64_t>(nk, 8) * sizeof(T)));
    CUDA_CHECK(cudaMalloc(&pr.v, std::max<int64_t>(nv, 8) * sizeof(T)));
    CUDA_CHECK(cudaMalloc(&pr.o, std::max<int64_t>(no, 8) * sizeof(T)));
    CUDA_CHECK(cudaMalloc(&pr.lse, std::max<int64_t>(nlse, 8) * sizeof(float)));
    fill_random<T><<<256, 256>>>((T *)pr.q, nq, seed * 3 + 1);
    fill_random<T><<<256, 256>>>((T *)pr.k, nk, seed * 3 + 2);
    fill_random<T><<<256, 256>>>((T *)pr.v, nv, seed * 3 + 3);
    CUDA_CHECK(cudaMemset(pr.o, 0xFF, no * sizeof(T)));
    CUDA_CHECK(cudaMemset(pr.lse, 0xFF, nlse * sizeof(float)));
    CUDA_CHECK(cudaGetLastError());
    p.q = pr.q, p.k = pr.k, p.v = pr.v, p.o = pr.o, p.lse = pr.lse;
    return pr;
}

static void free_problem(Problem &pr) {
    cudaFree(pr.q);
    cudaFree(pr.k);
    cudaFree(pr.v);
    cudaFree(pr.o);
    cudaFree(pr.lse);
    if (pr.cu_q_dev) cudaFree(pr.cu_q_dev);
    if (pr.cu_k_dev) cudaFree(pr.cu_k_dev);
}

/* Config of a variant at head dim D (BN and stages of sm90::FwdBase unless wide). */
using fat::sm90::FwdBase;
using fat::sm90::FwdConfig;
template <int D, Variant V> struct VariantConfig;
template <int D> struct VariantConfig<D, SERIAL> { using C = FwdConfig<D, 128, 2, false, false>; };
template <int D> struct VariantConfig<D, OVERLAP> { using C = FwdBase<D, false>; };
template <int D> struct VariantConfig<D, PINGPONG> { using C = FwdBase<D, true>; };
template <int D> struct VariantConfig<D, OVERLAP_PERSIST> { using C = FwdBase<D, false, true>; };
template <int D> struct VariantConfig<D, PINGPONG_PERSIST> { using C = FwdBase<D, true, true>; };
template <int D> struct VariantConfig<D, WIDE> { using C = FwdConfig<D, D == 128 ? 176 : 192, D == 64 ? 3 : 2, true, true>; };
template <int D> struct VariantConfig<D, WIDE_PERSIST> {
    using C = FwdConfig<D, D == 128 ? 176 : 192, D == 64 ? 3 : 2, true, true, true>;
};
template <int D> struct VariantConfig<D, TRIPLE> { using C = FwdConfig<D, 128, 2, true, false, false, 3>; };
template <int D> struct VariantConfig<D, TRIPLE_PINGPONG> { using C = FwdConfig<D, 128, 2, true, true, false, 3>; };
template <int D> struct VariantConfig<D, TRIPLE_PINGPONG_3STAGES> {
    using C = FwdConfig<D, 128, 3, true, true, false, 3>;
};
template <int D> struct VariantConfig<D, TRIPLE_PINGPONG_PERSIST> {
    using C = FwdConfig<D, 128, 2, true, true, true, 3>;
};
/* "carry": the next tile's first S runs under the epilogue (FwdConfig::kCarryS) */
template <int D> struct VariantConfig<D, OVERLAP_PERSIST_CARRY> {
    using C = FwdConfig<D, 128, D == 64 ? 3 : 2, true, false, true, 2, true>;
};
template <int D> struct VariantConfig<D, PINGPONG_PERSIST_CARRY> {
    using C = FwdConfig<D, 128, D == 64 ? 3 : 2, true, true, true, 2, true>;
};
template <int D> struct VariantConfig<D, TRIPLE_PINGPONG_PERSIST_CARRY> {
    using C = FwdConfig<D, 128, 2, true, true, true, 3, true>;
};
/* "4wg": four consumer warpgroups (256-row tiles) on 64-key blocks, D = 64 only */
template <int D> struct VariantConfig<D, QUAD_PINGPONG_PERSIST> { using C = FwdConfig<D, 64, 3, true, true, true, 4>; };
template <int D> struct VariantConfig<D, QUAD_PINGPONG_PERSIST_CARRY> {
    using C = FwdConfig<D, 64, 3, true, true, true, 4, true>;
};
/* "ones": the row sums from the P V GEMM (kSumByMma), D = 64 only */
template <int D> struct VariantConfig<D, PINGPONG_PERSIST_ONES> {
    using C = FwdConfig<D, 128, 3, true, true, true, 2, false, true>;
};
template <int D> struct VariantConfig<D, WIDE_PERSIST_ONES> { using C = FwdConfig<D, 192, 3, true, true, true, 2, false, true>; };
template <int D> struct VariantConfig<D, PINGPONG_PERSIST_CARRY_ONES> {
    using C = FwdConfig<D, 128, 3, true, true, true, 2, true, true>;
};
template <int D> struct VariantConfig<D, TRIPLE_PINGPONG_PERSIST_ONES> {
    using C = FwdConfig<D, 128, 2, true, true, true, 3, false, true>;
};

/* "thread-store" on the command line: O leaves by 16-byte thread stores
 * instead of TMA stores in every variant but the default (FwdArgs::o_tma). */
static bool g_thread_store = false;

/* Launches prepared arguments (args made for variant v's config): the timed
 * loop leaves tensor-map encoding out. */
template <typename T, int D, Variant V> static fat_status launch_prepared(const fat_params &p, bool time_it,
                                                                        float *ms_out) {
    using C = typename VariantConfig<D, V>::C;
    fat::sm90::FwdArgs a;
    if (!fat::sm90::make_fwd_args<T, C>(p, &a)) return FAT_ERR_UNSUPPORTED;
    if (g_thread_store) a.o_tma = 0;
    fat_status st = fat::sm90::launch_fwd_args<T, C>(a, 0);
    if (st != FAT_OK || !time_it) return st;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(10);
    for (int r = 0; r < 10; ++r) {
        /* an untimed launch first keeps the GPU busy while the timed one is queued */
        fat::sm90::launch_fwd_args<T, C>(a, 0);
        CUDA_CHECK(cudaEventRecord(start));
        fat::sm90::launch_fwd_args<T, C>(a, 0);
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    CUDA_CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    *ms_out = 0.5f * (ms[4] + ms[5]);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return FAT_OK;
}

/* One timed call of sm90_fwd. */
template <typename T, int D> static void launch_ms(const fat_params &p, float *ms) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start));
    fat::sm90_fwd<T, D>(p, 0);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
}

/* sm90_fwd itself, timed like launch_prepared (tensor-map encoding included). */
template <typename T, int D> static fat_status time_default(const fat_params &p, float *ms_out) {
    fat_status st = fat::sm90_fwd<T, D>(p, 0);
    if (st != FAT_OK) return st;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(10);
    for (int r = 0; r < 10; ++r) {
        fat::sm90_fwd<T, D>(p, 0);
        CUDA_CHECK(cudaEventRecord(start));
        fat::sm90_fwd<T, D>(p, 0);
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    std::sort(ms.begin(), ms.end());
    *ms_out = 0.5f * (ms[4] + ms[5]);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return FAT_OK;
}

/* Runs (time_it = false) or times variant v at head dim D (only the
 * variants of variants_D are compiled there). */
template <typename T, int D> static fat_status run_variant(Variant v, const fat_params &p, bool time_it,
                                                           float *ms) {
    switch (v) {
    case OVERLAP: return launch_prepared<T, D, OVERLAP>(p, time_it, ms);
    case PINGPONG: return launch_prepared<T, D, PINGPONG>(p, time_it, ms);
    case PINGPONG_PERSIST: return launch_prepared<T, D, PINGPONG_PERSIST>(p, time_it, ms);
    case DEFAULT: return time_it ? time_default<T, D>(p, ms) : fat::sm90_fwd<T, D>(p, 0);
    default: break;
    }
    if constexpr (D == 128) {
        if (v == SERIAL) return launch_prepared<T, D, SERIAL>(p, time_it, ms);
    }
    if constexpr (D == 64) {
        if (v == TRIPLE) return launch_prepared<T, D, TRIPLE>(p, time_it, ms);
        if (v == TRIPLE_PINGPONG) return launch_prepared<T, D, TRIPLE_PINGPONG>(p, time_it, ms);
        if (v == TRIPLE_PINGPONG_3STAGES) return launch_prepared<T, D, TRIPLE_PINGPONG_3STAGES>(p, time_it, ms);
        if (v == TRIPLE_PINGPONG_PERSIST) return launch_prepared<T, D, TRIPLE_PINGPONG_PERSIST>(p, time_it, ms);
        if (v == TRIPLE_PINGPONG_PERSIST_CARRY)
            return launch_prepared<T, D, TRIPLE_PINGPONG_PERSIST_CARRY>(p, time_it, ms);
        if (v == QUAD_PINGPONG_PERSIST) return launch_prepared<T, D, QUAD_PINGPONG_PERSIST>(p, time_it, ms);
        if (v == QUAD_PINGPONG_PERSIST_CARRY)
            return launch_prepared<T, D, QUAD_PINGPONG_PERSIST_CARRY>(p, time_it, ms);
        if (v == PINGPONG_PERSIST_ONES) return launch_prepared<T, D, PINGPONG_PERSIST_ONES>(p, time_it, ms);
        if (v == WIDE_PERSIST_ONES) return launch_prepared<T, D, WIDE_PERSIST_ONES>(p, time_it, ms);
        if (v == TRIPLE_PINGPONG_PERSIST_ONES)
            return launch_prepared<T, D, TRIPLE_PINGPONG_PERSIST_ONES>(p, time_it, ms);
        if (v == PINGPONG_PERSIST_CARRY_ONES)
            return launch_prepared<T, D, PINGPONG_PERSIST_CARRY_ONES>(p, time_it, ms);
    }
    if constexpr (D != 256) {
        if (v == OVERLAP_PERSIST) return launch_prepared<T, D, OVERLAP_PERSIST>(p, time_it, ms);
        if (v == WIDE) return launch_prepared<T, D, WIDE>(p, time_it, ms);
        if (v == WIDE_PERSIST) return launch_prepared<T, D, WIDE_PERSIST>(p, time_it, ms);
        if (v == OVERLAP_PERSIST_CARRY) return launch_prepared<T, D, OVERLAP_PERSIST_CARRY>(p, time_it, ms);
        if (v == PINGPONG_PERSIST_CARRY) return launch_prepared<T, D, PINGPONG_PERSIST_CARRY>(p, time_it, ms);
    }
    return FAT_ERR_UNSUPPORTED;
}

/* ---- comparison ----------------------------------------------------------------------- */

static float to_float_host(uint16_t bits, bool is_half) {
    uint32_t u;
    if (!is_half) {
        u = (uint32_t)bits << 16;
    } else {
        const uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1F, man = bits & 0x3FF;
        if (exp == 0x1F) u = sign | 0x7F800000u | (man << 13);
        else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13);
        else { /* subnormal */
            float f = man * (1.f / 16777216.f);
            return sign ? -f : f;
        }
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Sequence geometry of (dense or varlen) batch b on the host. */
static void host_seq(const Problem &pr, int b, int64_t *row0, int *sq) {
    if (pr.p.cu_seqlens_q) {
        *row0 = pr.cu_q[b];
        *sq = pr.cu_q[b + 1] - pr.cu_q[b];
    } else {
        *row0 = (int64_t)b * pr.p.sq;
        *sq = pr.p.sq;
    }
}

/* Compares o and lse with the reference; prints the first mismatches. */
static bool compare(const Problem &pr, bool is_half, const std::vector<float> &o_ref,
                    const std::vector<float> &lse_ref) {
    const fat_params &p = pr.p;
    const int64_t no = pr.rows_q * p.o_row_stride;
    const int64_t nlse = (p.cu_seqlens_q ? 1 : p.b) * p.lse_batch_stride;
    std::vector<uint16_t> o(no);
    std::vector<float> lse(nlse);
    CUDA_CHECK(cudaMemcpy(o.data(), pr.o, no * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(lse.data(), pr.lse, nlse * 4, cudaMemcpyDeviceToHost));
    const float atol = is_half ? 2e-3f : 1e-2f, rtol = is_half ? 5e-3f : 2e-2f;
    double max_o = 0, max_lse = 0;
    int bad = 0;
    std::vector<char> lse_written(nlse, 0);
    for (int b = 0; b < p.b; ++b) {
        int64_t row0;
        int sq;
        host_seq(pr, b, &row0, &sq);
        for (int h = 0; h < p.hq; ++h)
            for (int i = 0; i < sq; ++i) {
                const int64_t row = row0 + i;
                const int64_t lse_at = (p.cu_seqlens_q ? row : (int64_t)b * p.lse_batch_stride + i) +
                                       (int64_t)h * p.lse_head_stride;
                lse_written[lse_at] = 1;
                const float want_lse = lse_ref[h * pr.rows_q + row], got_lse = lse[lse_at];
                const bool lse_ok = (isinf(want_lse) && want_lse < 0)
                                        ? (isinf(got_lse) && got_lse < 0)
                                        : fabsf(got_lse - want_lse) <= 1e-3f + 1e-3f * fabsf(want_lse);
                if (!lse_ok && bad++ < 5)
                    printf("    lse mismatch b=%d h=%d i=%d: got %.6f want %.6f\n", b, h, i, got_lse, want_lse);
                if (!isinf(want_lse)) max_lse = std::max(max_lse, (double)fabsf(got_lse - want_lse));
                for (int c = 0; c < p.o_head_stride; ++c) {
                    const uint16_t bits = o[row * p.o_row_stride + h * p.o_head_stride + c];
                    if (c >= p.d_v) { /* padding: must keep its NaN bits */
                        if (bits != 0xFFFF && bad++ < 5)
                            printf("    store outside d_v: b=%d h=%d i=%d col=%d\n", b, h, i, c);
                        continue;
                    }
                    const float got = to_float_host(bits, is_half);
                    const float want = o_ref[(row * p.hq + h) * p.d_v + c];
                    const float err = fabsf(got - want);
                    if (!(err <= atol + rtol * fabsf(want)) && bad++ < 5)
                        printf("    o mismatch b=%d h=%d i=%d c=%d: got %.6f want %.6f\n", b, h, i, c, got, want);
                    if (!(err <= max_o)) max_o = isnan(err) ? INFINITY : err;
                }
            }
    }
    for (int64_t i = 0; i < nlse; ++i) {
        uint32_t u;
        memcpy(&u, &lse[i], 4);
        if (!lse_written[i] && u != 0xFFFFFFFFu && bad++ < 5)
            printf("    lse written outside the valid rows at %lld\n", (long long)i);
    }
    printf("    max |o - ref| = %.3g, max |lse - ref| = %.3g\n", max_o, max_lse);
    return bad == 0;
}

template <typename T, int D> static bool check_case(const Case &c, Variant v, uint32_t seed) {
    Problem pr = make_problem<T>(c, seed);
    const fat_params &p = pr.p;
    printf("%-5s D=%d %-17s b=%d hq=%d hkv=%d sq=%d sk=%d d=%d dv=%d causal=%d window=(%d,%d) "
           "softcap=%g varlen=%d\n",
           fat::sm90::kIsHalf<T> ? "fp16" : "bf16", D, variant_name(v, D), c.b, c.hq, c.hkv, c.sq, c.sk, c.d,
           c.dv, c.causal, c.wl, c.wr, c.softcap, c.varlen);
    float *o_ref, *lse_ref;
    CUDA_CHECK(cudaMalloc(&o_ref, std::max<int64_t>(pr.rows_q * c.hq * c.dv, 1) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&lse_ref, std::max<int64_t>(pr.rows_q * c.hq, 1) * sizeof(float)));
    const int64_t threads = (int64_t)c.b * c.hq * c.sq;
    ref_attention<T><<<(unsigned)((threads + 127) / 128), 128>>>(p, pr.wl, pr.wr, o_ref, lse_ref, pr.rows_q);
    CUDA_CHECK(cudaGetLastError());
    float unused_ms;
    const fat_status st = run_variant<T, D>(v, p, false, &unused_ms);
    CUDA_CHECK(cudaDeviceSynchronize());
    bool ok = st == FAT_OK;
    if (!ok) {
        printf("    launch returned %s\n", fat_status_string(st));
    } else {
        std::vector<float> o_h(pr.rows_q * c.hq * c.dv), lse_h(pr.rows_q * c.hq);
        CUDA_CHECK(cudaMemcpy(o_h.data(), o_ref, o_h.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(lse_h.data(), lse_ref, lse_h.size() * 4, cudaMemcpyDeviceToHost));
        ok = compare(pr, fat::sm90::kIsHalf<T>, o_h, lse_h);
    }
    printf("    %s\n", ok ? "PASS" : "FAIL");
    cudaFree(o_ref);
    cudaFree(lse_ref);
    free_problem(pr);
    return ok;
}

/* ---- the case lists ---------------------------------------------------------------------- */

static std::vector<Case> cases_main(int d) {
    std::vector<Case> cs;
    const int lens[][2] = {{1, 1}, {17, 17}, {128, 128}, {1000, 1000}, {17, 1000}, {1000, 17}, {1, 1000}, {128, 17}, {300, 129}};
    for (auto &l : lens)
        for (int causal = 0; causal < 2; ++causal) cs.push_back({2, 4, 4, l[0], l[1], d, d, causal, -1, -1, 0.f, 0});
    cs.push_back({2, 4, 4, 1000, 1000, d, d, 0, 64, 32, 0.f, 0});   /* sliding window */
    cs.push_back({2, 4, 4, 1000, 777, d, d, 0, 100, -1, 0.f, 0});   /* left window only */
    cs.push_back({2, 4, 4, 333, 1000, d, d, 1, 200, -1, 0.f, 0});   /* causal + window */
    cs.push_back({2, 4, 4, 1000, 300, d, d, 1, -1, -1, 0.f, 0});    /* rows with no key */
    cs.push_back({2, 4, 4, 1000, 1000, d, d, 0, -1, -1, 2.f, 0});   /* softcap */
    cs.push_back({2, 4, 4, 1000, 1000, d, d, 1, -1, -1, 5.f, 0});   /* softcap + causal */
    cs.push_back({2, 8, 2, 1000, 1000, d, d, 0, -1, -1, 0.f, 0});   /* GQA */
    cs.push_back({1, 6, 1, 257, 1000, d, d, 1, -1, -1, 0.f, 0});    /* MQA */
    cs.push_back({2, 4, 4, 200, 300, d - 32 > 0 ? d - 32 : 8, d - 32 > 0 ? d - 32 : 8, 0, -1, -1, 0.f, 0}); /* d < D */
    cs.push_back({2, 4, 4, 200, 300, d, d / 2, 1, -1, -1, 0.f, 0}); /* dv != d */
    cs.push_back({4, 4, 2, 1000, 1000, d, d, 0, -1, -1, 0.f, 1});   /* varlen */
    cs.push_back({5, 4, 4, 600, 1000, d, d, 1, -1, -1, 0.f, 1});    /* varlen causal */
    cs.push_back({3, 4, 2, 500, 400, d, d, 1, 50, -1, 0.f, 1});     /* varlen causal window */
    return cs;
}

static std::vector<Case> cases_small(int d) {
    std::vector<Case> cs;
    cs.push_back({2, 4, 4, 1000, 1000, d, d, 0, -1, -1, 0.f, 0});
    cs.push_back({2, 4, 4, 17, 1000, d, d, 1, -1, -1, 0.f, 0});
    cs.push_back({2, 4, 4, 1000, 17, d, d, 1, -1, -1, 0.f, 0});
    cs.push_back({2, 8, 2, 300, 700, d, d, 1, 64, -1, 3.f, 0});
    cs.push_back({4, 4, 2, 700, 900, d, d, 1, -1, -1, 0.f, 1});
    /* more tiles than SMs (persistent CTAs run several), some without keys */
    cs.push_back({4, 16, 4, 1000, 300, d, d, 1, -1, -1, 0.f, 0});
    cs.push_back({6, 12, 4, 1100, 1300, d, d, 1, -1, -1, 0.f, 1});
    cs.push_back({3, 16, 8, 1500, 1500, d, d, 0, -1, -1, 0.f, 0});
    return cs;
}

static int failures = 0, total = 0;

template <typename T, int D> static void check_list(const std::vector<Case> &cs, Variant v) {
    uint32_t seed = 1;
    for (const Case &c : cs) {
        ++total;
        if (!check_case<T, D>(c, v, seed++)) ++failures;
    }
}

/* ---- timing ------------------------------------------------------------------------------- */

template <int D> static void bench(Variant v) {
    printf("\n%s, bf16, D=%d, 16 heads, batch * seqlen = 16384\n", variant_name(v, D), D);
    printf("  %-6s %-7s %10s %9s\n", "seqlen", "causal", "ms", "TFLOPS");
    for (int causal = 0; causal < 2; ++causal)
        for (int s = 512; s <= 16384; s *= 2) {
            Case c = {16384 / s, 16, 16, s, s, D, D, causal, -1, -1, 0.f, 0};
            Problem pr = make_problem<__nv_bfloat16>(c, 7);
            float median = 0.f;
            const fat_status st = run_variant<__nv_bfloat16, D>(v, pr.p, true, &median);
            if (st != FAT_OK) {
                printf("  seqlen %d: launch returned %s\n", s, fat_status_string(st));
                free_problem(pr);
                continue;
            }
            const double flops = 4.0 * c.b * c.hq * (double)s * s * D / (causal ? 2 : 1);
            printf("  %-6d %-7d %10.3f %9.1f\n", s, causal, median, flops / (median * 1e-3) / 1e12);
            free_problem(pr);
        }
}

/* sm90_fwd (or variant v) at one shape of the timing table: one warm-up
 * call, then one timed (for a profiler: the second kernel launch is the
 * measured one). */
template <int D> static int run_one(int s, int causal, Variant v) {
    Case c = {16384 / s, 16, 16, s, s, D, D, causal, -1, -1, 0.f, 0};
    Problem pr = make_problem<__nv_bfloat16>(c, 7);
    float ms = 0.f;
    fat_status st;
    if (v == DEFAULT) {
        st = fat::sm90_fwd<__nv_bfloat16, D>(pr.p, 0);
        if (st == FAT_OK) launch_ms<__nv_bfloat16, D>(pr.p, &ms);
    } else {
        st = run_variant<__nv_bfloat16, D>(v, pr.p, false, &ms);
        if (st == FAT_OK) st = run_variant<__nv_bfloat16, D>(v, pr.p, false, &ms);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const double flops = 4.0 * c.b * c.hq * (double)s * s * D / (causal ? 2 : 1);
    printf("%s D=%d seqlen %d causal %d: %s, %.3f ms, %.1f TFLOPS\n", variant_name(v, D), D, s, causal,
           fat_status_string(st), ms, flops / (ms * 1e-3) / 1e12);
    free_problem(pr);
    return st == FAT_OK ? 0 : 1;
}

#ifdef FAT_SM90_TIMELINE
/* run_one's shape timed (with the stamps), then one launch recorded by
 * sm90_timeline.cuh: the events of the first kCtas CTAs to path as "cta
 * role index event clock" lines (clock: SM cycles). */
template <int D> static int run_timeline(int s, int causal, Variant v, const char *path) {
    namespace tl = fat::timeline;
    Case c = {16384 / s, 16, 16, s, s, D, D, causal, -1, -1, 0.f, 0};
    Problem pr = make_problem<__nv_bfloat16>(c, 7);
    float ms = 0.f; /* the median of the timed launches (stamps included), then one recorded */
    fat_status st = run_variant<__nv_bfloat16, D>(v, pr.p, true, &ms);
    CUDA_CHECK(cudaDeviceSynchronize());
    static int zero[tl::kCtas][tl::kRoles];
    CUDA_CHECK(cudaMemcpyToSymbol(tl::counts, zero, sizeof(zero)));
    float unused_ms;
    if (st == FAT_OK) st = run_variant<__nv_bfloat16, D>(v, pr.p, false, &unused_ms);
    CUDA_CHECK(cudaDeviceSynchronize());
    static int counts[tl::kCtas][tl::kRoles];
    static unsigned long long events[tl::kCtas][tl::kRoles][tl::kEntries];
    CUDA_CHECK(cudaMemcpyFromSymbol(counts, tl::counts, sizeof(counts)));
    CUDA_CHECK(cudaMemcpyFromSymbol(events, tl::buf, sizeof(events)));
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "# %s D=%d seqlen %d causal %d batch %d heads %d\n", variant_name(v, D), D, s, causal, c.b, c.hq);
    for (int cta = 0; cta < tl::kCtas; ++cta)
        for (int r = 0; r < tl::kRoles; ++r)
            for (int i = 0; i < counts[cta][r]; ++i)
                fprintf(f, "%d %d %d %llu %llu\n", cta, r, i, events[cta][r][i] & 255, events[cta][r][i] >> 8);
    fclose(f);
    const double flops = 4.0 * c.b * c.hq * (double)s * s * D / (causal ? 2 : 1);
    printf("%s D=%d seqlen %d causal %d: %s, %.3f ms, %.1f TFLOPS with stamps, timeline in %s\n",
           variant_name(v, D), D, s, causal, fat_status_string(st), ms, flops / (ms * 1e-3) / 1e12, path);
    free_problem(pr);
    return st == FAT_OK ? 0 : 1;
}
#endif

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* a hang or a timeout still leaves the last case in the log */
    const bool check_only = argc > 1 && strcmp(argv[1], "check") == 0;
    g_thread_store = argc > 1 && strcmp(argv[1], "thread-store") == 0;
    if (g_thread_store) printf("O by thread stores (FwdArgs::o_tma = 0) in every variant but the default\n");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    if (prop.major != 9) {
        printf("needs an sm_90 GPU\n");
        return 1;
    }
    if (argc > 3 && strcmp(argv[1], "one") == 0) { /* one D seqlen [causal] */
        const int d = atoi(argv[2]), s = atoi(argv[3]), causal = argc > 4 ? atoi(argv[4]) : 0;
        const int v = argc > 5 ? atoi(argv[5]) : (int)DEFAULT;
        if (s < 1 || s > 16384 || v < 0 || v > (int)DEFAULT) return 1;
        return d == 64 ? run_one<64>(s, causal, (Variant)v) : d == 128 ? run_one<128>(s, causal, (Variant)v)
               : d == 256 ? run_one<256>(s, causal, (Variant)v) : 1;
    }
#ifdef FAT_SM90_TIMELINE
    if (argc > 6 && strcmp(argv[1], "timeline") == 0) { /* timeline D seqlen causal variant path */
        const int d = atoi(argv[2]), s = atoi(argv[3]), causal = atoi(argv[4]), v = atoi(argv[5]);
        if (s < 1 || s > 16384 || v < 0 || v > (int)DEFAULT) return 1;
        return d == 64 ? run_timeline<64>(s, causal, (Variant)v, argv[6])
               : d == 128 ? run_timeline<128>(s, causal, (Variant)v, argv[6]) : 1;
    }
#endif
    if (argc > 2 && strcmp(argv[1], "table") == 0) { /* table D [variant] */
        const int d = atoi(argv[2]), v = argc > 3 ? atoi(argv[3]) : (int)DEFAULT;
        if (v < 0 || v > (int)DEFAULT) return 1;
        if (d == 64) bench<64>((Variant)v);
        else if (d == 128) bench<128>((Variant)v);
        else if (d == 256) bench<256>((Variant)v);
        else return 1;
        return 0;
    }
    /* sm90_fwd itself (wide blocks where no edge, else the default) on every case */
    check_list<__nv_bfloat16, 128>(cases_main(128), DEFAULT);
    check_list<__half, 128>(cases_main(128), DEFAULT);
    for (Variant v : variants_128)
        if (v != DEFAULT) check_list<__nv_bfloat16, 128>(cases_small(128), v);
    for (Variant v : persistent_128) check_list<__nv_bfloat16, 128>(cases_small(128), v);
    check_list<__half, 128>(cases_small(128), WIDE_PERSIST);
    check_list<__nv_bfloat16, 64>(cases_small(64), DEFAULT);
    check_list<__half, 64>(cases_small(64), DEFAULT);
    for (Variant v : variants_64)
        if (v != DEFAULT) check_list<__nv_bfloat16, 64>(cases_small(64), v);
    for (Variant v : persistent_64) check_list<__nv_bfloat16, 64>(cases_small(64), v);
    check_list<__half, 64>(cases_small(64), WIDE);
    check_list<__half, 64>(cases_small(64), TRIPLE_PINGPONG);
    check_list<__half, 64>(cases_main(64), TRIPLE_PINGPONG_PERSIST);
    check_list<__half, 64>(cases_main(64), TRIPLE_PINGPONG_PERSIST_CARRY);
    check_list<__half, 64>(cases_main(64), PINGPONG_PERSIST_CARRY_ONES);
    check_list<__nv_bfloat16, 128>(cases_main(128), OVERLAP_PERSIST_CARRY);
    check_list<__nv_bfloat16, 256>(cases_small(256), DEFAULT);
    check_list<__half, 256>(cases_small(256), DEFAULT);
    for (Variant v : variants_256)
        if (v != DEFAULT) check_list<__nv_bfloat16, 256>(cases_small(256), v);
    for (Variant v : persistent_256) check_list<__nv_bfloat16, 256>(cases_small(256), v);
    printf("\ncorrectness: %d passed, %d failed\n", total - failures, failures);
    if (!check_only) {
        for (Variant v : variants_128) bench<128>(v);
        for (Variant v : variants_64) bench<64>(v);
        for (Variant v : variants_256) bench<256>(v);
        for (Variant v : persistent_128) bench<128>(v);
        for (Variant v : persistent_64) bench<64>(v);
        for (Variant v : persistent_256) bench<256>(v);
    }
    return failures == 0 ? 0 : 1;
}
