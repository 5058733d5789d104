/*
 * fat_sm80_bwd.cuh - the mma.sync backward pass (Ampere and newer):
 * dq, dk, dv of O = softmax(scale * Q K^T + mask) V, FlashAttention-2 style:
 * P is recomputed from the forward's lse, never stored.
 *
 * Shapes, strides (elements) and masking are those of flash_attn_t.h and
 * fat_cuda_internal.h; one compiled head dim D (d, d_v <= D, columns past
 * d / d_v zero-filled on load and never stored) and element type T.  For
 * query row i, key j of one sequence, query head h, kv head h / (hq / hkv):
 *   s = scale q_i.k_j, s' = cap tanh(s / cap) (softcap) or s, -inf masked;
 *   P = exp(s' - lse_i); Dot_i = dO_i.O_i; dP = dO_i.v_j;
 *   dS = P (dP - Dot_i) [* (1 - tanh^2)]; dV_j += P dO_i; dK_j += scale dS q_i;
 *   dQ_i += scale dS k_j.  dK/dV of a kv head sum over its group's heads.
 *
 * Kernels, in launch order:
 *  1. bwd_prep_kernel, a group of lanes per two flat query rows and head:
 *     dot = sum_c dO * O, lse_log2 = lse * log2(e) (+inf where lse = -inf, so
 *     P = exp2(. - lse_log2) = 0 on empty rows); each CTA zeroes the fp32 dq
 *     accumulator of its rows (non-deterministic mode).
 *  2. dkdv_kernel, one CTA per (key block of kBlockN keys, kv head, batch):
 *     K, V of the block stay in shared memory, dK, dV in fp32 registers.  It
 *     loops over the group's query heads and the query blocks (kBlockM rows)
 *     that can see the key block; each step computes, transposed so that
 *     rows are keys, S^T = K Q^T, dP^T = V dO^T (the exponentials of P^T
 *     between its MMAs), P^T, dS^T, then
 *     dV += P^T dO, dK += dS^T Q and (non-deterministic) dq_accum += dS K
 *     by atomicAdd, dS^T going through shared memory for that product.
 *  3. non-deterministic: bwd_dq_convert_kernel, the same lane groups:
 *     dq = scale * dq_accum.  deterministic: dq_kernel, one CTA per (query
 *     block, query head, batch), loops over the visible key blocks in order,
 *     recomputes S, P, dP, dS and keeps dQ in registers.
 *
 * Who owns what in dkdv_kernel (kWarps warps, kSplitD of them per 16
 * kKeyTiles keys; tile sizes in BwdTiles):
 *   warp w: keys key_row0 = 16 kKeyTiles (w / kSplitD) .. +16 kKeyTiles - 1
 *   of the block (kKeyTiles m16 tiles, so every Q / dO fragment it reads
 *   feeds kKeyTiles MMAs); for S^T
 *   and dP^T the query columns (w % kSplitD) * kBlockM / kSplitD .. (the
 *   whole query block when kSplitD = 1); for dK, dV the head-dim columns
 *   (w % kSplitD) * D / kSplitD ...  With kSplitD = 1, P^T and dS^T feed
 *   the dV, dK products straight from registers; otherwise every warp writes
 *   its part to shared memory first.  For the dQ product warp w owns the
 *   16 kDqMTiles query rows from 16 kDqMTiles (w % kDqWarpsM) and head-dim
 *   columns (w / kDqWarpsM) kDqSpan .. +kDqSpan-1, kDqChunk at a time.
 * dq_kernel: warp w owns query rows 16 w .. 16 w + 15 and all D columns.
 * Within a warp, fragment layouts are those of fat_sm80_primitives.cuh: lane
 * 4 g + t holds C rows g, g + 8 and columns 2t, 2t + 1 of every n8 tile.
 *
 * Shared-memory tiles are fat::PaddedTile (rows 16 bytes longer than the
 * data) rather than the swizzled SmemTile: see PaddedTile.
 *
 * Workspace (sm80_bwd_workspace_bytes; fp32, each array 256-byte aligned),
 * rows_q = b * sq (dense) or total_q (varlen), flat row = b * sq + i or
 * cu_seqlens_q[b] + i:
 *   dq_accum (hq, ceil(rows_q / 16), D / 8, 32, 4): per head, groups of 16
 *   flat rows, per group the D / 8 m16n8 tiles of an mma.sync C fragment in
 *   lane order (lane 4 g + t: rows g, g + 8, columns 2t, 2t + 1), so that a
 *   warp adds a whole aligned C tile with one 512-byte float4 atomic
 *   (dq_accum_index), lse_log2 (hq, rows_q), dot (hq, rows_q).
 */
#pragma once

#include <limits.h>
#include <math.h>

#include <algorithm>
#include <type_traits>

#include "fat_cuda_internal.h"
#include "fat_sm80_primitives.cuh"

namespace fat {
namespace bwd80 {

/* ---- tile configuration ------------------------------------------------- */

/* Columns of one dQ chunk: the largest of 64, 48, 32, 16 that divides span
 * and keeps the chunk's accumulator (m_tiles * cols / 2 fp32 per thread)
 * within 48 registers. */
constexpr int dq_chunk_cols(int span, int m_tiles) {
    return (span % 64 == 0 && m_tiles * 64 <= 96)   ? 64
           : (span % 48 == 0 && m_tiles * 48 <= 96) ? 48
           : span % 32 == 0                         ? 32
                                                    : 16;
}

/* One tile configuration of the backward.  dkdv_kernel: kWarps warps; each
 * owns kKeyTiles m16 key tiles (16 kKeyTiles keys), kSplitD warps share
 * those keys (each 1 / kSplitD of the query columns of S^T, dP^T and of the
 * head-dim columns of dK, dV), so kBlockN = 16 kKeyTiles kWarps / kSplitD;
 * query blocks of kBlockM rows, kStages Q / dO / lse / dot buffers.  Live
 * fp32 registers per thread ~ kKeyTiles ((dK + dV) D + (S^T + dP^T)
 * kBlockM) / (16 kSplitD); with addressing they must fit 255 without spills
 * (ptxas -v, sm_80 and sm_90a).  Shared memory (padded tiles) must fit the
 * device (163 KB on an A100, 227 KB on an H100 / H200; the launcher answers
 * unsupported otherwise).  kOverlapScores: GradMath::score_part (the exp2
 * of P, the tanh under softcap) between the MMAs of the dP^T GEMM
 * (dkdv_step_grads); false (after both GEMMs) where that spills.  kPairs:
 * where a key block's visible queries shrink with its index (causal, or a
 * right window with no left one), CTA j runs key blocks j and
 * num_k_blocks - 1 - j, so every CTA does the same work and the heaviest
 * blocks of the last heads do not run alone at the end.  kWarpMask: on
 * the steps that need a mask, each warp decides for its own tile whether
 * it needs one and, inside both sequence ends, compares compile-time
 * offsets with two per-thread limits (zero_masked_warp_tile), where
 * otherwise every warp tests every element (zero_masked).  dq_kernel
 * (deterministic mode) tiles depend on D only. */
template <int D_, int kWarps_, int kKeyTiles_, int kSplitD_, int kBlockM_, int kStages_,
          bool kOverlapScores_ = true, bool kPairs_ = false, bool kWarpMask_ = false>
struct BwdTiles {
    static constexpr int D = D_;
    /* dkdv_kernel */
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kKeyTiles = kKeyTiles_; /* m16 key tiles per warp */
    static constexpr int kSplitD = kSplitD_;
    static constexpr int kBlockN = 16 * kKeyTiles * kWarps / kSplitD;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kStages = kStages_;
    static constexpr bool kOverlapScores = kOverlapScores_;
    static constexpr bool kPairs = kPairs_;
    static constexpr bool kWarpMask = kWarpMask_;
    static constexpr int kSTiles = kBlockM / kSplitD / 8; /* n8 tiles of S^T per key tile */
    static constexpr int kKvTiles = D / kSplitD / 8;      /* n8 tiles of dK, dV per key tile */
    static constexpr int kDqMTiles = D >= 128 ? 2 : 1;    /* m16 tiles per warp in dQ */
    static constexpr int kDqWarpsM = kBlockM / (16 * kDqMTiles);
    static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
    static constexpr int kDqSpan = D / kDqWarpsD;
    static constexpr int kDqChunk = dq_chunk_cols(kDqSpan, kDqMTiles);
    /* dq_kernel (deterministic mode) */
    static constexpr int kQWarps = 4;
    static constexpr int kQThreads = 32 * kQWarps;
    static constexpr int kQBlockM = 16 * kQWarps;
    static constexpr int kQBlockN = 64;
    static constexpr int kQStages = D >= 256 ? 1 : 2; /* K / V buffers */

