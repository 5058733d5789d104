/*
 * fat_sm80_primitives.cuh - the tensor-core building blocks shared by the
 * sm80 forward and backward kernels (Ampere and newer; mma.sync only).
 *
 *  - cp.async 16-byte global->shared copies with zero fill, commit/wait;
 *  - a swizzled shared-memory tile layout (Rows x Cols elements of 2 bytes):
 *    columns are split into panels of 64 elements (128 bytes) when Cols is a
 *    multiple of 64, else 32 (64 bytes); inside a panel, rows are contiguous
 *    and byte-offset bits 4..6 are XORed with bits 7..9 (the "128B" swizzle),
 *    so 8 rows read at one 16-byte column by ldmatrix hit 8 distinct bank
 *    groups and a 16-byte chunk never straddles;
 *  - ldmatrix loaders producing m16n8k16 A and B fragments from such tiles;
 *  - mma.sync m16n8k16 with fp32 accumulation, fp16 or bf16 inputs;
 *  - (host) allow_smem: a kernel's dynamic shared memory where the device
 *    has it;
 *  - (host) pairs_finish_sooner: whether a causal grid runs its blocks one
 *    per CTA or in mirrored pairs.
 *
 * Fragment layouts (lane = 4 * g + t):
 *   A 16x16 (row major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..),
 *                        a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
 *   B 16x8  (k x n):     b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
 *   C 16x8  (fp32):      c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..)
 * A C tile pair (two adjacent n8 tiles) converted to 2-byte pairs is exactly
 * an A fragment over k16: that is how P and dS feed the next GEMM.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "flash_attn_t.h"

namespace fat {

/* ---- element types ---------------------------------------------------- */

template <typename T> struct elem;
template <> struct elem<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <> struct elem<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

/* ---- cp.async --------------------------------------------------------- */

/* Copies 16 bytes, or writes 16 zero bytes when !valid (src is not read). */
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void *gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr),
                 "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* ---- swizzled tile layout --------------------------------------------- */

template <int Rows, int Cols> struct SmemTile {
    static_assert(Cols % 32 == 0, "tile columns are whole 32-element panels");
    static_assert(Rows % 16 == 0, "tile rows are whole 16-row groups");
    static constexpr int kRows = Rows, kCols = Cols;
    static constexpr int kPanel = (Cols % 64 == 0) ? 64 : 32; /* elements */
    static constexpr int kRowBytes = kPanel * 2;
    static constexpr int kPanelBytes = Rows * kRowBytes;
    static constexpr int kBytes = Rows * Cols * 2;
    /* byte offset of element (row, col); col a multiple of 8 for 16B access */
    static __device__ __forceinline__ uint32_t offset(int row, int col) {
        const uint32_t lin = (uint32_t)((col / kPanel) * kPanelBytes + row * kRowBytes +
                                        (col % kPanel) * 2);
        return lin ^ ((lin >> 3) & 0x70u);
    }
    /* The same offset for row = row0 + lane_row, col = col0 + lane_col with
     * row0, col0 multiples of 16 and lane_row < 16, lane_col in {0, 8}:
     * split so the lane part is computed once per kernel and each fragment
     * address costs one XOR and one add of warp-uniform values. */
    static __device__ __forceinline__ uint32_t lane_bits(int lane_row, int lane_col) {
        const uint32_t lin = (uint32_t)(lane_row * kRowBytes + lane_col * 2);
        return lin ^ ((lin >> 3) & 0x70u);
    }
    static __device__ __forceinline__ uint32_t frag_offset(int row0, int col0, uint32_t lane) {
        return (uint32_t)((col0 / kPanel) * kPanelBytes + row0 * kRowBytes) +
               (lane ^ (uint32_t)((col0 % kPanel) * 2));
    }
};

/* Rows x Cols 2-byte elements with rows 2 Cols + 16 bytes apart: the 16 pad
 * bytes put the 8 row addresses of an ldmatrix on distinct bank groups, and
 * every fragment address is a per-lane base plus a compile-time offset (the
 * XOR swizzle of SmemTile needs a register per column offset, which spills
 * at the sm80 kernels' tile sizes).  Same interface as SmemTile. */
