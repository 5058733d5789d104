/*
 * fat_sm80_fwd.cuh - the mma.sync forward kernel (Ampere and newer).
 *
 * O = softmax(scale * Q K^T + mask) V and lse, for one compiled head dim D
 * and element type T (__half / __nv_bfloat16), fp32 accumulation.
 *
 * Grid: one CTA per (query block of kBlockM rows, query head, sequence),
 * flattened into blockIdx.x with the query block fastest (the CTAs of one
 * head run together and share K/V in L2); under causal masking the heaviest
 * query blocks come first (kFwdPairs: a CTA runs the mirrored pair of blocks
 * nqb - 1 - j and j, so that every CTA does the same work).  kWarps warps
 * split the query block: warp w owns
 * rows [w * 16 * kMTiles, (w + 1) * 16 * kMTiles), kMTiles m16 tiles each,
 * and holds their O accumulator (kMTiles x D/8 C tiles), running row max and
 * row sum in registers.  Shared memory: the Q tile (kBlockM x D) and one
 * K and one V tile (kBlockN x D), swizzled (fat_sm80_primitives.cuh).
 * Loop over the visible key blocks j (window/causal ranges skipped):
 *   wait K_j; start loading V_j; S = Q K_j^T; mask (boundary blocks only);
 *   online softmax in the log2 domain; wait V_j; start loading K_{j+1};
 *   O += P V_j with P taken straight from the S registers (kFwdEarlyK: wait
 *   V_j and start K_{j+1} right after S; kFwdHalfS: S, softmax and P V in
 *   two halves of the key block; kFwdKvRing: two K/V buffer pairs, K_{j+1}
 *   and V_{j+1} started at the top of block j, in both defaults;
 *   kFwdRescaleFirst, D = 128: O rescaled before the exponentials).
 * Epilogue: O / rowsum staged through each warp's own rows of the Q tile and
 * stored in 16-byte chunks; lse = (reference max in log2 units + log2 sum)
 * * ln 2; a row with no visible key gets o = 0, lse = -inf.
 */
#pragma once

#include <math.h>

#include <algorithm>
#include <type_traits>

#include "fat_cuda_internal.h"
#include "fat_sm80_primitives.cuh"