    static_assert(kWarps % kSplitD == 0, "warps split evenly over key rows");
    static_assert(kStages == 1 || kStages == 2, "single or double buffered");
    static_assert(kSTiles % 2 == 0 && kKvTiles % 2 == 0, "warp tiles are whole n16 pairs");
    static_assert(kDqWarpsM * 16 * kDqMTiles == kBlockM && kDqWarpsM * kDqWarpsD == kWarps,
                  "dQ warps cover the query block");
    static_assert(kDqSpan % kDqChunk == 0 && kDqChunk % 16 == 0, "dQ chunks are n16 pairs");
    static_assert(2 * kBlockM <= kThreads, "one thread per lse / dot entry");
    static_assert(D % 32 == 0 && D <= FAT_MAX_HEAD_DIM, "compiled head dims");
};

/* The configuration each head dim runs with.  D = 128: 32-key warp tiles,
 * two warps splitting the query columns / head dims (128 keys per CTA);
 * D = 64: four warps of 32-key tiles over 32-row query blocks (128 keys per
 * CTA, two CTAs per SM, so one's barriers and loads overlap the other's
 * MMAs): the fastest of dev/sm80_bwd_bench.cu's variants on an H200
 * (benchmarks/NOTES.md "sm80 backward").  D >= 192 single-buffers Q / dO
 * to fit an A100's shared memory; D = 32, 96 are unmeasured.  kWarpMask at
 * D = 128: +1-2 % at 1k-16k, causal and not, on an H100; -1 % at D = 64
 * (NOTES "Per-warp masks"). */
template <int D, bool kPairs = false, bool kWarpMask = D == 128>
struct BwdConfig
    : BwdTiles<D, D == 64 ? 4 : 8, (D == 64 || D == 128) ? 2 : 1, (D == 128 || D >= 192) ? 2 : 1,
               D <= 32 ? 128 : D == 64 ? 32 : 64, D >= 192 ? 1 : 2, true, kPairs, kWarpMask> {};

/* Where BwdConfig<D> needs more shared memory than the device has (D = 128:
 * 177 KB, an A100 has 163 KB), the backward runs with BwdCompact<D>::type,
 * 16-key warp tiles (160 KB), without kOverlapScores (28 bytes of spills on
 * sm_90a with it).  Other head dims fit everywhere. */
template <int D> struct BwdCompact { using type = BwdConfig<D>; };
template <> struct BwdCompact<128> { using type = BwdTiles<128, 8, 1, 1, 64, 2, false>; };

/* The head dims whose backward runs causal grids in pairs where
 * pairs_finish_sooner says so (BwdConfig<D, true>, a second instantiation):
 * D = 128, 1-3 % faster at 1k-8k causal on an H100; at D = 64 the pairs'
 * kernel is slower in every case (benchmarks/NOTES.md "causal pairs"). */
constexpr bool bwd_may_pair(int d) { return d == 128; }

/* Byte offsets of dkdv_kernel's shared memory (all multiples of 16). */
template <class Cfg> struct DkdvSmem {
    using KvTile = PaddedTile<Cfg::kBlockN, Cfg::D>;       /* K, V: [key][col] */
    using QTile = PaddedTile<Cfg::kBlockM, Cfg::D>;        /* Q, dO: [query][col] */
    using DsTile = PaddedTile<Cfg::kBlockN, Cfg::kBlockM>; /* dS^T, P^T: [key][query] */
    static constexpr int kK = 0;
    static constexpr int kV = kK + KvTile::kBytes;
    static constexpr int kQ = kV + KvTile::kBytes;
    static constexpr int kDout = kQ + Cfg::kStages * QTile::kBytes;
    static constexpr int kDs = kDout + Cfg::kStages * QTile::kBytes;
    static constexpr int kP = kDs + DsTile::kBytes; /* only when kSplitD > 1 */
    static constexpr int kLse = kP + (Cfg::kSplitD > 1 ? DsTile::kBytes : 0);
    static constexpr int kDot = kLse + Cfg::kStages * Cfg::kBlockM * 4;
    static constexpr int kBytes = kDot + Cfg::kStages * Cfg::kBlockM * 4;
};

/* Byte offsets of dq_kernel's shared memory. */
template <class Cfg> struct DqSmem {
    using QTile = PaddedTile<Cfg::kQBlockM, Cfg::D>;  /* Q, dO: [query][col] */
    using KvTile = PaddedTile<Cfg::kQBlockN, Cfg::D>; /* K, V: [key][col] */
    static constexpr int kQ = 0;
    static constexpr int kDout = kQ + QTile::kBytes;
    static constexpr int kK = kDout + QTile::kBytes;
    static constexpr int kV = kK + Cfg::kQStages * KvTile::kBytes;
    static constexpr int kBytes = kV + Cfg::kQStages * KvTile::kBytes;
};

/* ---- workspace ---------------------------------------------------------- */

struct WorkspaceLayout {
    int64_t rows_q;
    size_t dq_accum, lse_log2, dot, total; /* byte offsets, total size */
};

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline WorkspaceLayout workspace_layout(const fat_params &p, int padded_d) {
    WorkspaceLayout w;
    w.rows_q = p.cu_seqlens_q ? p.total_q : (int64_t)p.b * p.sq;
    const size_t per_row = (size_t)w.rows_q * p.hq * sizeof(float);
    const size_t dq_rows = (size_t)(w.rows_q + 15) / 16 * 16;
    w.dq_accum = 0;
    w.lse_log2 = align256(dq_rows * p.hq * padded_d * sizeof(float));
    w.dot = w.lse_log2 + align256(per_row);
    w.total = w.dot + align256(per_row);
    return w;
}

/* ---- what every kernel needs besides fat_params -------------------------- */

struct BwdArgs {
    fat_params p;
    float *dq_accum;               /* fp32, tiled: dq_accum_index */
    float *lse_log2;               /* (hq, rows_q) */
    float *dot;                    /* (hq, rows_q) */
    int64_t rows_q;
    int64_t dq_groups;             /* ceil(rows_q / 16) */
    int window_left, window_right; /* after causal; -1 = unbounded */
    float scale;                   /* softmax_scale */
    float scale_log2;              /* softmax_scale * log2(e) */
    float tanh_scale;              /* softmax_scale / softcap (softcap > 0) */
    float cap_log2;                /* softcap * log2(e) */
    int softcap;                   /* softcap > 0 */
    bool paired;                   /* dkdv_kernel runs key blocks in pairs (kPairs) */
};

inline BwdArgs make_args(const fat_params &p, int padded_d) {
    const double log2e = 1.4426950408889634;
    const WorkspaceLayout w = workspace_layout(p, padded_d);
    unsigned char *ws = static_cast<unsigned char *>(p.workspace);
    BwdArgs a;
    a.p = p;
    a.dq_accum = reinterpret_cast<float *>(ws + w.dq_accum);
    a.lse_log2 = reinterpret_cast<float *>(ws + w.lse_log2);
    a.dot = reinterpret_cast<float *>(ws + w.dot);
    a.rows_q = w.rows_q;
    a.dq_groups = (w.rows_q + 15) / 16;
    fat_effective_window(&p, &a.window_left, &a.window_right);
    a.scale = (float)p.softmax_scale;
    a.scale_log2 = (float)(p.softmax_scale * log2e);
    a.softcap = p.softcap > 0;
    a.tanh_scale = a.softcap ? (float)(p.softmax_scale / p.softcap) : 0.f;
    a.cap_log2 = (float)(p.softcap * log2e);
    a.paired = false;
    return a;
}

/* make_args for tile configuration Cfg: pairs key blocks (Cfg::kPairs) where
 * a key block's visible queries shrink with its index. */
template <class Cfg> inline BwdArgs tile_args(const fat_params &p) {
    BwdArgs args = make_args(p, Cfg::D);
    args.paired = Cfg::kPairs && args.window_right >= 0 && args.window_left < 0;
    return args;
}

/* dkdv_kernel's grid: one CTA per (job, kv head, sequence) (key_block_job). */
template <class Cfg> inline int64_t dkdv_ctas(const BwdArgs &args) {
    const int64_t k_blocks = (args.p.sk + Cfg::kBlockN - 1) / Cfg::kBlockN;
    return (args.paired ? (k_blocks + 1) / 2 : k_blocks) * args.p.hkv * args.p.b;
}

/* ---- small device helpers ------------------------------------------------ */

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1) without branches; absolute error ~1e-7,
 * exactly +-1 once exp(2x) over- or underflows. */
__device__ __forceinline__ float tanh_approx(float x) {
    float r;
    const float e = exp2_approx(x * 2.8853900817779268f); /* 2 log2(e) */
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(e + 1.f));
    return 1.f - 2.f * r;
}

/* 4-byte cp.async, or 4 zero bytes when !valid (src is not read). */
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void *gmem, bool valid) {
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem),
                 "r"(src_bytes));
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t value) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(value));
}

__device__ __forceinline__ int clamp_to_int(long long x) {
    return x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
}

/* Element offset of flat query row r (see the header) of head h. */
__device__ __forceinline__ int64_t flat_row_offset(const fat_params &p, int64_t r, int h,
                                                   int64_t batch_stride, int64_t row_stride,
                                                   int64_t head_stride) {
    const int64_t rows = p.cu_seqlens_q ? r * row_stride
                                        : (r / p.sq) * batch_stride + (r % p.sq) * row_stride;
    return rows + (int64_t)h * head_stride;
}

/* ---- per-sequence geometry and masking ------------------------------------ */

struct Geometry {
    SeqInfo seq;
    int batch;       /* b for dense batches, 0 for varlen (batch strides ignored) */
    int64_t flat_q0; /* first flat query row of the sequence */
    int lo, hi;      /* key j is visible from query i iff lo <= j - i <= hi */

    /* Element offset of query-side row i / key-side row j (head not added). */
    __device__ __forceinline__ int64_t q_offset(int64_t batch_stride, int64_t row_stride,
                                                int i) const {
        return (int64_t)batch * batch_stride + (seq.q_start + i) * row_stride;
    }
    __device__ __forceinline__ int64_t k_offset(int64_t batch_stride, int64_t row_stride,
                                                int j) const {
        return (int64_t)batch * batch_stride + (seq.k_start + j) * row_stride;
    }
    __device__ __forceinline__ bool visible(int key, int query) const {
        const int diff = key - query;
        return key < seq.sk && query < seq.sq && diff >= lo && diff <= hi;
    }
    /* Whether some element of keys [k0, k0 + nk) x queries [q0, q0 + nq) is
     * masked (past the end of either sequence or outside the window). */
    __device__ __forceinline__ bool tile_needs_mask(int k0, int nk, int q0, int nq) const {
        return k0 + nk > seq.sk || q0 + nq > seq.sq || k0 + nk - 1 - q0 > hi ||
               k0 - (q0 + nq - 1) < lo;
    }
};

__device__ __forceinline__ Geometry make_geometry(const BwdArgs &args, int b) {
    const fat_params &p = args.p;
    Geometry geo;
    geo.seq = seq_info(p.cu_seqlens_q, p.cu_seqlens_k, b, p.sq, p.sk);
    const bool varlen = p.cu_seqlens_q != nullptr;
    geo.batch = varlen ? 0 : b;
    geo.flat_q0 = varlen ? geo.seq.q_start : (int64_t)b * p.sq;
    const long long shift = (long long)geo.seq.sk - geo.seq.sq;
    geo.hi = args.window_right < 0 ? INT_MAX : clamp_to_int(shift + args.window_right);
    geo.lo = args.window_left < 0 ? INT_MIN : clamp_to_int(shift - args.window_left);
    return geo;
}