template <int Rows, int Cols> struct PaddedTile {
    static_assert(Rows % 16 == 0 && Cols % 16 == 0, "whole 16 x 16 fragments");
    static constexpr int kRows = Rows, kCols = Cols;
    static constexpr int kRowBytes = 2 * Cols + 16;
    static constexpr int kBytes = Rows * kRowBytes;
    static __device__ __forceinline__ uint32_t offset(int row, int col) {
        return (uint32_t)(row * kRowBytes + col * 2);
    }
    static __device__ __forceinline__ uint32_t lane_bits(int lane_row, int lane_col) {
        return offset(lane_row, lane_col);
    }
    static __device__ __forceinline__ uint32_t frag_offset(int row0, int col0, uint32_t lane) {
        return offset(row0, col0) + lane;
    }
};

/* Async copy of a Tile::kRows x Tile::kCols tile from global (row stride in
 * elements) into a SmemTile or PaddedTile at smem_base. Rows >= valid_rows
 * and columns >= valid_cols (a multiple of 8) are zero filled. All NThreads
 * threads take part.  Not unrolled unless kUnrolled: an unrolled copy can
 * keep every chunk's addresses live across its caller's main loop (spills in
 * the forward at D = 128), a rolled one costs the backward's dkdv_kernel a
 * few registers that spill at D = 128 on sm_80. */
template <class Tile, int NThreads, bool kUnrolled = false, typename T>
__device__ __forceinline__ void load_tile_async(uint32_t smem_base, const T *gmem,
                                                int64_t row_stride, int valid_rows,
                                                int valid_cols, int tid) {
    constexpr int kChunksPerRow = Tile::kCols / 8;
    constexpr int kChunks = Tile::kRows * kChunksPerRow;
    constexpr int kIters = (kChunks + NThreads - 1) / NThreads;
    constexpr int kUnroll = kUnrolled ? kIters : 1;
#pragma unroll kUnroll
    for (int it = 0; it < kIters; ++it) {
        const int i = tid + it * NThreads;
        if (kChunks % NThreads != 0 && i >= kChunks) break;
        const int row = i / kChunksPerRow;
        const int col = (i % kChunksPerRow) * 8;
        const bool valid = row < valid_rows && col < valid_cols;
        const T *src = valid ? gmem + (int64_t)row * row_stride + col : gmem;
        cp_async_16(smem_base + Tile::offset(row, col), src, valid);
    }
}

/* load_tile_async for tiles whose 16-byte chunks divide evenly among the
 * threads (one chunk column per thread): each thread walks down its column
 * with one pointer, a few instructions per chunk instead of the index and
 * 64-bit address arithmetic of every chunk (a third of the loop's
 * instructions at D = 128 when K and V were loaded that way).  Other tiles
 * go to load_tile_async (kUnrolled passed on). */
template <class Tile, int NThreads, bool kUnrolled = false, typename T>
__device__ __forceinline__ void load_tile_rows_async(uint32_t smem_base, const T *gmem,
                                                     int64_t row_stride, int valid_rows,
                                                     int valid_cols, int tid) {
    constexpr int kChunksPerRow = Tile::kCols / 8;
    if constexpr (NThreads % kChunksPerRow != 0 ||
                  Tile::kRows % (NThreads / kChunksPerRow) != 0) {
        load_tile_async<Tile, NThreads, kUnrolled>(smem_base, gmem, row_stride, valid_rows,
                                                   valid_cols, tid);
    } else {
        constexpr int kRowsPerPass = NThreads / kChunksPerRow;
        /* tid re-read here (volatile): the per-thread address is rebuilt in
         * a few instructions rather than hoisted and held across the
         * caller's loop in registers */
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
        const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
        const T *src = gmem + row * row_stride + col;
        const int64_t step = kRowsPerPass * row_stride;
        if (valid_rows >= Tile::kRows && valid_cols >= Tile::kCols) { /* the common case */
#pragma unroll
            for (int r = 0; r < Tile::kRows; r += kRowsPerPass, src += step)
                cp_async_16(smem_base + Tile::offset(row + r, col), src, true);
            return;
        }
        const bool col_ok = col < valid_cols;
#pragma unroll 1
        for (int r = 0; r < Tile::kRows; r += kRowsPerPass, src += step) {
            const bool valid = col_ok && row + r < valid_rows;
            cp_async_16(smem_base + Tile::offset(row + r, col), valid ? src : gmem, valid);
        }
    }
}