namespace fat {

/* Code options of one tile configuration (Sm80FwdTiles kFlags), each
 * measured in dev/sm80_fwd_bench.cu. */
enum Sm80FwdFlags {
    /* without softcap and with scale > 0, keep the scores raw and take
     * p = exp2(s * scale_log2 - max * scale_log2), one FFMA + ex2 per
     * element (the row max of raw scores is the max of scaled ones) */
    kFwdExp2Fma = 1,
    /* a row keeps its reference max until the new max exceeds it by more
     * than a factor 2^8 in p, and O is rescaled only when some row of the
     * warp moved its reference (p <= 256: no overflow, same bf16/fp16
     * relative precision; lse and O are unchanged up to rounding) */
    kFwdLazyRescale = 2,
    /* two kernels, with and without the softcap code, picked at launch: the
     * common one is smaller (fewer registers) at twice the instantiations */
    kFwdSplitSoftcap = 4,
    /* __launch_bounds__ asks for 2 (8-warp) or 3 (4-warp) CTAs per SM
     * instead of 1 / 2: at most 128 / 168 registers a thread */
    kFwdMoreCtas = 8,
    /* S and its softmax in two halves of kBlockN / 2 keys (the registers of
     * the half tile; K and V loads and barriers per kBlockN keys) */
    kFwdHalfS = 16,
    /* where a query block's keys grow with its index (causal, or a right
     * window with no left one) and pairs_finish_sooner says so, CTA j of a
     * head runs block nqb - 1 - j and then block j: equal work per CTA, so
     * the last CTAs to start are not the heaviest (in block order the
     * heaviest blocks of the last heads start last and run alone at the end) */
    kFwdPairs = 32,
    /* kFwdPairs wherever the keys grow with the block (dev tools) */
    kFwdAlwaysPairs = 64,
    /* (one S sub-block only) wait for V_j and start loading K_{j+1} right
     * after S = Q K_j^T instead of after the softmax: K_{j+1} lands under the
     * softmax and P V_j, V_j under S alone */
    kFwdEarlyK = 128,
    /* two K/V buffer pairs: at the top of block j (one barrier) start
     * loading K_{j+1} and V_{j+1} into the other pair, so that every load
     * has a whole block's S, softmax and P V to land under (twice the K/V
     * shared memory; not with kFwdEarlyK) */
    kFwdKvRing = 256,
    /* (with kFwdLazyRescale, one S sub-block) O is rescaled between the row
     * max and the exponentials instead of after them, so that the
     * exponentials, the bf16 packing and the P V MMAs are one basic block
     * whose MUFU and HMMA instructions ptxas interleaves */
    kFwdRescaleFirst = 512,
};

/* One tile configuration: kWarps warps of kMTiles m16 tiles each split the
 * kBlockM = 16 kMTiles kWarps query rows; key blocks of kBlockN; Q either
 * re-read from shared memory for every key block or held in registers as A
 * fragments (kQInRegs, D / 4 registers per m16 tile); kFlags: Sm80FwdFlags. */
template <int D_, int kWarps_, int kMTiles_, int kBlockN_, bool kQInRegs_ = false,
          int kFlags_ = 0>
struct Sm80FwdTiles {
    static constexpr int D = D_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kMTiles = kMTiles_;
    static constexpr int kBlockM = 16 * kMTiles * kWarps;
    static constexpr int kBlockN = kBlockN_;
    static constexpr bool kQInRegs = kQInRegs_;
    static constexpr bool kExp2Fma = (kFlags_ & kFwdExp2Fma) != 0;
    static constexpr bool kLazyRescale = (kFlags_ & kFwdLazyRescale) != 0;
    static constexpr bool kSplitSoftcap = (kFlags_ & kFwdSplitSoftcap) != 0;
    static constexpr int kSubN = (kFlags_ & kFwdHalfS) ? kBlockN_ / 2 : kBlockN_;
    static constexpr bool kPairs = (kFlags_ & (kFwdPairs | kFwdAlwaysPairs)) != 0;
    static constexpr bool kAlwaysPairs = (kFlags_ & kFwdAlwaysPairs) != 0;
    static constexpr bool kEarlyK = (kFlags_ & kFwdEarlyK) != 0;
    static constexpr bool kKvRing = (kFlags_ & kFwdKvRing) != 0;
    static constexpr bool kRescaleFirst = (kFlags_ & kFwdRescaleFirst) != 0;
    static_assert(!kEarlyK || kSubN == kBlockN_, "kFwdEarlyK: one S sub-block");
    static_assert(!(kEarlyK && kKvRing), "kFwdEarlyK and kFwdKvRing: two load schedules");
    static_assert(kSubN % 16 == 0, "S sub-blocks of whole k16 steps");
    static_assert(!kRescaleFirst || (kLazyRescale && kSubN == kBlockN_),
                  "kFwdRescaleFirst: lazy rescaling, one S sub-block");
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMinBlocksPerSm = (kWarps >= 8 ? 1 : 2) + ((kFlags_ & kFwdMoreCtas) ? 1 : 0);
    using QTile = PaddedTile<kBlockM, D>;
    using KVTile = PaddedTile<kBlockN, D>;
    static constexpr int kSmemBytes = QTile::kBytes + (kKvRing ? 4 : 2) * KVTile::kBytes;
};

/* Keys per block for each head dim, and the flags that go with them: the
 * fastest of dev/sm80_fwd_bench.cu's variants (16k tokens, hidden 2048;
 * benchmarks/NOTES.md "sm80 forward", "Causal pairs", "Early K load", "Two
 * K/V buffer pairs", "D = 64 forward candidates", "O rescaled before the
 * exponentials"): 128 x 48 tiles with lazy rescaling, causal pairs, two K/V
 * buffer pairs and the O rescale before the exponentials at D = 128; 128 x
 * 64 with lazy rescaling, two K/V buffer pairs and the O rescale first at D
 * = 64.
 * Unmeasured head dims keep the 64 / 32 key blocks that fit 255 registers
 * without spills. */
constexpr int sm80_fwd_block_n(int d) {
    return d == 128 ? 48 : (d <= 64 || d == 192) ? 64 : 32;
}
constexpr int sm80_fwd_flags(int d) {
    return kFwdExp2Fma | ((d == 64 || d == 128) ? kFwdLazyRescale : 0) |
           (d == 64 || d == 128 ? kFwdKvRing | kFwdRescaleFirst : 0) | (d == 128 ? kFwdPairs : 0);
}

/* The configuration each head dim runs with at 255 registers: no spills but
 * at D = 128 (4 bytes on sm_80, 20 on sm_90a: loop-invariant addresses,
 * reloaded once per key block).  kExtraFlags: options on top of it, for dev/sm80_fwd_bench.cu. */
template <int D, int kExtraFlags = 0> struct Sm80FwdConfig
    : Sm80FwdTiles<D, 4, (D <= 128 ? 2 : 1), sm80_fwd_block_n(D), false,
                   sm80_fwd_flags(D) | kExtraFlags> {};

/* Where fewer than kMinBlocksPerSm CTAs of Sm80FwdConfig<D> fit on an SM
 * (the two K/V buffer pairs: D = 64 54 KB of shared memory a CTA, two fit
 * every SM but the 100 KB of sm_86 / sm_89; D = 128 85 KB, two fit an H100
 * / H200 SM's 228 KB, not an A100's 164 KB), the forward runs with Sm80FwdCompact<D>::type,
 * one K/V buffer pair: D = 64 96-key blocks with the O rescale before the
 * exponentials (45 KB), D = 128 the early K load (60 KB). */
template <int D> struct Sm80FwdCompact { using type = Sm80FwdConfig<D>; };
template <> struct Sm80FwdCompact<64> {
    using type = Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale | kFwdRescaleFirst>;
};
template <> struct Sm80FwdCompact<128> {
    using type = Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdEarlyK>;
};

/* What every CTA needs besides fat_params, computed once on the host. */
struct Sm80FwdArgs {
    fat_params p;
    int window_left, window_right; /* after causal; -1 = unbounded */
    float scale_log2;              /* softmax_scale * log2(e) */
    float softcap_pre;             /* softmax_scale / softcap (softcap > 0) */
    float softcap_log2;            /* softcap * log2(e) */
    int num_m_blocks;
    int jobs_per_head;             /* CTAs per (head, sequence) */
    bool paired;                   /* kFwdPairs and keys growing with the block */
};

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Key range [lo, hi) visible from any of the query rows [first, last]. */
struct KeyRange {
    int lo, hi;
};
__device__ __forceinline__ KeyRange visible_keys(int first_row, int last_row, int sq, int sk,
                                                 int left, int right) {
    const int shift = sk - sq;
    KeyRange r = {0, sk};
    if (right >= 0) r.hi = min(r.hi, last_row + shift + right + 1);
    if (left >= 0) r.lo = max(r.lo, first_row + shift - left);
    return r;
}

/* Pointer to row 0 of head h of one sequence (dense or varlen). */
template <typename T>
__device__ __forceinline__ T *seq_head_ptr(const void *base, int64_t batch_stride,
                                           int64_t row_stride, int64_t head_stride, int b,
                                           int64_t seq_start, bool varlen, int h) {
    const int64_t off = (varlen ? seq_start * row_stride : (int64_t)b * batch_stride) +
                        (int64_t)h * head_stride;
    return const_cast<T *>(static_cast<const T *>(base)) + off;
}

/* Scores of one key block into the log2 domain: scale (and softcap).  One
 * branch around the whole loop: per element it would split the element-wise
 * code into basic blocks the scheduler cannot interleave. */
template <bool kMaySoftcap, int MT, int NT>
__device__ __forceinline__ void scores_to_log2(float (&s)[MT][NT][4], const Sm80FwdArgs &args) {
    if (kMaySoftcap && args.softcap_pre != 0.f) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[mt][nt][e] = args.softcap_log2 * tanhf(s[mt][nt][e] * args.softcap_pre);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] *= args.scale_log2;
    }
}