/* Blocks [first, first + count) of block_size rows. */
struct BlockRange {
    int first, count;
};

__device__ __forceinline__ BlockRange rows_to_blocks(long long lo, long long hi, int block_size) {
    BlockRange r = {0, 0};
    if (lo <= hi) {
        r.first = (int)(lo / block_size);
        r.count = (int)(hi / block_size) - r.first + 1;
    }
    return r;
}

/* Query blocks holding a row that sees one of the keys [k0, k0 + nk). */
__device__ __forceinline__ BlockRange query_blocks_seeing(const Geometry &geo, int k0, int nk,
                                                          int block_m) {
    const int k_last = min(k0 + nk, geo.seq.sk) - 1;
    const long long lo = max(0LL, (long long)k0 - geo.hi);
    const long long hi = min((long long)geo.seq.sq - 1, (long long)k_last - geo.lo);
    return rows_to_blocks(lo, hi, block_m);
}

/* Key blocks holding a key seen by one of the query rows [q0, q0 + nq). */
__device__ __forceinline__ BlockRange key_blocks_seen(const Geometry &geo, int q0, int nq,
                                                      int block_n) {
    const int q_last = min(q0 + nq, geo.seq.sq) - 1;
    const long long lo = max(0LL, (long long)q0 + geo.lo);
    const long long hi = min((long long)geo.seq.sk - 1, (long long)q_last + geo.hi);
    return rows_to_blocks(lo, hi, block_n);
}

/* ---- elementwise: scores to P, dP to dS ---------------------------------- */

/* The elementwise math in two parts, so that the first can run before dP is
 * known (overlapping the dP GEMM): score_part needs only s, grad_part the
 * rest.  lse_log2 = +inf gives P = 0. */
struct GradMath {
    float scale_log2, tanh_scale, cap_log2;

    /* s (raw q.k) becomes P, or t = tanh(scale s / cap) under softcap. */
    template <bool kSoftcap>
    __device__ __forceinline__ void score_part(float &s, float lse_log2) const {
        if (kSoftcap)
            s = tanh_approx(s * tanh_scale);
        else
            s = exp2_approx(s * scale_log2 - lse_log2);
    }

    /* x from score_part becomes P, dp becomes dS. */
    template <bool kSoftcap>
    __device__ __forceinline__ void grad_part(float &x, float &dp, float lse_log2,
                                              float dot) const {
        if (kSoftcap) {
            const float prob = exp2_approx(cap_log2 * x - lse_log2);
            dp = prob * (dp - dot) * (1.f - x * x);
            x = prob;
        } else {
            dp = x * (dp - dot);
        }
    }

    /* Both parts: s (raw q.k) becomes P, dp becomes dS. */
    template <bool kSoftcap>
    __device__ __forceinline__ void apply(float &s, float &dp, float lse_log2, float dot) const {
        score_part<kSoftcap>(s, lse_log2);
        grad_part<kSoftcap>(s, dp, lse_log2, dot);
    }
};

__device__ __forceinline__ GradMath make_grad_math(const BwdArgs &args) {
    GradMath m;
    m.scale_log2 = args.scale_log2;
    m.tanh_scale = args.tanh_scale;
    m.cap_log2 = args.cap_log2;
    return m;
}

/* One n8 tile of a transposed warp tile (rows keys, columns queries col0 +
 * 2t (+1)), in place: GradMath::score_part of S^T.  lse_log2 is a
 * shared-memory array indexed by the tile-local query column. */
template <bool kSoftcap>
__device__ __forceinline__ void score_tile_by_column(float (&s)[4], const float *lse_log2,
                                                     const GradMath &m, int col0, int lane) {
    const int col = col0 + 2 * (lane & 3);
    const float2 l = *reinterpret_cast<const float2 *>(lse_log2 + col);
#pragma unroll
    for (int e = 0; e < 4; ++e) m.score_part<kSoftcap>(s[e], (e & 1) ? l.y : l.x);
}

/* The rest, after score_tile_by_column: P^T and dS^T from its output and dP^T
 * in place; dot is indexed like lse_log2. */
template <bool kSoftcap, int NTiles>
__device__ __forceinline__ void grads_by_column(float (&s)[NTiles][4], float (&dp)[NTiles][4],
                                                const float *lse_log2, const float *dot,
                                                const GradMath &m, int col0, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < NTiles; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        const float2 o = *reinterpret_cast<const float2 *>(dot + col);
        float2 l = {}; /* grad_part reads lse_log2 under softcap only */
        if (kSoftcap) l = *reinterpret_cast<const float2 *>(lse_log2 + col);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            m.grad_part<kSoftcap>(s[j][e], dp[j][e], (e & 1) ? l.y : l.x, (e & 1) ? o.y : o.x);
    }
}

/* Row-major tiles of one warp (rows queries g, g + 8, lse_log2 / dot of those
 * rows in registers, columns keys): P and dS from S and dP in place. */
template <bool kSoftcap, int NTiles>
__device__ __forceinline__ void grads_by_row(float (&s)[NTiles][4], float (&dp)[NTiles][4],
                                             const float (&lse_log2)[2], const float (&dot)[2],
                                             const GradMath &m) {
#pragma unroll
    for (int j = 0; j < NTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            m.apply<kSoftcap>(s[j][e], dp[j][e], lse_log2[e >> 1], dot[e >> 1]);
}

/* Zeroes P and dS where key / query is masked.  Fragment element e of n8
 * tile j is at row row0 + g + 8 (e / 2), column col0 + 8j + 2t + e % 2
 * (absolute indices); keys_are_rows says which of the two is the key. */
template <int NTiles>
__device__ __forceinline__ void zero_masked(float (&p)[NTiles][4], float (&ds)[NTiles][4],
                                            const Geometry &geo, int row0, int col0,
                                            bool keys_are_rows, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = row0 + g + 8 * (e >> 1), col = col0 + 8 * j + 2 * t + (e & 1);
            const bool vis = keys_are_rows ? geo.visible(row, col) : geo.visible(col, row);
            p[j][e] = vis ? p[j][e] : 0.f;
            ds[j][e] = vis ? ds[j][e] : 0.f;
        }
}

/* C tiles converted to T pairs: packed[j][h] = row g + 8h, columns 2t, 2t+1. */
template <typename T, int NTiles>
__device__ __forceinline__ void pack_c(uint32_t (&packed)[NTiles][2], const float (&c)[NTiles][4]) {
#pragma unroll
    for (int j = 0; j < NTiles; ++j) {
        packed[j][0] = elem<T>::pack(c[j][0], c[j][1]);
        packed[j][1] = elem<T>::pack(c[j][2], c[j][3]);
    }
}

/* ---- warp-level products --------------------------------------------------- */

/* acc (16 x 8 NTiles) += A B^T over k = 16 KSteps: A = rows a_row0.. of tile
 * TA (stored [m][k]), B^T = rows b_row0.. of tile TB (stored [n][k]). */
template <typename T, class TA, class TB, int KSteps, int NTiles>
__device__ __forceinline__ void mma_a_bt(float (&acc)[NTiles][4], uint32_t a_tile, int a_row0,
                                         uint32_t b_tile, int b_row0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KSteps; ++ks) {
        uint32_t a[4];
        load_a<TA>(a, a_tile, a_row0, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < NTiles / 2; ++np) {
            uint32_t b[4];
            load_b_nk<TB>(b, b_tile, b_row0 + np * 16, ks * 16, lane);
            mma_16816<T>(acc[2 * np], a, b);
            mma_16816<T>(acc[2 * np + 1], a, b + 2);
        }
    }
}

/* acc (16 x 8 NTiles) += A B over k = 16 KSteps: A fragment ks from
 * load_frag(a, ks), B = columns b_col0.. of tile TB (stored [k][n]). */
template <typename T, class TB, int KSteps, int NTiles, class AFrags>
__device__ __forceinline__ void mma_a_b(float (&acc)[NTiles][4], const AFrags &load_frag,
                                        uint32_t b_tile, int b_col0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KSteps; ++ks) {
        uint32_t a[4];
        load_frag(a, ks);
#pragma unroll
        for (int np = 0; np < NTiles / 2; ++np) {
            uint32_t b[4];
            load_b_kn<TB>(b, b_tile, b_col0 + np * 16, ks * 16, lane);
            mma_16816<T>(acc[2 * np], a, b);
            mma_16816<T>(acc[2 * np + 1], a, b + 2);
        }
    }
}

/* A fragments from packed C tiles in registers (P^T, dS^T, dS): k16 step
 * ks is n8 tiles 2 ks, 2 ks + 1 (the layout c_pair_to_a produces). */
template <int NTiles> struct RegisterA {
    const uint32_t (&packed)[NTiles][2];
    __device__ __forceinline__ void operator()(uint32_t a[4], int ks) const {
        a[0] = packed[2 * ks][0];
        a[1] = packed[2 * ks][1];
        a[2] = packed[2 * ks + 1][0];
        a[3] = packed[2 * ks + 1][1];
    }
};

/* A fragments of rows m0.. of a tile stored [m][k]. */
template <class Tile> struct SharedA {
    uint32_t tile;
    int m0, lane;
    __device__ __forceinline__ void operator()(uint32_t a[4], int ks) const {
        load_a<Tile>(a, tile, m0, ks * 16, lane);
    }
};

/* A fragments of A = X^T, rows m0.., where the tile stores X as [k][m]. */
template <class Tile> struct SharedATransposed {
    uint32_t tile;
    int m0, lane;
    __device__ __forceinline__ void operator()(uint32_t a[4], int ks) const {
        load_a_trans<Tile>(a, tile, m0, ks * 16, lane);
    }
};