/* ---- ldmatrix fragment loaders (all 32 lanes of a warp take part) ------ */

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Fragment loaders: m0, n0, k0 are multiples of 16 (see lane_bits). */

/* A fragment (16 x 16) of a tile stored [m][k], rows m0.., cols k0.. */
template <class Tile>
__device__ __forceinline__ void load_a(uint32_t a[4], uint32_t base, int m0, int k0, int lane) {
    const uint32_t lb = Tile::lane_bits(lane & 15, (lane >> 4) * 8);
    ldmatrix_x4(a, base + Tile::frag_offset(m0, k0, lb));
}
/* A fragment (16 x 16) of A = S^T where the tile stores S as [k][m]. */
template <class Tile>
__device__ __forceinline__ void load_a_trans(uint32_t a[4], uint32_t base, int m0, int k0,
                                             int lane) {
    const int idx = lane >> 3;
    const uint32_t lb = Tile::lane_bits((idx >> 1) * 8 + (lane & 7), (idx & 1) * 8);
    ldmatrix_x4_trans(a, base + Tile::frag_offset(k0, m0, lb));
}
/* B fragments of two adjacent n8 tiles (n0..n0+15, k0..k0+15) of a tile
 * stored [n][k] (e.g. K for S = Q K^T): b[0..1] tile n0, b[2..3] tile n0+8. */
template <class Tile>
__device__ __forceinline__ void load_b_nk(uint32_t b[4], uint32_t base, int n0, int k0, int lane) {
    const int idx = lane >> 3;
    const uint32_t lb = Tile::lane_bits((idx >> 1) * 8 + (lane & 7), (idx & 1) * 8);
    ldmatrix_x4(b, base + Tile::frag_offset(n0, k0, lb));
}
/* The same two B fragments from a tile stored [k][n] (e.g. V for O = P V). */
template <class Tile>
__device__ __forceinline__ void load_b_kn(uint32_t b[4], uint32_t base, int n0, int k0, int lane) {
    const int idx = lane >> 3;
    const uint32_t lb = Tile::lane_bits((idx & 1) * 8 + (lane & 7), (idx >> 1) * 8);
    ldmatrix_x4_trans(b, base + Tile::frag_offset(k0, n0, lb));
}

/* ---- mma.sync m16n8k16, fp32 accumulate: c += a * b ------------------- */

template <typename T> __device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <> __device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A fragment over k16 from two adjacent fp32 C tiles (cols 0-7 and 8-15). */
template <typename T>
__device__ __forceinline__ void c_pair_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = elem<T>::pack(c0[0], c0[1]);
    a[1] = elem<T>::pack(c0[2], c0[3]);
    a[2] = elem<T>::pack(c1[0], c1[1]);
    a[3] = elem<T>::pack(c1[2], c1[3]);
}

/* ---- softmax helpers ---------------------------------------------------- */

/* Reduce over the 4 lanes of a quad (the lanes that share an accumulator row). */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Per-sequence geometry shared by forward and backward (dense or varlen). */
struct SeqInfo {
    int64_t q_start, k_start; /* first row of this sequence in q / k */
    int sq, sk;               /* its lengths */
};
__device__ __forceinline__ SeqInfo seq_info(const int32_t *cu_q, const int32_t *cu_k, int b,
                                            int sq, int sk) {
    SeqInfo s;
    if (cu_q) {
        s.q_start = cu_q[b];
        s.k_start = cu_k[b];
        s.sq = cu_q[b + 1] - cu_q[b];
        s.sk = cu_k[b + 1] - cu_k[b];
    } else {
        s.q_start = 0;
        s.k_start = 0;
        s.sq = sq;
        s.sk = sk;
    }
    return s;
}