/* o[mt][nt][e] *= c[mt][e / 2] (per row of this thread's C tiles) */
template <int MT, int NT>
__device__ __forceinline__ void scale_rows(float (&o)[MT][NT][4], const float (&c)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][nt][e] *= c[mt][e >> 1];
}

/* -inf where key col is not visible from query row; this thread's element
 * (mt, nt, e) is row row0 + 16 mt + 8 (e / 2), col col0 + 8 nt + e % 2.
 * Each row's visible keys are one range [lo, hi) (fat_cuda_internal.h), so
 * an element costs one unsigned compare of its column offset in the range. */
template <int MT, int NT>
__device__ __forceinline__ void mask_scores(float (&s)[MT][NT][4], int row0, int col0, int shift,
                                            int sk, const Sm80FwdArgs &args) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            const int64_t diag = (int64_t)(row0 + mt * 16 + ri * 8) + shift;
            int64_t hi = sk, lo = 0;
            if (args.window_right >= 0) hi = min(hi, diag + args.window_right + 1);
            if (args.window_left >= 0) lo = max(lo, diag - args.window_left);
            /* col visible <=> (unsigned)(col - lo) < span */
            const uint32_t span = hi > lo ? (uint32_t)(hi - lo) : 0u;
            const uint32_t first = (uint32_t)(col0 - (int)min(lo, (int64_t)sk));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (first + (uint32_t)(nt * 8 + e) >= span) s[mt][nt][2 * ri + e] = -INFINITY;
        }
}