/* Writes packed C tiles (rows row0 + g, + 8; columns col0 + 8j + 2t) into a tile. */
template <class Tile, int NTiles>
__device__ __forceinline__ void store_packed_to_smem(uint32_t tile,
                                                     const uint32_t (&packed)[NTiles][2],
                                                     int row0, int col0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NTiles; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        st_shared_u32(tile + Tile::offset(row0 + g, col), packed[j][0]);
        st_shared_u32(tile + Tile::offset(row0 + g + 8, col), packed[j][1]);
    }
}

/* Stores scale * C tiles into global rows (row0 + g, + 8) < row_limit,
 * columns (col0 + 8j + 2t) < col_limit; dst points at row 0, column 0. */
template <typename T, int NTiles>
__device__ __forceinline__ void store_c_to_global(T *dst, int64_t row_stride,
                                                  const float (&c)[NTiles][4], int row0,
                                                  int row_limit, int col0, int col_limit,
                                                  float scale, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + g + 8 * half;
        if (row >= row_limit) continue;
        T *out = dst + (int64_t)row * row_stride + col0 + 2 * t;
#pragma unroll
        for (int j = 0; j < NTiles; ++j)
            if (col0 + 8 * j + 2 * t < col_limit)
                *reinterpret_cast<uint32_t *>(out + 8 * j) =
                    elem<T>::pack(c[j][2 * half] * scale, c[j][2 * half + 1] * scale);
    }
}

/* Index in dq_accum of (flat row r, query head h, column c); columns c, c + 1
 * (c even) are adjacent, and so are the 4 values of one lane's C tile. */
template <int D>
__device__ __forceinline__ int64_t dq_accum_index(const BwdArgs &args, int64_t r, int h, int c) {
    const int in_group = (int)(r & 15);
    const int lane = 4 * (in_group & 7) + ((c & 7) >> 1);
    return ((int64_t)h * args.dq_groups + (r >> 4)) * (16 * D) + (c >> 3) * 128 + 4 * lane +
           2 * (in_group >> 3) + (c & 1);
}

/* atomicAdd of (x, y) into out[0], out[1] (8-byte aligned): one float2
 * atomic on sm90, two float atomics before. */
__device__ __forceinline__ void atomic_add_pair(float *out, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(out), make_float2(x, y));
#else
    atomicAdd(out, x);
    atomicAdd(out + 1, y);
#endif
}

/* atomicAdd of one lane's C tile c[0..3] into out[0..3] (16-byte aligned):
 * one float4 atomic on sm90 (the warp's 32 cover 512 contiguous bytes). */
__device__ __forceinline__ void atomic_add_quad(float *out, const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(out), make_float4(c[0], c[1], c[2], c[3]));
#else
#pragma unroll
    for (int e = 0; e < 4; ++e) atomicAdd(out + e, c[e]);
#endif
}

/* dq_accum += C tiles of one m16 row tile: rows row0 + g (+ 8) < row_limit
 * (row0 flat), columns col0 + 8j + 2t (+1) < col_limit, any alignment. */
template <int D, int NTiles>
__device__ __forceinline__ void dq_atomic_add_c(const BwdArgs &args, int h, int64_t row0,
                                                const float (&c)[NTiles][4], int row_limit,
                                                int col0, int col_limit, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = g + 8 * half;
        if (row >= row_limit) continue;
#pragma unroll
        for (int j = 0; j < NTiles; ++j) {
            const int col = col0 + 8 * j + 2 * t;
            if (col < col_limit)
                atomic_add_pair(args.dq_accum + dq_accum_index<D>(args, row0 + row, h, col),
                                c[j][2 * half], c[j][2 * half + 1]);
        }
    }
}

/* The same for MTiles m16 row tiles that are whole dq_accum row groups
 * (row0 % 16 = 0) with every row and column valid: one float4 atomic per
 * C tile, at group_base (row group row0 / 16, column 0, this lane) plus a
 * warp-uniform offset. */
template <int D, int MTiles, int NTiles>
__device__ __forceinline__ void dq_atomic_add_groups(float *group_base, int col0,
                                                     const float (&c)[MTiles][NTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt)
#pragma unroll
        for (int j = 0; j < NTiles; ++j)
            atomic_add_quad(group_base + mt * 16 * D + (col0 / 8 + j) * 128, c[mt][j]);
}

template <int NTiles> __device__ __forceinline__ void zero_c(float (&c)[NTiles][4]) {
#pragma unroll
    for (int j = 0; j < NTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[j][e] = 0.f;
}

/* ---- 1. preprocess: dot, lse_log2, dq accumulator = 0 --------------------- */

/* The row kernels (prep, dq convert) give each pair of flat rows r, r + 8
 * of one dq_accum row group and one query head a group of kRowLanes<D>
 * lanes (a power of two, so groups never straddle a warp), lane c of the
 * group owning head-dim columns 8c .. 8c + 7 of both rows: 16-byte loads
 * and stores of the rows with every lane busy, and in dq_accum the 64
 * contiguous bytes of C tile c that hold exactly those 16 values.  A CTA of
 * kRowThreads threads covers kRowsPerCta<D> consecutive flat rows (whole
 * row groups) of one head; CTA x is head x % hq of row block x / hq, so
 * neighbouring CTAs read neighbouring heads of the same rows. */
constexpr int kRowThreads = 256;
template <int D> constexpr int kRowLanes = D <= 32 ? 4 : D <= 64 ? 8 : D <= 128 ? 16 : 32;
template <int D> constexpr int kRowsPerCta = 2 * kRowThreads / kRowLanes<D>;
template <int D> constexpr int kRowGroupsPerCta = kRowsPerCta<D> / 16;

/* CTAs of either row kernel. */
template <int D> inline int64_t row_kernel_ctas(const BwdArgs &args) {
    return (args.rows_q + kRowsPerCta<D> - 1) / kRowsPerCta<D> * args.p.hq;
}

/* Where this thread's part of the row kernels lies. */
struct RowPart {
    int64_t group; /* dq_accum row group of its rows */
    int64_t r[2];  /* flat query rows 16 group + g, + 8 */
    bool valid[2]; /* r[i] < rows_q */
    int h;
    int col; /* first of its 8 head-dim columns */
};

template <int D> __device__ __forceinline__ RowPart row_part(const BwdArgs &args) {
    RowPart rp;
    const int hq = args.p.hq;
    const int pair = threadIdx.x / kRowLanes<D>;
    rp.h = (int)(blockIdx.x % hq);
    rp.group = (int64_t)(blockIdx.x / hq) * kRowGroupsPerCta<D> + pair / 8;
    rp.r[0] = 16 * rp.group + pair % 8;
    rp.r[1] = rp.r[0] + 8;
    rp.valid[0] = rp.r[0] < args.rows_q;
    rp.valid[1] = rp.r[1] < args.rows_q;
    rp.col = (int)(threadIdx.x % kRowLanes<D>) * 8;
    return rp;
}

/* This thread's 16 dq_accum values (C tile col / 8, lanes 4g .. 4g + 3 of
 * its row group, g = r[0] % 16): float4 t holds row r[0]'s columns col + 2t,
 * + 1, then row r[1]'s. */
template <int D> __device__ __forceinline__ float *dq_accum_part(const BwdArgs &args, const RowPart &rp) {
    return args.dq_accum + dq_accum_index<D>(args, rp.r[0], rp.h, rp.col);
}

template <typename T>
__device__ __forceinline__ void unpack8(float (&x)[8], const uint4 &chunk) {
    const T *e = reinterpret_cast<const T *>(&chunk);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = elem<T>::to_float(e[k]);
}

/* dq_accum = 0 over this CTA's row groups of its head: one contiguous
 * stretch, written with coalesced 16-byte stores. */
template <int D> __device__ __forceinline__ void zero_dq_accum_groups(const BwdArgs &args) {
    const int hq = args.p.hq;
    const int64_t group0 = (int64_t)(blockIdx.x / hq) * kRowGroupsPerCta<D>;
    const int64_t groups = min((int64_t)kRowGroupsPerCta<D>, args.dq_groups - group0);
    float4 *out = reinterpret_cast<float4 *>(
        args.dq_accum + dq_accum_index<D>(args, 16 * group0, (int)(blockIdx.x % hq), 0));
    for (int i = threadIdx.x; i < groups * (4 * D); i += kRowThreads)
        out[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

/* dot = dO . O and lse_log2 of every (flat row, head); zeroes the dq
 * accumulator (non-deterministic mode).  No lane leaves before the group's
 * shuffles. */
template <typename T, int D>
__global__ void __launch_bounds__(kRowThreads) bwd_prep_kernel(const BwdArgs args) {
    const fat_params &p = args.p;
    if (!p.deterministic) zero_dq_accum_groups<D>(args);
    const RowPart rp = row_part<D>(args);
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!rp.valid[i] || rp.col >= p.d_v) continue;
        const T *o = static_cast<const T *>(p.o) +
                     flat_row_offset(p, rp.r[i], rp.h, p.o_batch_stride, p.o_row_stride,
                                     p.o_head_stride);
        const T *dout = static_cast<const T *>(p.dout) +
                        flat_row_offset(p, rp.r[i], rp.h, p.do_batch_stride, p.do_row_stride,
                                        p.do_head_stride);
        float x[8], y[8];
        unpack8<T>(x, *reinterpret_cast<const uint4 *>(o + rp.col));
        unpack8<T>(y, *reinterpret_cast<const uint4 *>(dout + rp.col));
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[i] += x[k] * y[k];
    }
#pragma unroll
    for (int off = kRowLanes<D> / 2; off > 0; off >>= 1)
#pragma unroll
        for (int i = 0; i < 2; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    if (rp.col != 0) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!rp.valid[i]) continue;
        const int64_t r = rp.r[i];
        const int64_t lse_off = p.cu_seqlens_q
                                    ? (int64_t)rp.h * p.lse_head_stride + r
                                    : (r / p.sq) * p.lse_batch_stride +
                                          (int64_t)rp.h * p.lse_head_stride + r % p.sq;
        const float lse = p.lse[lse_off];
        const int64_t stat = (int64_t)rp.h * args.rows_q + r;
        args.dot[stat] = acc[i];
        args.lse_log2[stat] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
}

/* ---- 3a. dq = scale * dq accumulator (non-deterministic mode) -------------- */

template <typename T, int D>
__global__ void __launch_bounds__(kRowThreads) bwd_dq_convert_kernel(const BwdArgs args) {
    const fat_params &p = args.p;
    const RowPart rp = row_part<D>(args);
    if (!rp.valid[0] || rp.col >= p.d) return;
    const float4 *acc = reinterpret_cast<const float4 *>(dq_accum_part<D>(args, rp));
    const float4 c[4] = {acc[0], acc[1], acc[2], acc[3]};
    const float s = args.scale;
    uint4 row0, row1;
    row0.x = elem<T>::pack(c[0].x * s, c[0].y * s);
    row0.y = elem<T>::pack(c[1].x * s, c[1].y * s);
    row0.z = elem<T>::pack(c[2].x * s, c[2].y * s);
    row0.w = elem<T>::pack(c[3].x * s, c[3].y * s);
    row1.x = elem<T>::pack(c[0].z * s, c[0].w * s);
    row1.y = elem<T>::pack(c[1].z * s, c[1].w * s);
    row1.z = elem<T>::pack(c[2].z * s, c[2].w * s);
    row1.w = elem<T>::pack(c[3].z * s, c[3].w * s);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!rp.valid[i]) continue;
        T *dq = static_cast<T *>(p.dq) + flat_row_offset(p, rp.r[i], rp.h, p.dq_batch_stride,
                                                         p.dq_row_stride, p.dq_head_stride);
        *reinterpret_cast<uint4 *>(dq + rp.col) = i == 0 ? row0 : row1;
    }
}