/* ---- shared memory per block (host) -------------------------------------- */

inline int smem_optin_limit() {
    int dev = 0, limit = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess)
        return -1;
    return limit;
}

/* Lets kernel use bytes of dynamic shared memory: unsupported when the
 * device has fewer. */
template <class Kernel> fat_status allow_smem(Kernel kernel, int bytes) {
    const int limit = smem_optin_limit();
    if (limit < 0) return FAT_ERR_CUDA;
    if (bytes > limit) return FAT_ERR_UNSUPPORTED;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
                   cudaSuccess
               ? FAT_OK
               : FAT_ERR_CUDA;
}

/* ---- causal block order (host) ------------------------------------------ */

/* Where the work of a head's block shrinks with its index j = 0..n-1
 * (causal), a kernel runs the blocks one per CTA, heaviest first, or in
 * pairs: CTA j runs blocks j and n-1-j, so every CTA has about the same work
 * and there are half as many.  Pairs even out the end of a grid several waves
 * long (in block order the heaviest blocks of the last heads start last and
 * run alone); single blocks fill a device that half as many CTAs would leave
 * partly idle.  pairs_finish_sooner compares the modelled run times of the
 * two grids, both launched head by head, on `slots` CTA slots (SMs x CTAs
 * per SM): the pairs' exactly (equal jobs fill whole waves), the single
 * blocks' by a fluid estimate of list scheduling (each CTA starts when a slot
 * frees up): CTA i starts at (work launched before it - kInflightShare x the
 * work of the `slots` CTAs before it) / slots.  Over causal grids of 1-1024
 * heads x 2-256 blocks on 132 and 264 slots this choice runs within 3 % of
 * the better order by exact list scheduling (benchmarks/NOTES.md "causal
 * pairs").  cost(j): the time of block j; copies: heads x sequences.  O(n). */
constexpr double kInflightShare = 0.7;

template <class Cost> struct CostPrefix { /* sum of the costs of CTAs 0..m-1 */
    const Cost &cost;
    int n;
    int64_t m;
    double sum;
    CostPrefix(const Cost &c, int n_, double head, int64_t m_) : cost(c), n(n_), m(m_), sum(0) {
        if (m <= 0) return;
        sum = (double)(m / n) * head;
        for (int j = 0; j < m % n; ++j) sum += cost(j);
    }
    void advance() {
        if (m >= 0) sum += cost((int)(m % n));
        ++m;
    }
};

template <class Cost> inline bool pairs_finish_sooner(const Cost &cost, int n, int64_t copies, int slots) {
    if (n < 2 || copies < 1 || slots < 1) return false;
    double head = 0, pair_max = 0;
    for (int j = 0; j < n; ++j) head += cost(j);
    for (int j = 0; j < (n + 1) / 2; ++j) {
        const double pair = cost(j) + (n - 1 - j > j ? cost(n - 1 - j) : 0.0);
        pair_max = pair > pair_max ? pair : pair_max;
    }
    const int64_t pair_ctas = (int64_t)((n + 1) / 2) * copies;
    const double paired = (double)((pair_ctas + slots - 1) / slots) * pair_max;
    /* single blocks: the last CTAs to end are among the last two heads' */
    const int64_t first = (copies > 1 ? copies - 2 : 0) * n;
    CostPrefix<Cost> launched(cost, n, head, first), inflight_start(cost, n, head, first - slots);
    double single = 0;
    for (int64_t i = first; i < copies * n; ++i) {
        double start = 0;
        if (i >= slots) start = (launched.sum - kInflightShare * (launched.sum - inflight_start.sum)) / slots;
        const double end = start + cost((int)(i % n));
        single = end > single ? end : single;
        launched.advance();
        inflight_start.advance();
    }
    return paired < single;
}

} /* namespace fat */