/* S (+)= Q K^T over the keys [col0, col0 + kSubN) of the K tile for this
 * warp's kMTiles m16 tiles. */
template <typename T, class Cfg, int MT, int NT, class QFrag>
__device__ __forceinline__ void qk_sub_block(float (&s)[MT][NT][4], const QFrag &q_frag, uint32_t q_smem,
                                             uint32_t k_smem, int warp_row0, int col0, int lane) {
    constexpr int SN = Cfg::kSubN;
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if constexpr (Cfg::kQInRegs) {
#pragma unroll
                for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][kk][r];
            } else {
                load_a<typename Cfg::QTile>(a[mt], q_smem, warp_row0 + mt * 16, kk * 16, lane);
            }
        }
#pragma unroll
        for (int nn = 0; nn < SN / 16; ++nn) {
            uint32_t bf[4];
            load_b_nk<typename Cfg::KVTile>(bf, k_smem, col0 + nn * 16, kk * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816<T>(s[mt][2 * nn], a[mt], bf);
                mma_16816<T>(s[mt][2 * nn + 1], a[mt], bf + 2);
            }
        }
    }
}

/* O += P V over the keys [col0, col0 + kSubN) of the V tile (P: A fragments
 * of the whole key block). */
template <typename T, class Cfg, int MT, int NT_O, int KK>
__device__ __forceinline__ void pv_sub_block(float (&o_acc)[MT][NT_O][4], const uint32_t (&pa)[MT][KK][4],
                                             uint32_t v_smem, int col0, int lane) {
#pragma unroll
    for (int kk = col0 / 16; kk < (col0 + Cfg::kSubN) / 16; ++kk) {
#pragma unroll
        for (int dd = 0; dd < Cfg::D / 16; ++dd) {
            uint32_t bf[4];
            load_b_kn<typename Cfg::KVTile>(bf, v_smem, dd * 16, kk * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816<T>(o_acc[mt][2 * dd], pa[mt][kk], bf);
                mma_16816<T>(o_acc[mt][2 * dd + 1], pa[mt][kk], bf + 2);
            }
        }
    }
}

/* Wait for V_j (the last load in flight); once every warp is done with K_j
 * (n0 = its first key), start loading K_{j+1} when there is one. */
template <class Cfg, typename T>
__device__ __forceinline__ void wait_v_load_next_k(uint32_t k_smem, const T *k, const fat_params &p, int sk,
                                                   int n0, bool more, int tid) {
    constexpr int BN = Cfg::kBlockN;
    cp_async_wait<0>();
    __syncthreads(); /* V_j landed; every warp is done with K_j */
    if (more) {
        load_tile_rows_async<typename Cfg::KVTile, Cfg::kThreads>(
            k_smem, k + (int64_t)(n0 + BN) * p.k_row_stride, p.k_row_stride, sk - n0 - BN, p.d, tid);
        cp_async_commit();
    }
}

/* The (query block, head, sequence) of this CTA's part (0, or 1 for the
 * second block of a pair; past the end when the pair's blocks coincide).
 * blockIdx is read through a volatile asm so that the call before the
 * epilogue recomputes these values instead of holding them in registers
 * across the main loop. */
struct FwdCta {
    int m0, h, b; /* first query row of the block, query head, sequence */
    SeqInfo seq;
};
template <class Cfg> __device__ __forceinline__ FwdCta fwd_cta(const Sm80FwdArgs &args, int part) {
    const fat_params &p = args.p;
    const bool paired = Cfg::kPairs && args.paired;
    const int jobs = Cfg::kPairs ? args.jobs_per_head : args.num_m_blocks;
    int bid;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(bid));
    const int job = bid % jobs;
    bid /= jobs;
    FwdCta c;
    c.h = bid % p.hq;
    c.b = bid / p.hq;
    c.seq = seq_info(p.cu_seqlens_q, p.cu_seqlens_k, c.b, p.sq, p.sk);
    const int mirror = args.num_m_blocks - 1 - job;
    int m_idx = p.causal ? mirror : job;
    if (paired) m_idx = part == 0 ? mirror : job < mirror ? job : args.num_m_blocks;
    c.m0 = m_idx * Cfg::kBlockM;
    return c;
}