/* ---- 2. dK, dV (and the atomic dQ) of one key block ------------------------ */

/* What one warp of dkdv_kernel owns (see the header). */
struct DkdvWarp {
    int lane;
    int key_row0; /* first of its 16 kKeyTiles keys, block-local */
    int s_col0;   /* first query column of its S^T / dP^T part */
    int kv_col0;  /* first head-dim column of its dK / dV part */
    int dq_row0;  /* first of its 16 kDqMTiles query rows in the dQ product */
    int dq_col0;  /* first head-dim column of its dQ part */
};

template <class Cfg> __device__ __forceinline__ DkdvWarp make_dkdv_warp(int warp, int lane) {
    DkdvWarp w;
    w.lane = lane;
    w.key_row0 = 16 * Cfg::kKeyTiles * (warp / Cfg::kSplitD);
    w.s_col0 = (warp % Cfg::kSplitD) * (Cfg::kBlockM / Cfg::kSplitD);
    w.kv_col0 = (warp % Cfg::kSplitD) * (Cfg::D / Cfg::kSplitD);
    w.dq_row0 = 16 * Cfg::kDqMTiles * (warp % Cfg::kDqWarpsM);
    w.dq_col0 = (warp / Cfg::kDqWarpsM) * Cfg::kDqSpan;
    return w;
}

/* The default of mma_keys_a_bt's before_kstep: nothing between k-steps. */
struct NoKstepWork {
    __device__ __forceinline__ void operator()(int) const {}
};

/* acc[mt] (16 x 8 NTiles) += A_mt B^T over k = 16 KSteps for MTiles m16
 * tiles: A_mt = rows a_row0 + 16 mt.. of tile TA ([m][k]), B^T = rows
 * b_row0.. of tile TB ([n][k]); each B fragment feeds MTiles MMAs.
 * before_kstep(ks) runs before the MMAs of k-step ks (independent work to
 * interleave with them). */
template <typename T, class TA, class TB, int KSteps, int MTiles, int NTiles,
          class KstepWork = NoKstepWork>
__device__ __forceinline__ void mma_keys_a_bt(float (&acc)[MTiles][NTiles][4], uint32_t a_tile,
                                              int a_row0, uint32_t b_tile, int b_row0,
                                              int lane,
                                              const KstepWork &before_kstep = KstepWork{}) {
#pragma unroll
    for (int ks = 0; ks < KSteps; ++ks) {
        before_kstep(ks);
        uint32_t a[MTiles][4];
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt)
            load_a<TA>(a[mt], a_tile, a_row0 + 16 * mt, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < NTiles / 2; ++np) {
            uint32_t b[4];
            load_b_nk<TB>(b, b_tile, b_row0 + np * 16, ks * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MTiles; ++mt) {
                mma_16816<T>(acc[mt][2 * np], a[mt], b);
                mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
            }
        }
    }
}

/* acc[mt] (16 x 8 NTiles) += A_mt B over k = 16 KSteps: A_mt fragment ks
 * from load_frag(a, mt, ks), B = columns b_col0.. of tile TB ([k][n]). */
template <typename T, class TB, int KSteps, int MTiles, int NTiles, class AFrags>
__device__ __forceinline__ void mma_keys_a_b(float (&acc)[MTiles][NTiles][4],
                                             const AFrags &load_frag, uint32_t b_tile,
                                             int b_col0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KSteps; ++ks) {
        uint32_t a[MTiles][4];
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt) load_frag(a[mt], mt, ks);
#pragma unroll
        for (int np = 0; np < NTiles / 2; ++np) {
            uint32_t b[4];
            load_b_kn<TB>(b, b_tile, b_col0 + np * 16, ks * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MTiles; ++mt) {
                mma_16816<T>(acc[mt][2 * np], a[mt], b);
                mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
            }
        }
    }
}

/* A fragments of key tile mt from packed C tiles in registers (P^T, dS^T). */
template <int MTiles, int NTiles> struct KeysRegisterA {
    const uint32_t (&packed)[MTiles][NTiles][2];
    __device__ __forceinline__ void operator()(uint32_t a[4], int mt, int ks) const {
        RegisterA<NTiles>{packed[mt]}(a, ks);
    }
};

/* A fragments of key tile mt: rows m0 + 16 mt.. of a tile stored [m][k]. */
template <class Tile> struct KeysSharedA {
    uint32_t tile;
    int m0, lane;
    __device__ __forceinline__ void operator()(uint32_t a[4], int mt, int ks) const {
        load_a<Tile>(a, tile, m0 + 16 * mt, ks * 16, lane);
    }
};

/* One Q or dO tile of load_query_step: load_tile_rows_async (a single
 * pointer per thread, unpredicated for full tiles), except with kSplitD = 1:
 * those configs hold P^T, dS^T in registers and run at 255, where it makes
 * BwdCompact<128> (sm_90a) and D = 64 (sm_80) spill. */
template <class Cfg, typename T>
__device__ __forceinline__ void load_query_tile(uint32_t tile, const T *gmem, int64_t row_stride,
                                                int valid_rows, int valid_cols, int tid) {
    using QTile = typename DkdvSmem<Cfg>::QTile;
    if constexpr (Cfg::kSplitD > 1)
        load_tile_rows_async<QTile, Cfg::kThreads, true>(tile, gmem, row_stride, valid_rows,
                                                         valid_cols, tid);
    else
        load_tile_async<QTile, Cfg::kThreads, true>(tile, gmem, row_stride, valid_rows,
                                                    valid_cols, tid);
}

/* Starts the async loads of one step: Q, dO rows q0.. of head h and their
 * lse_log2, dot (zero past the sequence end) into buffer buf. */
template <typename T, class Cfg>
__device__ __forceinline__ void load_query_step(const BwdArgs &args, const Geometry &geo,
                                                uint32_t smem, int h, int q0, int buf, int tid) {
    using L = DkdvSmem<Cfg>;
    using QTile = typename L::QTile;
    constexpr int BM = Cfg::kBlockM;
    const fat_params &p = args.p;
    const int rows = geo.seq.sq - q0;
    const T *q = static_cast<const T *>(p.q) + geo.q_offset(p.q_batch_stride, p.q_row_stride, q0) +
                 (int64_t)h * p.q_head_stride;
    const T *dout = static_cast<const T *>(p.dout) +
                    geo.q_offset(p.do_batch_stride, p.do_row_stride, q0) +
                    (int64_t)h * p.do_head_stride;
    const uint32_t q_tile = smem + L::kQ + buf * QTile::kBytes;
    const uint32_t dout_tile = smem + L::kDout + buf * QTile::kBytes;
    load_query_tile<Cfg>(q_tile, q, p.q_row_stride, rows, p.d, tid);
    load_query_tile<Cfg>(dout_tile, dout, p.do_row_stride, rows, p.d_v, tid);
    const int64_t stats = (int64_t)h * args.rows_q + geo.flat_q0 + q0;
    if (tid < 2 * BM) {
        const int i = tid % BM;
        const float *src = (tid < BM ? args.lse_log2 : args.dot) + stats;
        const uint32_t dst = smem + (tid < BM ? L::kLse : L::kDot) + 4 * (buf * BM + i);
        cp_async_4(dst, i < rows ? src + i : src, i < rows);
    }
}

/* acc[mt] (16 x 8 NTiles each) += dS K for the query rows m0 + 16 mt.. and
 * head-dim columns col0..: A = dS from the dS^T tile, B = K. */
template <typename T, class Cfg, int MTiles, int NTiles>
__device__ __forceinline__ void mma_dq(float (&acc)[MTiles][NTiles][4], uint32_t smem, int m0,
                                       int col0, int lane) {
    using L = DkdvSmem<Cfg>;
#pragma unroll
    for (int ks = 0; ks < Cfg::kBlockN / 16; ++ks) {
        uint32_t a[MTiles][4];
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt)
            load_a_trans<typename L::DsTile>(a[mt], smem + L::kDs, m0 + 16 * mt, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < NTiles / 2; ++np) {
            uint32_t b[4];
            load_b_kn<typename L::KvTile>(b, smem + L::kK, col0 + np * 16, ks * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MTiles; ++mt) {
                mma_16816<T>(acc[mt][2 * np], a[mt], b);
                mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
            }
        }
    }
}