/* One query block: part 0 of the CTA, or part 1 (the second of a pair).
 * smem: the kernel's dynamic shared memory. */
template <typename T, class Cfg, bool kMaySoftcap>
__device__ __forceinline__ void fwd_query_block(const Sm80FwdArgs &args, uint8_t *smem, int part) {
    constexpr int D = Cfg::D;
    using QTile = typename Cfg::QTile;
    using KVTile = typename Cfg::KVTile;
    constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, MT = Cfg::kMTiles;
    constexpr int SN = Cfg::kSubN, NSUB = BN / SN; /* S sub-blocks of SN keys */
    constexpr int NT_S = SN / 8; /* C tiles of S per m16 tile */
    constexpr int NT_O = D / 8;  /* C tiles of O per m16 tile */
    const fat_params &p = args.p;

    const uint32_t q_smem = smem_u32(smem);
    const uint32_t kv_smem = q_smem + QTile::kBytes; /* [K, V], twice with kKvRing */

    const FwdCta cta = fwd_cta<Cfg>(args, part);
    const int h = cta.h, b = cta.b, m0 = cta.m0;
    const SeqInfo seq = cta.seq;
    const bool varlen = p.cu_seqlens_q != nullptr;
    if (m0 >= seq.sq) return;
    const int hk = h / (p.hq / p.hkv);

    const T *q = seq_head_ptr<T>(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, b,
                                 seq.q_start, varlen, h) + (int64_t)m0 * p.q_row_stride;
    const T *k = seq_head_ptr<T>(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, b,
                                 seq.k_start, varlen, hk);
    const T *v = seq_head_ptr<T>(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, b,
                                 seq.k_start, varlen, hk);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int warp_row0 = warp * 16 * MT; /* first row of this warp in the block */
    const int m_rows = min(BM, seq.sq - m0);
    const KeyRange keys = visible_keys(m0, m0 + m_rows - 1, seq.sq, seq.sk, args.window_left,
                                       args.window_right);
    const int nb_lo = max(keys.lo, 0) / BN;
    const int nb_hi = keys.hi > keys.lo ? (keys.hi + BN - 1) / BN : nb_lo;
    const int shift = seq.sk - seq.sq;
    /* scores stay raw (scaled inside the exp) or go to the log2 domain */
    const bool raw_scores =
        Cfg::kExp2Fma && !(kMaySoftcap && args.softcap_pre != 0.f) && args.scale_log2 > 0.f;
    const float exp_scale = raw_scores ? args.scale_log2 : 1.f;

    uint32_t q_frag[Cfg::kQInRegs ? MT : 1][Cfg::kQInRegs ? D / 16 : 1][4];
    float o_acc[MT][NT_O][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mt][nt][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    if (nb_lo < nb_hi) {
        load_tile_rows_async<QTile, Cfg::kThreads>(q_smem, q, p.q_row_stride, m_rows, p.d, tid);
        load_tile_rows_async<KVTile, Cfg::kThreads>(kv_smem, k + (int64_t)nb_lo * BN * p.k_row_stride,
                                              p.k_row_stride, seq.sk - nb_lo * BN, p.d, tid);
        if constexpr (Cfg::kKvRing)
            load_tile_rows_async<KVTile, Cfg::kThreads>(
                kv_smem + KVTile::kBytes, v + (int64_t)nb_lo * BN * p.v_row_stride, p.v_row_stride,
                seq.sk - nb_lo * BN, p.d_v, tid);
        cp_async_commit();
    }

    for (int nb = nb_lo; nb < nb_hi; ++nb) {
        const int n0 = nb * BN;
        const int pair = Cfg::kKvRing ? (nb - nb_lo) & 1 : 0;
        const uint32_t k_smem = kv_smem + pair * 2 * KVTile::kBytes;
        const uint32_t v_smem = k_smem + KVTile::kBytes;
        cp_async_wait<0>();
        if constexpr (Cfg::kKvRing) {
            __syncthreads(); /* K_j, V_j landed; every warp is done with the other pair */
            if (nb + 1 < nb_hi) {
                const uint32_t k_next = kv_smem + (pair ^ 1) * 2 * KVTile::kBytes;
                load_tile_rows_async<KVTile, Cfg::kThreads>(
                    k_next, k + (int64_t)(n0 + BN) * p.k_row_stride, p.k_row_stride, seq.sk - n0 - BN,
                    p.d, tid);
                load_tile_rows_async<KVTile, Cfg::kThreads>(
                    k_next + KVTile::kBytes, v + (int64_t)(n0 + BN) * p.v_row_stride, p.v_row_stride,
                    seq.sk - n0 - BN, p.d_v, tid);
                cp_async_commit();
            }
        } else {
            __syncthreads(); /* K_j landed; every warp is done with V_{j-1} */
            load_tile_rows_async<KVTile, Cfg::kThreads>(v_smem, v + (int64_t)n0 * p.v_row_stride,
                                                  p.v_row_stride, seq.sk - n0, p.d_v, tid);
            cp_async_commit();
        }

        if (Cfg::kQInRegs && nb == nb_lo) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    load_a<QTile>(q_frag[mt][kk], q_smem, warp_row0 + mt * 16, kk * 16, lane);
        }

        /* S = Q K^T and the online softmax, one sub-block of SN keys at a
         * time; P of every sub-block kept as 2-byte A fragments */
        uint32_t pa[MT][BN / 16][4];
        float correction[NSUB][MT][2];
        bool rescale[NSUB];
        const bool need_mask = /* the block straddles a boundary */
            n0 + BN > seq.sk ||
            (args.window_right >= 0 && n0 + BN - 1 > m0 + shift + args.window_right) ||
            (args.window_left >= 0 && n0 < m0 + BM - 1 + shift - args.window_left);
#pragma unroll
        for (int sb = 0; sb < NSUB; ++sb) {
            float s[MT][NT_S][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
            qk_sub_block<T, Cfg>(s, q_frag, q_smem, k_smem, warp_row0, sb * SN, lane);
            if constexpr (Cfg::kEarlyK)
                wait_v_load_next_k<Cfg>(k_smem, k, p, seq.sk, n0, nb + 1 < nb_hi, tid);

            /* scores into the log2 domain (unless kept raw), masked at
             * boundaries (end of keys, causal diagonal, window edges) */
            if (!raw_scores) scores_to_log2<kMaySoftcap, MT, NT_S>(s, args);
            if (need_mask)
                mask_scores<MT, NT_S>(s, m0 + warp_row0 + g, n0 + sb * SN + 2 * t, shift,
                                      seq.sk, args);

            /* online softmax: new row max (the reference p is taken
             * against), rescale of the running sum (and of O, here when
             * one sub-block, else before this sub-block's P V), P */
            rescale[sb] = false;
            float ref_scaled[MT][2];
            /* row (mt, ri): new reference max, its correction c of the
             * running sum (and of O without lazy rescaling) */
            const auto new_reference = [&](int mt, int ri) {
                const float old = row_max[mt][ri];
                float mx = old;
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * ri], s[mt][nt][2 * ri + 1]));
                mx = quad_max(mx);
                /* old = -inf (nothing seen yet): the difference is inf or NaN */
                const bool keep = Cfg::kLazyRescale && (mx - old) * exp_scale <= 8.f;
                if (!keep) row_max[mt][ri] = mx;
                rescale[sb] |= !keep;
                const float ref = row_max[mt][ri] == -INFINITY ? 0.f : row_max[mt][ri];
                ref_scaled[mt][ri] = ref * exp_scale;
                const float c = keep ? 1.f : fast_exp2(fmaf(old, exp_scale, -ref_scaled[mt][ri]));
                correction[sb][mt][ri] = c;
                row_sum[mt][ri] *= c;
                if (!Cfg::kLazyRescale && NSUB == 1) {
#pragma unroll
                    for (int nt = 0; nt < NT_O; ++nt) {
                        o_acc[mt][nt][2 * ri] *= c;
                        o_acc[mt][nt][2 * ri + 1] *= c;
                    }
                }
            };
            /* row (mt, ri): p = 2^(s scale - reference) in place, summed */
            const auto exponentials = [&](int mt, int ri) {
                float sum = row_sum[mt][ri];
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt) {
                    const float p0 = fast_exp2(fmaf(s[mt][nt][2 * ri], exp_scale, -ref_scaled[mt][ri]));
                    const float p1 = fast_exp2(fmaf(s[mt][nt][2 * ri + 1], exp_scale, -ref_scaled[mt][ri]));
                    s[mt][nt][2 * ri] = p0;
                    s[mt][nt][2 * ri + 1] = p1;
                    sum += p0 + p1;
                }
                row_sum[mt][ri] = sum;
            };
            /* the O rescale is one warp-uniform branch: most blocks move no
             * row's reference */
            if constexpr (Cfg::kRescaleFirst) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int ri = 0; ri < 2; ++ri) new_reference(mt, ri);
                if (__any_sync(0xffffffffu, rescale[sb])) scale_rows<MT, NT_O>(o_acc, correction[sb]);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int ri = 0; ri < 2; ++ri) exponentials(mt, ri);
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int ri = 0; ri < 2; ++ri) {
                        new_reference(mt, ri);
                        exponentials(mt, ri);
                    }
                if (Cfg::kLazyRescale && NSUB == 1 && __any_sync(0xffffffffu, rescale[sb]))
                    scale_rows<MT, NT_O>(o_acc, correction[sb]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < SN / 16; ++kk)
                    c_pair_to_a<T>(pa[mt][sb * SN / 16 + kk], s[mt][2 * kk], s[mt][2 * kk + 1]);
        }

        if constexpr (!Cfg::kEarlyK && !Cfg::kKvRing) wait_v_load_next_k<Cfg>(k_smem, k, p, seq.sk, n0, nb + 1 < nb_hi, tid);

        /* O = O * correction + P V, sub-block by sub-block */