/* dQ rows q0.. of head h += dS K (dS^T in shared memory), by atomicAdd:
 * whole C tiles by float4 atomics when the warp's rows are whole row groups
 * of dq_accum and all D columns are valid, element pairs otherwise. */
template <typename T, class Cfg>
__device__ __forceinline__ void dkdv_step_dq(const BwdArgs &args, const Geometry &geo,
                                             uint32_t smem, const DkdvWarp &w, int h, int q0) {
    constexpr int D = Cfg::D, MT = Cfg::kDqMTiles, NT = Cfg::kDqChunk / 8;
    const int64_t row0 = geo.flat_q0 + q0 + w.dq_row0;
    const int row_limit = geo.seq.sq - q0 - w.dq_row0;
    const bool whole = (row0 & 15) == 0 && row_limit >= 16 * MT && args.p.d == D;
    float *group_base =
        args.dq_accum + dq_accum_index<D>(args, row0 + (w.lane >> 2), h, 2 * (w.lane & 3));
#pragma unroll 1
    for (int c = 0; c < Cfg::kDqSpan / Cfg::kDqChunk; ++c) {
        const int col0 = w.dq_col0 + c * Cfg::kDqChunk;
        float acc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) zero_c(acc[mt]);
        mma_dq<T, Cfg>(acc, smem, w.dq_row0, col0, w.lane);
        if (whole) {
            dq_atomic_add_groups<D>(group_base, col0, acc);
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                dq_atomic_add_c<D>(args, h, row0 + 16 * mt, acc[mt], row_limit - 16 * mt, col0,
                                   args.p.d, w.lane);
        }
    }
}

/* dP^T = V dO^T into dp (key tile mt: rows keys key_row0 + 16 mt..,
 * columns queries s_col0..), before_kstep(ks) ahead of each k-step. */
template <typename T, class Cfg, class KstepWork>
__device__ __forceinline__ void dkdv_step_dp(uint32_t smem, uint32_t dout, const DkdvWarp &w,
                                             float (&dp)[Cfg::kKeyTiles][Cfg::kSTiles][4],
                                             const KstepWork &before_kstep) {
    using L = DkdvSmem<Cfg>;
#pragma unroll
    for (int mt = 0; mt < Cfg::kKeyTiles; ++mt) zero_c(dp[mt]);
    mma_keys_a_bt<T, typename L::KvTile, typename L::QTile, Cfg::D / 16>(
        dp, smem + L::kV, w.key_row0, dout, w.s_col0, w.lane, before_kstep);
}

/* P^T, dS^T of one step, unmasked, from S^T in s (tiles as in dkdv_step_dp):
 * GradMath::score_part, then (kOverlapScores) dP^T into dp, then
 * grad_part; without kOverlapScores the caller computed dp first.  Nothing
 * orders the score part and the GEMM but their registers, so ptxas can
 * issue the score part's exponentials between the GEMM's MMAs; the caller's
 * softcap branch surrounds the whole, so that it is one basic block each
 * way. */
template <typename T, class Cfg, bool kSoftcap>
__device__ __forceinline__ void dkdv_step_grads(
    const GradMath &m, uint32_t smem, uint32_t dout, const float *lse_log2, const float *dot,
    const DkdvWarp &w, float (&s)[Cfg::kKeyTiles][Cfg::kSTiles][4],
    float (&dp)[Cfg::kKeyTiles][Cfg::kSTiles][4]) {
    constexpr int kTiles = Cfg::kKeyTiles * Cfg::kSTiles, kSteps = Cfg::D / 16;
    /* the score part of n8 tile i (of kTiles) goes before k-step
     * i kSteps / kTiles of the GEMM, spreading the tiles over its k-steps */
    const auto score_slice = [&](int ks) {
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
            const int mt = i / Cfg::kSTiles, j = i % Cfg::kSTiles;
            if (i * kSteps / kTiles == ks)
                score_tile_by_column<kSoftcap>(s[mt][j], lse_log2, m, w.s_col0 + 8 * j, w.lane);
        }
    };
    if constexpr (Cfg::kOverlapScores) {
        dkdv_step_dp<T, Cfg>(smem, dout, w, dp, score_slice);
    } else {
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) score_slice(ks);
    }
#pragma unroll
    for (int mt = 0; mt < Cfg::kKeyTiles; ++mt)
        grads_by_column<kSoftcap>(s[mt], dp[mt], lse_log2, dot, m, w.s_col0, w.lane);
}

/* zero_masked for the MTiles x NTiles tiles of one dkdv_kernel warp
 * (kWarpMask): element e of n8 tile j of key tile mt is key key0 + 16 mt +
 * g + 8 (e / 2), query query0 + 8j + 2t + e % 2 (absolute indices).  The
 * warp decides for its whole tile: nothing where every element is visible,
 * zero_masked where the tile crosses a sequence end and some element is
 * visible.  Otherwise key - query = base + c with the per-thread base =
 * key0 + g - query0 - 2t and the compile-time c = 16 mt + 8 (e / 2) - 8j -
 * e % 2, visible iff c_min <= c <= c_max: c_max = hi - base where the
 * window's right side cuts the tile, c_min = lo - base where its left side
 * does (both then within the tile's diagonals, so they cannot overflow),
 * INT_MAX / INT_MIN otherwise, and c_max = INT_MIN where nothing is
 * visible.  (Zeroing the tile in a branch of its own spills on sm_90a;
 * tests of key0 - const rather than of diff0 against hi / lo spill 4 bytes
 * at D = 64 on sm_80, ptxas keeping key0 - const across the loop.) */
template <int MTiles, int NTiles>
__device__ __forceinline__ void zero_masked_warp_tile(float (&p)[MTiles][NTiles][4],
                                                      float (&ds)[MTiles][NTiles][4],
                                                      const Geometry &geo, int key0, int query0,
                                                      int lane) {
    constexpr int kKeys = 16 * MTiles, kQueries = 8 * NTiles;
    const int diff0 = key0 - query0; /* of element c = 0 */
    const bool cut_hi = diff0 > geo.hi - (kKeys - 1), cut_lo = diff0 < geo.lo + (kQueries - 1);
    const bool past_end = key0 > geo.seq.sk - kKeys || query0 > geo.seq.sq - kQueries;
    if (!cut_hi && !cut_lo && !past_end) return;
    const bool none_visible = key0 >= geo.seq.sk || query0 >= geo.seq.sq ||
                              diff0 - (kQueries - 1) > geo.hi || diff0 + (kKeys - 1) < geo.lo;
    if (past_end && !none_visible) {
#pragma unroll
        for (int mt = 0; mt < MTiles; ++mt)
            zero_masked(p[mt], ds[mt], geo, key0 + 16 * mt, query0, true, lane);
        return;
    }
    const int base = diff0 + (lane >> 2) - 2 * (lane & 3);
    const int c_max = none_visible ? INT_MIN : cut_hi ? geo.hi - base : INT_MAX;
    const int c_min = cut_lo && !none_visible ? geo.lo - base : INT_MIN;
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt)
#pragma unroll
        for (int j = 0; j < NTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 16 * mt + 8 * (e >> 1) - 8 * j - (e & 1);
                const bool vis = c >= c_min && c <= c_max;
                p[mt][j][e] = vis ? p[mt][j][e] : 0.f;
                ds[mt][j][e] = vis ? ds[mt][j][e] : 0.f;
            }
}

/* dkdv_step_grads' P^T, dS^T (keys k0 + key_row0 + 16 mt.., queries q0 +
 * s_col0..) masked and packed to T: where the CTA's block needs a mask,
 * each warp tile by zero_masked_warp_tile (kWarpMask) or each key tile by
 * zero_masked. */
template <typename T, class Cfg>
__device__ __forceinline__ void dkdv_step_pack(
    const Geometry &geo, const DkdvWarp &w, int k0, int q0,
    float (&s)[Cfg::kKeyTiles][Cfg::kSTiles][4], float (&dp)[Cfg::kKeyTiles][Cfg::kSTiles][4],
    uint32_t (&p_packed)[Cfg::kKeyTiles][Cfg::kSTiles][2],
    uint32_t (&ds_packed)[Cfg::kKeyTiles][Cfg::kSTiles][2]) {
    const bool masked = geo.tile_needs_mask(k0, Cfg::kBlockN, q0, Cfg::kBlockM);
    if (Cfg::kWarpMask && masked)
        zero_masked_warp_tile(s, dp, geo, k0 + w.key_row0, q0 + w.s_col0, w.lane);
#pragma unroll
    for (int mt = 0; mt < Cfg::kKeyTiles; ++mt) {
        if (!Cfg::kWarpMask && masked)
            zero_masked(s[mt], dp[mt], geo, k0 + w.key_row0 + 16 * mt, q0 + w.s_col0, true,
                        w.lane);
        pack_c<T>(p_packed[mt], s[mt]);
        pack_c<T>(ds_packed[mt], dp[mt]);
    }
}

/* One step of dkdv_kernel: query rows q0.. of head h against the key block
 * k0.. (buffer buf holds their Q, dO, lse_log2, dot). */
template <typename T, class Cfg>
__device__ __forceinline__ void dkdv_step(const BwdArgs &args, const Geometry &geo,
                                          uint32_t smem, const float *smem_f32,
                                          const DkdvWarp &w, int h, int k0, int q0, int buf,
                                          float (&dk)[Cfg::kKeyTiles][Cfg::kKvTiles][4],
                                          float (&dv)[Cfg::kKeyTiles][Cfg::kKvTiles][4]) {
    using L = DkdvSmem<Cfg>;
    using KvTile = typename L::KvTile;
    using QTile = typename L::QTile;
    using DsTile = typename L::DsTile;
    constexpr int D = Cfg::D, BM = Cfg::kBlockM, ST = Cfg::kSTiles, MT = Cfg::kKeyTiles;
    const uint32_t q = smem + L::kQ + buf * QTile::kBytes;
    const uint32_t dout = smem + L::kDout + buf * QTile::kBytes;
    const bool with_dq = !args.p.deterministic;

    uint32_t p_packed[MT][ST][2], ds_packed[MT][ST][2];
    {
        float s[MT][ST][4], dp[MT][ST][4];
        if constexpr (!Cfg::kOverlapScores)
            dkdv_step_dp<T, Cfg>(smem, dout, w, dp, NoKstepWork{});
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) zero_c(s[mt]);
        mma_keys_a_bt<T, KvTile, QTile, D / 16>(s, smem + L::kK, w.key_row0, q, w.s_col0,
                                                w.lane);
        const GradMath m = make_grad_math(args);
        const float *lse_log2 = smem_f32 + L::kLse / 4 + buf * BM;
        const float *dot = smem_f32 + L::kDot / 4 + buf * BM;
        if (args.softcap)
            dkdv_step_grads<T, Cfg, true>(m, smem, dout, lse_log2, dot, w, s, dp);
        else
            dkdv_step_grads<T, Cfg, false>(m, smem, dout, lse_log2, dot, w, s, dp);
        dkdv_step_pack<T, Cfg>(geo, w, k0, q0, s, dp, p_packed, ds_packed);
    }
    if constexpr (Cfg::kSplitD == 1) {
        if (with_dq)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                store_packed_to_smem<DsTile>(smem + L::kDs, ds_packed[mt], w.key_row0 + 16 * mt,
                                             w.s_col0, w.lane);
        mma_keys_a_b<T, QTile, BM / 16>(dv, KeysRegisterA<MT, ST>{p_packed}, dout, w.kv_col0,
                                        w.lane);
        mma_keys_a_b<T, QTile, BM / 16>(dk, KeysRegisterA<MT, ST>{ds_packed}, q, w.kv_col0,
                                        w.lane);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            store_packed_to_smem<DsTile>(smem + L::kP, p_packed[mt], w.key_row0 + 16 * mt,
                                         w.s_col0, w.lane);
            store_packed_to_smem<DsTile>(smem + L::kDs, ds_packed[mt], w.key_row0 + 16 * mt,
                                         w.s_col0, w.lane);
        }
        /* P^T, dS^T of every warp; the next step overwrites them only after
         * dkdv_kernel's barrier at its top */
        __syncthreads();
        const KeysSharedA<DsTile> pt = {smem + L::kP, w.key_row0, w.lane};
        const KeysSharedA<DsTile> dst = {smem + L::kDs, w.key_row0, w.lane};
        mma_keys_a_b<T, QTile, BM / 16>(dv, pt, dout, w.kv_col0, w.lane);
        if (with_dq) dkdv_step_dq<T, Cfg>(args, geo, smem, w, h, q0);
        mma_keys_a_b<T, QTile, BM / 16>(dk, dst, q, w.kv_col0, w.lane);
    }
    if (Cfg::kSplitD == 1 && with_dq) {
        __syncthreads(); /* dS^T of every warp */
        dkdv_step_dq<T, Cfg>(args, geo, smem, w, h, q0);
    }
}

/* The (head, query block) sequence of dkdv_kernel's steps: every query head
 * of the kv head's group, each over the query blocks that see the key block. */
struct StepCursor {
    int h, qb;
    __device__ __forceinline__ void advance(const BlockRange &blocks) {
        if (++qb == blocks.first + blocks.count) {
            qb = blocks.first;
            ++h;
        }
    }
};

/* dK, dV of key block k_block of kv head hk, sequence b; dkdv_smem: the
 * kernel's dynamic shared memory. */
template <typename T, class Cfg>
__device__ __forceinline__ void dkdv_key_block(const BwdArgs &args, unsigned char *dkdv_smem,
                                               int k_block, int hk, int b) {
    using L = DkdvSmem<Cfg>;
    using KvTile = typename L::KvTile;
    constexpr int BN = Cfg::kBlockN, BM = Cfg::kBlockM, KT = Cfg::kKvTiles, MT = Cfg::kKeyTiles;
    const fat_params &p = args.p;
    const uint32_t smem = smem_u32(dkdv_smem);
    const float *smem_f32 = reinterpret_cast<const float *>(dkdv_smem);

    const Geometry geo = make_geometry(args, b);
    const int k0 = k_block * BN;
    if (k0 >= geo.seq.sk) return;

    const int tid = threadIdx.x;
    const DkdvWarp w = make_dkdv_warp<Cfg>(tid / 32, tid % 32);
    const int group = p.hq / p.hkv;
    const BlockRange blocks = query_blocks_seeing(geo, k0, BN, BM);
    const int steps = group * blocks.count;

    float dk[MT][KT][4], dv[MT][KT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        zero_c(dk[mt]);
        zero_c(dv[mt]);
    }
    StepCursor cur = {hk * group, blocks.first};
    if (steps > 0) {
        const int rows = geo.seq.sk - k0;
        const T *k = static_cast<const T *>(p.k) +
                     geo.k_offset(p.k_batch_stride, p.k_row_stride, k0) +
                     (int64_t)hk * p.k_head_stride;
        const T *v = static_cast<const T *>(p.v) +
                     geo.k_offset(p.v_batch_stride, p.v_row_stride, k0) +
                     (int64_t)hk * p.v_head_stride;
        load_tile_async<KvTile, Cfg::kThreads, true>(smem + L::kK, k, p.k_row_stride, rows, p.d,
                                                     tid);
        load_tile_async<KvTile, Cfg::kThreads, true>(smem + L::kV, v, p.v_row_stride, rows,
                                                     p.d_v, tid);
        if (Cfg::kStages == 2)
            load_query_step<T, Cfg>(args, geo, smem, cur.h, cur.qb * BM, 0, tid);
        cp_async_commit();
    }
#pragma unroll 1
    for (int step = 0; step < steps; ++step) {
        if (Cfg::kStages == 1) {
            __syncthreads(); /* every warp is done with the previous step's tiles */
            load_query_step<T, Cfg>(args, geo, smem, cur.h, cur.qb * BM, 0, tid);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads(); /* this step's tiles landed; the previous step is done */
        StepCursor next = cur;
        next.advance(blocks);
        if (Cfg::kStages == 2 && step + 1 < steps) {
            load_query_step<T, Cfg>(args, geo, smem, next.h, next.qb * BM, (step + 1) % 2, tid);
            cp_async_commit();
        }
        dkdv_step<T, Cfg>(args, geo, smem, smem_f32, w, cur.h, k0, cur.qb * BM,
                          step % Cfg::kStages, dk, dv);
        cur = next;
    }

    T *dk_out = static_cast<T *>(p.dk) + geo.k_offset(p.dk_batch_stride, p.dk_row_stride, k0) +
                (int64_t)hk * p.dk_head_stride;
    T *dv_out = static_cast<T *>(p.dv) + geo.k_offset(p.dv_batch_stride, p.dv_row_stride, k0) +
                (int64_t)hk * p.dv_head_stride;
    const int key_limit = geo.seq.sk - k0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        store_c_to_global(dk_out, p.dk_row_stride, dk[mt], w.key_row0 + 16 * mt, key_limit,
                          w.kv_col0, p.d, args.scale, w.lane);
        store_c_to_global(dv_out, p.dv_row_stride, dv[mt], w.key_row0 + 16 * mt, key_limit,
                          w.kv_col0, p.d_v, 1.f, w.lane);
    }
}

/* The (key block, kv head, sequence) of part 0 or 1 of this CTA's job; a
 * negative key block when the job has no such part.  One CTA per (job, kv
 * head, sequence), job fastest in blockIdx.x.  A job is key block j; with
 * kPairs and BwdArgs::paired, key block j (the heavier) and then key block
 * num_k_blocks - 1 - j.  blockIdx is read through a volatile asm so that
 * part 1 recomputes these values instead of holding them across part 0. */
struct KeyBlockJob {
    int k_block, hk, b;
};
template <class Cfg> __device__ __forceinline__ KeyBlockJob key_block_job(const BwdArgs &args, int part) {
    const fat_params &p = args.p;
    const int num_k_blocks = (p.sk + Cfg::kBlockN - 1) / Cfg::kBlockN;
    const bool paired = Cfg::kPairs && args.paired;
    const int jobs = paired ? (num_k_blocks + 1) / 2 : num_k_blocks;
    int bid;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(bid));
    const int job = bid % jobs, mirror = num_k_blocks - 1 - job;
    KeyBlockJob j;
    j.k_block = part == 0 ? job : paired && mirror > job ? mirror : -1;
    j.hk = (bid / jobs) % p.hkv;
    j.b = bid / jobs / p.hkv;
    return j;
}

template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) dkdv_kernel(const BwdArgs args) {
    extern __shared__ __align__(16) unsigned char dkdv_smem[];
#pragma unroll 1
    for (int part = 0; part < (Cfg::kPairs ? 2 : 1); ++part) {
        const KeyBlockJob j = key_block_job<Cfg>(args, part);
        if (j.k_block < 0) break;
        if (part > 0) __syncthreads(); /* every warp is done with the first block's tiles */
        dkdv_key_block<T, Cfg>(args, dkdv_smem, j.k_block, j.hk, j.b);
    }
}

/* ---- 3b. deterministic dQ: one query block, key blocks in order ------------ */

/* Starts the async loads of K, V rows k0.. of kv head hk into buffer buf. */
template <typename T, class Cfg>
__device__ __forceinline__ void load_key_block(const fat_params &p, const Geometry &geo,
                                               uint32_t smem, int hk, int k0, int buf, int tid) {
    using L = DqSmem<Cfg>;
    const int rows = geo.seq.sk - k0;
    const T *k = static_cast<const T *>(p.k) + geo.k_offset(p.k_batch_stride, p.k_row_stride, k0) +
                 (int64_t)hk * p.k_head_stride;
    const T *v = static_cast<const T *>(p.v) + geo.k_offset(p.v_batch_stride, p.v_row_stride, k0) +
                 (int64_t)hk * p.v_head_stride;
    const uint32_t k_tile = smem + L::kK + buf * L::KvTile::kBytes;
    const uint32_t v_tile = smem + L::kV + buf * L::KvTile::kBytes;
    using KvTile = typename L::KvTile;
    load_tile_async<KvTile, Cfg::kQThreads, true>(k_tile, k, p.k_row_stride, rows, p.d, tid);
    load_tile_async<KvTile, Cfg::kQThreads, true>(v_tile, v, p.v_row_stride, rows, p.d_v, tid);
}