#pragma unroll
        for (int sb = 0; sb < NSUB; ++sb) {
            if (NSUB > 1 && (!Cfg::kLazyRescale || __any_sync(0xffffffffu, rescale[sb])))
                scale_rows<MT, NT_O>(o_acc, correction[sb]);
            pv_sub_block<T, Cfg>(o_acc, pa, v_smem, sb * SN, lane);
        }
    }

    /* epilogue: normalise, lse, stage O in this warp's rows of the Q tile */
    const FwdCta out = fwd_cta<Cfg>(args, part);
    float *lse = p.lse + (varlen ? (int64_t)out.h * p.lse_head_stride + out.seq.q_start
                                 : (int64_t)out.b * p.lse_batch_stride + (int64_t)out.h * p.lse_head_stride);
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            const float sum = quad_sum(row_sum[mt][ri]);
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            const int row = warp_row0 + mt * 16 + g + ri * 8;
            if (t == 0 && out.m0 + row < out.seq.sq)
                lse[out.m0 + row] = sum > 0.f ? (row_max[mt][ri] * exp_scale + log2f(sum)) * 0.69314718055994531f
                                          : -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT_O; ++nt) {
                const uint32_t packed = elem<T>::pack(o_acc[mt][nt][2 * ri] * inv,
                                                      o_acc[mt][nt][2 * ri + 1] * inv);
                const uint32_t addr = q_smem + QTile::offset(row, nt * 8 + 2 * t);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed));
            }
        }
    __syncwarp();

    T *o = seq_head_ptr<T>(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride, out.b,
                           out.seq.q_start, varlen, out.h) + (int64_t)out.m0 * p.o_row_stride;
    constexpr int kChunksPerRow = D / 8;
    constexpr int kWarpChunks = 16 * MT * kChunksPerRow;
#pragma unroll
    for (int i = lane; i < kWarpChunks; i += 32) {
        const int row = warp_row0 + i / kChunksPerRow;
        const int col = (i % kChunksPerRow) * 8;
        if (out.m0 + row < out.seq.sq && col < p.d_v) {
            uint4 chunk;
            asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(chunk.x), "=r"(chunk.y), "=r"(chunk.z), "=r"(chunk.w)
                         : "r"(q_smem + QTile::offset(row, col)));
            *reinterpret_cast<uint4 *>(o + (int64_t)row * p.o_row_stride + col) = chunk;
        }
    }
}

/* kMaySoftcap = false: the instantiation for args.softcap_pre == 0 only
 * (kFwdSplitSoftcap). */
template <typename T, class Cfg, bool kMaySoftcap = true>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    sm80_fwd_kernel(const Sm80FwdArgs args) {
    extern __shared__ __align__(1024) uint8_t smem[];
    if constexpr (Cfg::kPairs) {
        const int parts = args.paired ? 2 : 1;
#pragma unroll 1
        for (int part = 0; part < parts; ++part) {
            if (part > 0) __syncthreads(); /* the first block's epilogue read its O from smem */
            fwd_query_block<T, Cfg, kMaySoftcap>(args, smem, part);
        }
    } else {
        fwd_query_block<T, Cfg, kMaySoftcap>(args, smem, 0);
    }
}