/* One CTA per (query block, query head, batch), query block fastest. */
template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kQThreads, 1) dq_kernel(const BwdArgs args) {
    constexpr int D = Cfg::D;
    using L = DqSmem<Cfg>;
    using QTile = typename L::QTile;
    using KvTile = typename L::KvTile;
    constexpr int BM = Cfg::kQBlockM, BN = Cfg::kQBlockN, ST = BN / 8, DT = D / 8;
    const fat_params &p = args.p;
    extern __shared__ __align__(16) unsigned char dq_smem[];
    const uint32_t smem = smem_u32(dq_smem);

    const int num_q_blocks = (p.sq + BM - 1) / BM;
    const int q0 = (blockIdx.x % num_q_blocks) * BM;
    const int h = (blockIdx.x / num_q_blocks) % p.hq;
    const int b = blockIdx.x / num_q_blocks / p.hq;
    const Geometry geo = make_geometry(args, b);
    if (q0 >= geo.seq.sq) return;
    const int hk = h / (p.hq / p.hkv);

    const int tid = threadIdx.x, lane = tid % 32, row0 = 16 * (tid / 32);
    const int query = q0 + row0; /* absolute row of fragment row g = 0 */
    float lse[2], dot[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int i = query + lane / 4 + 8 * half;
        const int64_t idx = (int64_t)h * args.rows_q + geo.flat_q0 + i;
        lse[half] = i < geo.seq.sq ? args.lse_log2[idx] : INFINITY;
        dot[half] = i < geo.seq.sq ? args.dot[idx] : 0.f;
    }

    const BlockRange blocks = key_blocks_seen(geo, q0, BM, BN);
    float dq[DT][4];
    zero_c(dq);
    if (blocks.count > 0) {
        const int rows = geo.seq.sq - q0;
        const T *q = static_cast<const T *>(p.q) +
                     geo.q_offset(p.q_batch_stride, p.q_row_stride, q0) +
                     (int64_t)h * p.q_head_stride;
        const T *dout = static_cast<const T *>(p.dout) +
                        geo.q_offset(p.do_batch_stride, p.do_row_stride, q0) +
                        (int64_t)h * p.do_head_stride;
        load_tile_async<QTile, Cfg::kQThreads, true>(smem + L::kQ, q, p.q_row_stride, rows, p.d,
                                                     tid);
        load_tile_async<QTile, Cfg::kQThreads, true>(smem + L::kDout, dout, p.do_row_stride,
                                                     rows, p.d_v, tid);
        if (Cfg::kQStages == 2) load_key_block<T, Cfg>(p, geo, smem, hk, blocks.first * BN, 0, tid);
        cp_async_commit();
    }
    const GradMath math = make_grad_math(args);
#pragma unroll 1
    for (int it = 0; it < blocks.count; ++it) {
        const int k0 = (blocks.first + it) * BN;
        const int buf = it % Cfg::kQStages;
        if (Cfg::kQStages == 1) {
            __syncthreads(); /* every warp is done with the previous K, V */
            load_key_block<T, Cfg>(p, geo, smem, hk, k0, 0, tid);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads(); /* K, V of this block landed; the previous block is done */
        if (Cfg::kQStages == 2 && it + 1 < blocks.count) {
            load_key_block<T, Cfg>(p, geo, smem, hk, k0 + BN, (it + 1) % 2, tid);
            cp_async_commit();
        }
        const uint32_t k = smem + L::kK + buf * KvTile::kBytes;
        const uint32_t v = smem + L::kV + buf * KvTile::kBytes;
        uint32_t ds_packed[ST][2];
        {
            float s[ST][4], dp[ST][4];
            zero_c(dp);
            mma_a_bt<T, QTile, KvTile, D / 16>(dp, smem + L::kDout, row0, v, 0, lane);
            zero_c(s);
            mma_a_bt<T, QTile, KvTile, D / 16>(s, smem + L::kQ, row0, k, 0, lane);
            if (args.softcap)
                grads_by_row<true>(s, dp, lse, dot, math);
            else
                grads_by_row<false>(s, dp, lse, dot, math);
            if (geo.tile_needs_mask(k0, BN, q0, BM))
                zero_masked(s, dp, geo, query, k0, false, lane);
            pack_c<T>(ds_packed, dp);
        }
        mma_a_b<T, KvTile, BN / 16>(dq, RegisterA<ST>{ds_packed}, k, 0, lane);
    }

    T *dq_out = static_cast<T *>(p.dq) + geo.q_offset(p.dq_batch_stride, p.dq_row_stride, q0) +
                (int64_t)h * p.dq_head_stride;
    store_c_to_global(dq_out, p.dq_row_stride, dq, row0, geo.seq.sq - q0, 0, p.d, args.scale,
                      lane);
}

/* ---- launcher ---------------------------------------------------------------- */

inline fat_status launch_status() {
    return cudaGetLastError() == cudaSuccess ? FAT_OK : FAT_ERR_CUDA;
}

inline unsigned ceil_div(int64_t n, int64_t d) { return (unsigned)((n + d - 1) / d); }

/* Whether dkdv_kernel<T, Cfg> (Cfg::kPairs) runs p's grid in pairs and that
 * finishes sooner than one key block per CTA: a key block costs its query
 * blocks (max seqlens) plus two for its prologue and epilogue.  False where
 * the device cannot run or describe the kernel (the launch reports it). */
template <typename T, class Cfg> bool bwd_pairs_sooner(const fat_params &p) {
    const BwdArgs args = tile_args<Cfg>(p);
    int dev = 0, sms = 0, per_sm = 0;
    if (!args.paired || allow_smem(dkdv_kernel<T, Cfg>, DkdvSmem<Cfg>::kBytes) != FAT_OK ||
        cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dkdv_kernel<T, Cfg>, Cfg::kThreads,
                                                      DkdvSmem<Cfg>::kBytes) != cudaSuccess ||
        per_sm < 1)
        return false;
    const int64_t shift = (int64_t)p.sk - p.sq + args.window_right;
    auto cost = [&](int k_block) {
        const int64_t first_row = std::max<int64_t>(0, (int64_t)k_block * Cfg::kBlockN - shift);
        const int64_t rows = std::max<int64_t>(0, p.sq - first_row);
        return 2.0 + (double)((rows + Cfg::kBlockM - 1) / Cfg::kBlockM);
    };
    const int n = (int)ceil_div(p.sk, Cfg::kBlockN);
    return pairs_finish_sooner(cost, n, (int64_t)p.hkv * p.b, sms * per_sm);
}

} /* namespace bwd80 */

/* The backward with tile configuration Cfg (a BwdTiles; dev/sm80_bwd_bench.cu
 * times variants). */
template <typename T, class Cfg>
fat_status sm80_bwd_tiles(const fat_params &p, cudaStream_t stream) {
    using namespace bwd80;
    constexpr int D = Cfg::D;
    if (p.workspace == nullptr || p.workspace_bytes < sm80_bwd_workspace_bytes(p, D))
        return FAT_ERR_INVALID_ARGUMENT;
    const BwdArgs args = tile_args<Cfg>(p);
    const int64_t row_ctas = row_kernel_ctas<D>(args);
    const int64_t kv_blocks = dkdv_ctas<Cfg>(args);
    const int64_t q_blocks = (int64_t)ceil_div(p.sq, Cfg::kQBlockM) * p.hq * p.b;
    if (row_ctas > INT_MAX || kv_blocks > INT_MAX || q_blocks > INT_MAX)
        return FAT_ERR_UNSUPPORTED;
    fat_status st = allow_smem(dkdv_kernel<T, Cfg>, DkdvSmem<Cfg>::kBytes);
    if (st == FAT_OK && p.deterministic) st = allow_smem(dq_kernel<T, Cfg>, DqSmem<Cfg>::kBytes);
    if (st != FAT_OK) return st;

    if (row_ctas > 0) {
        bwd_prep_kernel<T, D><<<(unsigned)row_ctas, kRowThreads, 0, stream>>>(args);
        if ((st = launch_status()) != FAT_OK) return st;
    }
    if (kv_blocks > 0) {
        dkdv_kernel<T, Cfg>
            <<<(unsigned)kv_blocks, Cfg::kThreads, DkdvSmem<Cfg>::kBytes, stream>>>(args);
        if ((st = launch_status()) != FAT_OK) return st;
    }
    if (p.deterministic) {
        if (q_blocks > 0)
            dq_kernel<T, Cfg>
                <<<(unsigned)q_blocks, Cfg::kQThreads, DqSmem<Cfg>::kBytes, stream>>>(args);
    } else if (row_ctas > 0) {
        bwd_dq_convert_kernel<T, D><<<(unsigned)row_ctas, kRowThreads, 0, stream>>>(args);
    }
    return launch_status();
}

/* BwdConfig<D>; where the device cannot run it (sm80_bwd_tiles answers
 * unsupported before launching anything), BwdCompact<D>. */
template <typename T, int D> fat_status sm80_bwd(const fat_params &p, cudaStream_t stream) {
    using Fast = bwd80::BwdConfig<D>;
    using Compact = typename bwd80::BwdCompact<D>::type;
    if constexpr (bwd80::bwd_may_pair(D)) {
        using Pairs = bwd80::BwdConfig<D, true>;
        if (bwd80::bwd_pairs_sooner<T, Pairs>(p)) return sm80_bwd_tiles<T, Pairs>(p, stream);
    }
    const fat_status st = sm80_bwd_tiles<T, Fast>(p, stream);
    if constexpr (!std::is_same<Fast, Compact>::value)
        if (st == FAT_ERR_UNSUPPORTED) return sm80_bwd_tiles<T, Compact>(p, stream);
    return st;
}

} /* namespace fat */