/* Whether args' grid (keys growing with the query block) of `kernel` finishes
 * sooner in pairs: a query block costs its key blocks (max seqlens) plus two
 * for its prologue and epilogue; FAT_ERR_CUDA when the device cannot be
 * queried. */
template <class Cfg, class Kernel>
fat_status fwd_pairs_sooner(const Sm80FwdArgs &args, Kernel kernel, bool *sooner) {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, Cfg::kSmemBytes) !=
            cudaSuccess)
        return FAT_ERR_CUDA;
    const fat_params &p = args.p;
    const int n = args.num_m_blocks;
    const int64_t shift = (int64_t)p.sk - p.sq + args.window_right;
    auto cost = [&](int job) { /* job j runs block n - 1 - j: the heaviest first */
        const int64_t rows_end = std::min<int64_t>(p.sq, (int64_t)(n - job) * Cfg::kBlockM);
        const int64_t keys = std::max<int64_t>(0, std::min<int64_t>(p.sk, rows_end + shift));
        return 2.0 + (double)((keys + Cfg::kBlockN - 1) / Cfg::kBlockN);
    };
    *sooner = pairs_finish_sooner(cost, n, (int64_t)p.hq * p.b, sms * std::max(per_sm, 1));
    return FAT_OK;
}

/* Launches the forward with tile configuration Cfg (Cfg::D >= d, d_v);
 * unsupported, with nothing launched, when the device has too little shared
 * memory for one CTA, or (compact_fallback) for kMinBlocksPerSm on an SM. */
template <typename T, class Cfg>
fat_status sm80_fwd_tiles(const fat_params &p, cudaStream_t stream, bool compact_fallback = false) {
    Sm80FwdArgs args;
    args.p = p;
    fat_effective_window(&p, &args.window_left, &args.window_right);
    const double log2e = 1.4426950408889634;
    args.scale_log2 = (float)(p.softmax_scale * log2e);
    args.softcap_pre = p.softcap > 0 ? (float)(p.softmax_scale / p.softcap) : 0.f;
    args.softcap_log2 = (float)(p.softcap * log2e);
    args.num_m_blocks = (p.sq + Cfg::kBlockM - 1) / Cfg::kBlockM;
    auto kernel = sm80_fwd_kernel<T, Cfg, true>;
    if constexpr (Cfg::kSplitSoftcap)
        if (args.softcap_pre == 0.f) kernel = sm80_fwd_kernel<T, Cfg, false>;
    fat_status st = allow_smem(kernel, Cfg::kSmemBytes);
    if (st != FAT_OK) return st;
    if (compact_fallback) {
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads,
                                                          Cfg::kSmemBytes) != cudaSuccess)
            return FAT_ERR_CUDA;
        if (per_sm < Cfg::kMinBlocksPerSm) return FAT_ERR_UNSUPPORTED;
    }
    args.paired = Cfg::kPairs && args.window_right >= 0 && args.window_left < 0;
    if (args.paired && !Cfg::kAlwaysPairs) {
        st = fwd_pairs_sooner<Cfg>(args, kernel, &args.paired);
        if (st != FAT_OK) return st;
    }
    args.jobs_per_head = args.paired ? (args.num_m_blocks + 1) / 2 : args.num_m_blocks;
    const int64_t blocks = (int64_t)args.jobs_per_head * p.hq * p.b;
    if (blocks > 0x7fffffff) return FAT_ERR_UNSUPPORTED;
    kernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
    return cudaGetLastError() == cudaSuccess ? FAT_OK : FAT_ERR_CUDA;
}

/* Sm80FwdConfig<D>, or Sm80FwdCompact<D> where the former's CTAs do not fit. */
template <typename T, int D> fat_status sm80_fwd(const fat_params &p, cudaStream_t stream) {
    using Fast = Sm80FwdConfig<D>;
    using Compact = typename Sm80FwdCompact<D>::type;
    if constexpr (std::is_same<Fast, Compact>::value) {
        return sm80_fwd_tiles<T, Fast>(p, stream);
    } else {
        const fat_status st = sm80_fwd_tiles<T, Fast>(p, stream, true);
        return st == FAT_ERR_UNSUPPORTED ? sm80_fwd_tiles<T, Compact>(p, stream) : st;
    }
}

} /* namespace fat */
