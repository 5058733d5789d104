/*
 * fat_sm90_fwd.cuh - the Hopper (sm_90a) forward kernel: TMA loads into a
 * ring of shared-memory stages, wgmma for both GEMMs, online softmax in
 * registers.  o and lse of fat_params, as fat::sm90_fwd<T, D> declares.
 *
 * One CTA computes one block of kBlockM = 64 kConsumers query rows (128,
 * 192 or 256) of one (batch, query head) against the key blocks it can see
 * (kBlockN keys each).  128 (kConsumers + 1) threads, one producer warpgroup
 * and two to four consumers:
 *   warpgroup 0 (producer, 24 registers): thread 0 issues the TMA loads: the
 *     Q block once, K_0, then K_{j+1} before V_j, each into stage j % kStages
 *     of its ring once the consumers released that stage (K and V have
 *     separate empty barriers: a K stage frees when S = Q K^T is done);
 *   warpgroups 1.. (consumers, 240 registers with two, 160 / 112 with three / four): each
 *     owns 64 query rows.
 *     S = Q K^T (wgmma, both operands in shared memory), softcap / mask,
 *     online softmax on raw scores (one FFMA + ex2.approx per element; O
 *     rescaled only when a row's max grew by more than 2^8), P
 *     (fp16/bf16 in registers) and O += P V (wgmma, A from registers, V read
 *     N-major); finally O / l through shared memory (the O buffer, or the
 *     dead Q rows of the warpgroup) to global by TMA store (16-byte thread
 *     stores where TMA cannot describe o or the rows cross the end of a
 *     varlen sequence), and lse = (m + log2 l) ln 2.
 * Shared memory (fat_sm90_primitives.cuh describes the 128B-swizzled panels):
 *   q  : kQBuffers x (kBlockM x D) (D / 64 panels of kBlockM rows each)
 *   o  : kOBuffers (0 or 1) x (kBlockM x D), the same layout (persistent CTAs)
 *   k,v: kStages x (kBlockN x D)   (D / 64 panels of kBlockN rows each)
 *   barriers: q_full, q_empty per Q buffer; k_full, v_full (TMA bytes landed) and k_empty, v_empty
 *   (all consumer warps are done with the stage) per stage; 128 kConsumers pin slots.
 * Tensor maps are 4D (columns, rows, heads, batch): out-of-range rows and
 * columns [d, D) read as zeros; varlen maps span all packed rows (batch 1),
 * and rows past a sequence are masked (keys) or never stored (queries).
 * Key blocks that no query row of the CTA sees are skipped; element masks
 * run only on blocks that cross sk or a window/causal edge.
 *
 * Variants (FwdConfig<D, kBlockN, kStages, kOverlap, kPingPong, kPersistent, kConsumers, kCarryS,
 * kSumByMma>,
 * timed side by side by dev/sm90_fwd_check.cu; FwdDefault picks the default):
 *   kOverlap : FA3's intra-warpgroup overlap: issue S_{j+1}, rescale O, issue
 *              P_j V_j, wait for S_{j+1} only and run its softmax while P_j V_j
 *              is on the tensor cores;
 *   kPingPong: (with kOverlap) the consumer warpgroups take turns issuing
 *              their GEMMs (named barriers, round robin), so one's softmax
 *              runs under the others' GEMMs;
 *   kPersistent: one CTA per SM runs jobs in cta_tile's order; with two
 *              Q buffers (kQBuffers, where shared memory allows) the next
 *              tile's Q loads during this tile, else after its main loop
 *              (with an O buffer) or its epilogue (q_empty); its K/V load
 *              during the epilogue;
 *   kCarryS:   (persistent, two Q buffers and an O buffer) the first S of
 *              tile t + 1 is issued before the epilogue of tile t, which
 *              then runs while that GEMM is on the tensor cores;
 *   kSumByMma: (D = 64) P V is m64n72: its last 8 columns read a shared
 *              panel of ones (V's "second panel" through the descriptor's
 *              LBO), so the row sums accumulate on the tensor cores,
 *              rescaled with O, instead of 64 FADDs per thread and block.
 */
#pragma once

#include <cuda.h> /* CUtensorMap and its enums; the encoder is fetched at run time */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "fat_cuda_internal.h"
#include "fat_sm80_primitives.cuh"
#include "fat_sm90_primitives.cuh"

/* Timeline hooks: no-ops unless dev/sm90_timeline.cuh defined them (the dev
 * check built with -DFAT_SM90_TIMELINE); role 0 is the producer, 1 + wg
 * consumer warpgroup wg. */
#ifndef FAT_SM90_STAMP
#define FAT_SM90_STAMP_INIT() ((void)0)
#define FAT_SM90_STAMP(role, event) ((void)0)
#endif

namespace fat {
namespace sm90 {

/* ---- configuration ---------------------------------------------------------- */

/* One compiled variant: head dim D, kBlockN keys per block, kStages K/V
 * stages, the scheduling flags described at the top and the number of
 * consumer warpgroups. */
template <int D, int BN, int Stages, bool Overlap, bool PingPong, bool Persistent = false, int Consumers = 2,
          bool CarryS = false, bool SumByMma = false>
struct FwdConfig {
    static_assert(D == 64 || D == 128 || D == 256, "sm90 forward compiles head dims 64, 128, 256");
    static_assert(BN % 16 == 0 && BN <= 256, "key block: k16 steps of P V, one TMA box");
    static_assert(!PingPong || Overlap, "ping-pong is built on the overlapped loop");
    static_assert(Consumers >= 2 && Consumers <= 4, "two to four consumer warpgroups");
    static_assert(!SumByMma || D == 64, "the ones panel is reached as the second 64-column panel of V");
    static constexpr int kD = D;
    static constexpr int kConsumers = Consumers;
    static constexpr int kBlockM = 64 * Consumers; /* query rows: 64 per consumer warpgroup */
    static constexpr int kBlockN = BN;
    static constexpr int kStages = Stages;
    static constexpr bool kOverlap = Overlap, kPingPong = PingPong, kPersistent = Persistent, kCarryS = CarryS;
    /* kSumByMma: the row sums come out of the P V GEMM as 8 more columns
     * (N = D + 8) read from a panel of ones, rescaled with O (no FADDs) */
    static constexpr bool kSumByMma = SumByMma;
    static constexpr int kOCols = D + (SumByMma ? 8 : 0); /* accumulator columns of O */
    static constexpr int kPanels = D / 64;
    static constexpr int kThreads = 128 * (Consumers + 1);
    /* setmaxnreg: the CTA starts with kEntryRegs per thread (64K over its
     * threads, multiples of 8); the producer drops to 24 and the consumers
     * take what it gave back (setmaxnreg.inc waits for freed registers, so
     * asking for more deadlocks): 240 with two consumers, 160 / 112 with
     * three / four */
    static constexpr int kProducerRegs = 24;
    static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kConsumerRegs =
        (kEntryRegs + (kEntryRegs - kProducerRegs) / Consumers) / 8 * 8;
    static_assert(kConsumerRegs <= 256, "setmaxnreg takes 24 to 256 registers");
    static constexpr int kConsumerWarps = 4 * Consumers; /* the count of every empty barrier */
    static constexpr uint32_t kQPanelBytes = kBlockM * 128;
    static constexpr uint32_t kKVPanelBytes = kBlockN * 128;
    static constexpr uint32_t kQBytes = kQPanelBytes * kPanels;
    static constexpr uint32_t kKVBytes = kKVPanelBytes * kPanels; /* one K or one V block */
    static constexpr uint32_t kOnesBytes = SumByMma ? kKVPanelBytes : 0; /* kBlockN rows of ones */
    /* q_full, q_empty: 2 slots each; 4 barriers per stage; then the pin slots */
    static constexpr uint32_t kBarrierBytes = 8 * (4 + 4 * kStages) + 128 * Consumers * 4;
    /* + 1024: the dynamic window is aligned up by hand */
    static constexpr int kOneQSmemBytes = kQBytes + 2 * kStages * kKVBytes + kOnesBytes + kBarrierBytes + 1024;
    static constexpr int kSmemLimit = 227 * 1024;
    /* persistent CTAs keep two Q buffers where shared memory allows: the
     * next tile's Q loads while this tile runs (not at D = 256 or BN176) */
    static constexpr int kQBuffers = Persistent && kOneQSmemBytes + (int)kQBytes <= kSmemLimit ? 2 : 1;
    /* and, where it still fits, a buffer of their own for staging O, so the
     * Q buffer is released when the main loop ends, before the epilogue
     * (else O is staged in the tile's Q buffer) */
    static constexpr int kOBuffers =
        Persistent && kOneQSmemBytes + (kQBuffers - 1 + 1) * (int)kQBytes <= kSmemLimit ? 1 : 0;
    static constexpr int kSmemBytes = kOneQSmemBytes + (kQBuffers - 1 + kOBuffers) * kQBytes;
    static_assert(kSmemBytes <= kSmemLimit, "shared memory of one CTA");
    /* the next tile's first S runs under this tile's epilogue: it needs the
     * next Q in the other buffer, and a tile with no keys (or no next tile)
     * issues it on that Q buffer alone (kBlockN of its rows) */
    static_assert(!CarryS || (Persistent && Overlap && kQBuffers == 2 && kOBuffers == 1 && BN <= kBlockM),
                  "carrying S: persistent, overlapped, two Q buffers and an O buffer, kBlockN <= kBlockM");
};

/* Everything the kernel reads, by value (tensor maps must live in param space). */
struct FwdArgs {
    CUtensorMap q_map, k_map, v_map; /* (cols, rows, heads, batch) */
    CUtensorMap o_map;               /* the same for o, boxes of 64 rows (one warpgroup's) */
    int o_tma;                       /* o_map is valid: O leaves by TMA store */
    void *o;
    float *lse;
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t lse_batch_stride, lse_head_stride;
    int sq, sk, group, d_v; /* group = hq / hkv */
    int window_left, window_right; /* after causal; -1 = unbounded */
    /* tiles: (batch, head, query block).  Persistent CTAs run jobs
     * (cta_tile): one query block, or (paired) the blocks m_blocks - 1 - j
     * and j of one (batch, head); job_blocks jobs per (batch, head) */
    int batch, hq, m_blocks, tiles;
    int paired, job_blocks, jobs;
    /* log2-domain score = x * exp_scale, x being what make_scores leaves:
     * without softcap x = q.k (exp_scale = scale * log2(e)); with softcap
     * x = tanh(q.k * tanh_scale) * softcap * log2(e) (exp_scale = 1). */
    float exp_scale;
    float tanh_scale;   /* scale / softcap */
    float softcap_log2; /* softcap * log2(e); 0 = off */
};

/* The shared-memory window of one CTA: the kQBuffers Q buffers, the O
 * buffer (kOBuffers), then (k, v) of stage 0, 1, ..., the ones panel
 * (kSumByMma), then the barriers. */
template <class C> struct FwdSmem {
    uint8_t *q_base;
    float *pin; /* 128 kConsumers floats: pin_before_wait's slots */
    /* q_full/q_empty: one per Q buffer (2 slots); the others one per stage.
     * full: TMA bytes landed; empty: all consumer warps are done with it
     * (for q: the epilogue, persistent CTAs only). */
    uint64_t *q_full, *q_empty, *k_full, *v_full, *k_empty, *v_empty;

    __device__ explicit FwdSmem(uint8_t *raw) {
        q_base = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
        q_full = (uint64_t *)(ones() + C::kOnesBytes);
        q_empty = q_full + 2;
        k_full = q_empty + 2;
        v_full = k_full + C::kStages;
        k_empty = v_full + C::kStages;
        v_empty = k_empty + C::kStages;
        pin = (float *)(v_empty + C::kStages);
    }
    __device__ uint8_t *q(int buf) const { return q_base + buf * C::kQBytes; }
    /* where tile O is staged for its store: the O buffer, or Q buffer buf */
    __device__ uint8_t *o_stage(int buf) const { return C::kOBuffers ? q(C::kQBuffers) : q(buf); }
    __device__ uint8_t *k(int stage) const {
        return q_base + (C::kQBuffers + C::kOBuffers) * C::kQBytes + stage * 2 * C::kKVBytes;
    }
    __device__ uint8_t *v(int stage) const { return k(stage) + C::kKVBytes; }
    __device__ uint8_t *ones() const { return k(0) + 2 * C::kStages * C::kKVBytes; }
};

/* What one CTA computes: rows [m0, m0 + kBlockM) of sequence b, head h, against
 * key blocks n_min..n_max (none when n_max < n_min). */
struct FwdTile {
    SeqInfo seq;
    int b, h, m0, rows; /* rows: valid query rows of the block, <= kBlockM */
    int shift;          /* seq.sk - seq.sq */
    int n_min, n_max;
};

__device__ __forceinline__ int clamp_to(int64_t x, int lo, int hi) {
    return x < lo ? lo : (x > hi ? hi : (int)x);
}

/* Query block m_block of (batch b, head h). */
template <class C> __device__ FwdTile fwd_tile(const FwdArgs &a, int b, int h, int m_block) {
    FwdTile t;
    t.b = b;
    t.h = h;
    t.m0 = m_block * C::kBlockM;
    t.seq = seq_info(a.cu_seqlens_q, a.cu_seqlens_k, t.b, a.sq, a.sk);
    t.rows = t.seq.sq - t.m0 < C::kBlockM ? t.seq.sq - t.m0 : C::kBlockM;
    t.shift = t.seq.sk - t.seq.sq;
    const int64_t last_row = (int64_t)t.m0 + t.rows - 1;
    const int lo = a.window_left < 0 ? 0
                                     : clamp_to((int64_t)t.m0 + t.shift - a.window_left, 0, t.seq.sk);
    const int hi = a.window_right < 0 ? t.seq.sk - 1
                                      : clamp_to(last_row + t.shift + a.window_right, -1,
                                                 t.seq.sk - 1);
    t.n_min = lo / C::kBlockN;
    t.n_max = (hi < lo || t.rows <= 0) ? t.n_min - 1 : hi / C::kBlockN;
    return t;
}

/* Tile number k of this CTA into *t; false when the CTA has no more.  Grid
 * launch: one tile, blockIdx = (query block from the last, head, batch),
 * so the hardware starts the heaviest (causal) first.  Persistent: CTA c
 * runs jobs c, c + gridDim.x, ..., in (batch, head)-major order, so the
 * CTAs running at once share the K/V of a few heads.  Causal tiles come in
 * pairs (FwdArgs::paired): block m_blocks - 1 - j, then block j, which
 * cost m_blocks + 1 key blocks together, so every job weighs the same and
 * the static round robin stays balanced (the earlier heaviest-first static
 * order gave the busiest CTA 13-31% more work than the mean at 2k-16k
 * causal, in a model of the tile costs: benchmarks/NOTES.md, session 13).
 * The second of a pair whose blocks coincide has no rows. */
template <class C> __device__ bool cta_tile(const FwdArgs &a, int k, FwdTile *t) {
    if constexpr (!C::kPersistent) {
        if (k > 0) return false;
        *t = fwd_tile<C>(a, blockIdx.z, blockIdx.y, gridDim.x - 1 - blockIdx.x);
        return true;
    }
    const int per_job = a.paired ? 2 : 1, second = k % per_job;
    const int job = blockIdx.x + (k / per_job) * gridDim.x;
    if (job >= a.jobs) return false;
    const int bh = job / a.job_blocks, j = job - bh * a.job_blocks, b = bh / a.hq;
    const int mirror = a.m_blocks - 1 - j;
    *t = fwd_tile<C>(a, b, bh - b * a.hq, second ? j : mirror);
    if (second && j == mirror) t->rows = 0;
    return true;
}

/* The CTA's next tile with rows (varlen blocks past their sequence and the
 * empty second of a pair have none), from tile number *k on; *k moves past it. */
template <class C> __device__ bool next_tile(const FwdArgs &a, int *k, FwdTile *t) {
    while (cta_tile<C>(a, (*k)++, t))
        if (t->rows > 0) return true;
    return false;
}

__device__ __forceinline__ int key_blocks(const FwdTile &t) {
    return t.n_max >= t.n_min ? t.n_max - t.n_min + 1 : 0;
}

/* True when some valid row of the tile does not see every key of block n. */
template <class C> __device__ __forceinline__ bool block_needs_mask(const FwdArgs &a, const FwdTile &t, int n) {
    constexpr int BN = C::kBlockN;
    const int64_t first = (int64_t)n * BN, last = first + BN - 1;
    const int64_t last_row = (int64_t)t.m0 + t.rows - 1;
    return last >= t.seq.sk ||
           (a.window_right >= 0 && last > (int64_t)t.m0 + t.shift + a.window_right) ||
           (a.window_left >= 0 && first < last_row + t.shift - a.window_left);
}

/* ---- producer ------------------------------------------------------------------ */

__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int col, int row, int head,
                                         int batch, uint64_t *bar) {
    const int32_t coords[4] = {col, row, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords,
                                    bar);
}

/* Loads panels of a block (kPanels boxes of 64 columns) and arms bar for them. */
template <class C>
__device__ __forceinline__ void tma_load_block(uint8_t *dst, uint32_t panel_bytes, const CUtensorMap *map,
                                               int row, int head, int batch, uint64_t *bar) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                         cuda::ptx::space_shared, bar, panel_bytes * C::kPanels);
#pragma unroll
    for (int p = 0; p < C::kPanels; ++p)
        tma_load(dst + p * panel_bytes, map, 64 * p, row, head, batch, bar);
}

/* Load number it of a ring whose stage is it % kStages: waits until the
 * consumers released that stage's previous use (round 0 passes at once). */
template <class C>
__device__ __forceinline__ void tma_load_kv(uint8_t *dst, const CUtensorMap *map, uint64_t *empty,
                                            uint64_t *full, int it, int row, int head, int batch) {
    mbar_wait(empty, ((uint32_t)(it / C::kStages) & 1) ^ 1);
    tma_load_block<C>(dst, C::kKVPanelBytes, map, row, head, batch, full);
}

/* One thread: Q, K_0, then K_{j+1} before V_j, in the order the consumers
 * use them.  K and V have their own empty barriers: a K stage is free once
 * S = Q K^T finished, long before P V is done with the V of the same block. */
/* tile_no: tiles this CTA ran before, it0: loads of the ring before this
 * tile (persistent CTAs run on).  The tile's Q goes to buffer tile_no %
 * kQBuffers; the first K goes out before the wait for the epilogue that
 * last used that buffer.  Q is loaded even when the tile sees no key: the
 * consumers always wait for it. */
template <class C>
__device__ void fwd_produce(const FwdArgs &a, const FwdTile &t, const FwdSmem<C> &sm, int tile_no, int it0) {
    const int batch = a.cu_seqlens_q ? 0 : t.b;
    const int kv_head = t.h / a.group;
    auto row_of = [&](int n) { return (int)(t.seq.k_start + (int64_t)n * C::kBlockN); };
    const int s0 = it0 % C::kStages;
    if (t.n_min <= t.n_max) {
        tma_load_kv<C>(sm.k(s0), &a.k_map, &sm.k_empty[s0], &sm.k_full[s0], it0, row_of(t.n_min), kv_head,
                       batch);
        FAT_SM90_STAMP(0, kProducerK);
    }
    const int qb = tile_no % C::kQBuffers, q_use = tile_no / C::kQBuffers;
    if (q_use > 0) mbar_wait(&sm.q_empty[qb], (uint32_t)(q_use - 1) & 1);
    FAT_SM90_STAMP(0, kProducerQ);
    tma_load_block<C>(sm.q(qb), C::kQPanelBytes, &a.q_map, (int)(t.seq.q_start + t.m0), t.h, batch,
                      &sm.q_full[qb]);
    if (t.n_min > t.n_max) return;
    for (int n = t.n_min, it = it0; n <= t.n_max; ++n, ++it) {
        if (n < t.n_max) {
            const int s = (it + 1) % C::kStages;
            tma_load_kv<C>(sm.k(s), &a.k_map, &sm.k_empty[s], &sm.k_full[s], it + 1, row_of(n + 1), kv_head,
                           batch);
            FAT_SM90_STAMP(0, kProducerK);
        }
        const int s = it % C::kStages;
        tma_load_kv<C>(sm.v(s), &a.v_map, &sm.v_empty[s], &sm.v_full[s], it, row_of(n), kv_head, batch);
        FAT_SM90_STAMP(0, kProducerV);
    }
}

/* ---- consumer pieces --------------------------------------------------------------- */

/* Where one consumer thread sits: warpgroup wg (0..kConsumers-1), warp, g = lane / 4, t4 = lane % 4. */
struct Lane {
    int wg, tid, warp, g, t4;
};

/* s = Q K^T for the warpgroup's 64 rows: issue and commit only. */
template <typename T, class C>
__device__ __forceinline__ void issue_qk(float (&s)[C::kBlockN / 2], uint32_t q_addr, uint32_t k_addr) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kD / 16; ++kk) {
        const uint32_t step = (kk % 4) * 32;
        Wgmma<C::kBlockN>::template ss<T>(
            s, desc_k_major(q_addr + (kk / 4) * C::kQPanelBytes + step),
            desc_k_major(k_addr + (kk / 4) * C::kKVPanelBytes + step), kk > 0);
    }
    wgmma_commit();
}

/* o += P V: issue and commit only.  p[kk] is the A fragment of keys 16kk..
 * With kSumByMma the ones panel is V's second 64-column panel: LBO = its
 * distance from the stage's V, ones_addr - v_addr. */
template <typename T, class C>
__device__ __forceinline__ void issue_pv(float (&o)[C::kOCols / 2], uint32_t (&p)[C::kBlockN / 16][4],
                                         uint32_t v_addr, uint32_t ones_addr) {
    const uint32_t panel_stride = C::kSumByMma ? ones_addr - v_addr : C::kKVPanelBytes;
    reg_fence(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
        Wgmma<C::kOCols>::template rs_mn<T>(o, p[kk], desc_mn_major(v_addr + kk * 16 * 128, panel_stride), 1);
    wgmma_commit();
}

/* Raw dot products of key block n become the x of FwdArgs::exp_scale
 * (unchanged without softcap); invisible entries become -inf when the block
 * needs a mask. */
template <class C>
__device__ __forceinline__ void make_scores(float (&s)[C::kBlockN / 2], const FwdArgs &a, const FwdTile &t,
                                            const Lane &ln, int n) {
    constexpr int BN = C::kBlockN;
    if (a.softcap_log2 > 0.f) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = tanhf(s[i] * a.tanh_scale) * a.softcap_log2;
    }
    if (!block_needs_mask<C>(a, t, n)) return;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        /* visible columns of this row, relative to the block: [lo, hi) */
        const int64_t row = (int64_t)t.m0 + 64 * ln.wg + 16 * ln.warp + ln.g + 8 * half;
        const int64_t first = (int64_t)n * BN;
        int64_t hi = t.seq.sk;
        if (a.window_right >= 0 && row + t.shift + a.window_right + 1 < hi)
            hi = row + t.shift + a.window_right + 1;
        const int64_t lo = a.window_left >= 0 ? row + t.shift - a.window_left : 0;
        /* column 8 blk + 2 t4 + e is visible iff lo_t <= 8 blk + e < hi_t:
         * one compare with an immediate per edge and element */
        const int lo_t = clamp_to(lo - first, 0, BN) - 2 * ln.t4;
        const int hi_t = clamp_to(hi - first, 0, BN) - 2 * ln.t4;
        if (a.window_left < 0) { /* lo = 0: no left edge (causal, right windows, sk) */
#pragma unroll
            for (int blk = 0; blk < BN / 8; ++blk)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (8 * blk + e >= hi_t) s[4 * blk + 2 * half + e] = -INFINITY;
        } else {
#pragma unroll
            for (int blk = 0; blk < BN / 8; ++blk)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (8 * blk + e < lo_t || 8 * blk + e >= hi_t) s[4 * blk + 2 * half + e] = -INFINITY;
        }
    }
}

/* A row's reference max moves only when the block's max exceeds it by more
 * than kRebaseSlack (log2 units): p = exp2(x * scale - m) then stays below
 * 2^8, and O (and l) are rescaled only in the blocks where some row moved,
 * which after the first block is rare. */
constexpr float kRebaseSlack = 8.f;

/* Online softmax over one block of x (log2 score = x * scale, scale > 0):
 * updates the reference max m (log2 units) and (kSum) this thread's partial
 * row sum l, turns s into exp2(x * scale - m) (one FFMA and one MUFU.EX2
 * per element) and returns the factor alpha the accumulator rows must be
 * scaled by (1 where m stayed). */
template <int BN, bool kSum>
__device__ __forceinline__ void softmax_update(float (&s)[BN / 2], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float mx = s[2 * half];
#pragma unroll
        for (int blk = 0; blk < BN / 8; ++blk)
            mx = fmaxf(mx, fmaxf(s[4 * blk + 2 * half], s[4 * blk + 2 * half + 1]));
        mx = quad_max(mx) * scale;
        /* m = -inf (nothing seen yet) moves to any finite max, alpha = 0 */
        const bool rebase = mx > m[half] + kRebaseSlack;
        alpha[half] = rebase ? exp2_approx(m[half] - mx) : 1.f;
        if (rebase) m[half] = mx;
        const float base = m[half] == -INFINITY ? 0.f : m[half]; /* a row that saw nothing yet */
        float sum = 0.f;
#pragma unroll
        for (int blk = 0; blk < BN / 8; ++blk)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float &x = s[4 * blk + 2 * half + e];
                x = exp2_approx(fmaf(x, scale, -base));
                if (kSum) sum += x;
            }
        if (kSum) l[half] = l[half] * alpha[half] + sum;
    }
}

template <int D> __device__ __forceinline__ void scale_rows(float (&o)[D / 2], const float (&f)[2]) {
#pragma unroll
    for (int blk = 0; blk < D / 8; ++blk) {
        o[4 * blk + 0] *= f[0];
        o[4 * blk + 1] *= f[0];
        o[4 * blk + 2] *= f[1];
        o[4 * blk + 3] *= f[1];
    }
}

/* O's rows by softmax_update's alpha, skipped (one warp-uniform branch)
 * when no row of the warp moved its reference max. */
template <int D> __device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) scale_rows<D>(o, alpha);
}

/* P as wgmma A fragments: k-step kk takes score columns 16kk..16kk+15. */
template <typename T, int BN>
__device__ __forceinline__ void pack_p(uint32_t (&p)[BN / 16][4], const float (&s)[BN / 2]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[kk][r] = elem<T>::pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

/* The stage's wgmmas are complete in every warp of this warpgroup once each
 * warp's lane 0 arrives (the empty barriers count every consumer warp). */
__device__ __forceinline__ void release_stage(uint64_t *bar, const Lane &ln) {
    __syncwarp();
    if ((ln.tid & 31) == 0)
        cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                   bar);
}

/* Named barriers: 1 + wg is warpgroup wg's epilogue (128 threads);
 * 1 + kConsumers + wg is its ping-pong turn, 256 threads (the waiter and the
 * passer, warpgroup wg - 1 round robin).  Every warpgroup alternates wait
 * and pass, so no turn barrier ever holds two passes: the last warpgroup
 * passes once before its first tile (warpgroup 0 issues first) and
 * warpgroup 0 takes that extra pass after its last tile; in between the
 * turns run on across tiles, so a tile's first S waits for the other
 * warpgroups' last P V issue, not for their epilogues. */
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <class C> __device__ __forceinline__ void turn_wait(const Lane &ln) {
    named_sync(1 + C::kConsumers + ln.wg, 256);
}
template <class C> __device__ __forceinline__ void turn_pass(const Lane &ln) {
    const int next = ln.wg + 1 == C::kConsumers ? 0 : ln.wg + 1;
    asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + C::kConsumers + next) : "memory");
}

/* ---- consumer main loops ------------------------------------------------------------ */

/* Running state of one consumer thread: 2 rows (g and g + 8 of its warp);
 * o has kOCols columns, l is the partial row sum (unused with kSumByMma). */
template <class C> struct RowState {
    float o[C::kOCols / 2];
    float m[2], l[2];
};

/* Scores and softmax of block n, pinned before whatever wait follows: the
 * fences keep the compiler from sinking the exp2s below a wgmma wait. */
template <class C>
__device__ __forceinline__ void scores_softmax(float (&sc)[C::kBlockN / 2], float (&alpha)[2],
                                               RowState<C> &st, const FwdArgs &a, const FwdTile &t,
                                               const Lane &ln, int n) {
    make_scores<C>(sc, a, t, ln, n);
    softmax_update<C::kBlockN, !C::kSumByMma>(sc, st.m, st.l, alpha, a.exp_scale);
    reg_fence(sc);
    reg_fence2(st.l, alpha);
}

/* ptxas schedules a wgmma wait as early as it may, and it may run before
 * the softmax that precedes it in the source (the fences above only order
 * the compiler's IR): then the exp2s wait for P V and the overlap is lost.
 * A shared-memory store of a value that depends on every exp2 stays before
 * the wait, and so must they: the row sums, or (kSumByMma, no sums) an XOR
 * of the exponentials' bits (three-input LOP3s).  The slot is never read. */
template <class C>
__device__ __forceinline__ void pin_before_wait(float *pin, const Lane &ln, const RowState<C> &st,
                                                const float (&p)[C::kBlockN / 2]) {
    uint32_t dep;
    if constexpr (C::kSumByMma) {
        uint32_t part[8] = {}; /* eight short chains, then their XOR */
#pragma unroll
        for (int i = 0; i < C::kBlockN / 2; ++i) part[i % 8] ^= __float_as_uint(p[i]);
        dep = part[0];
#pragma unroll
        for (int j = 1; j < 8; ++j) dep ^= part[j];
    } else {
        dep = __float_as_uint(st.l[0] + st.l[1]);
    }
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_u32(pin + ln.wg * 128 + ln.tid)), "r"(dep) : "memory");
}

/* v1: each block's GEMMs and softmax in sequence. */
template <typename T, class C>
__device__ void mainloop_serial(RowState<C> &st, const FwdArgs &a, const FwdTile &t,
                                const FwdSmem<C> &sm, const uint8_t *q, const Lane &ln, int it0) {
    constexpr int BN = C::kBlockN;
    const uint32_t q_addr = smem_u32(q) + ln.wg * 64 * 128;
    for (int n = t.n_min, it = it0; n <= t.n_max; ++n, ++it) {
        const int s = it % C::kStages;
        const uint32_t parity = (uint32_t)(it / C::kStages) & 1;
        float sc[BN / 2], alpha[2];
        uint32_t p[BN / 16][4];
        mbar_wait(&sm.k_full[s], parity);
        issue_qk<T, C>(sc, q_addr, smem_u32(sm.k(s)));
        wgmma_wait<0>();
        reg_fence(sc);
        release_stage(&sm.k_empty[s], ln);
        scores_softmax<C>(sc, alpha, st, a, t, ln, n);
        rescale_o<C::kOCols>(st.o, alpha);
        pack_p<T, BN>(p, sc);
        mbar_wait(&sm.v_full[s], parity);
        issue_pv<T, C>(st.o, p, smem_u32(sm.v(s)), smem_u32(sm.ones()));
        wgmma_wait<0>();
        reg_fence(st.o);
        reg_fence(p);
        release_stage(&sm.v_empty[s], ln);
    }
}

/* v2 (the FA3 order): issue S_{j+1} = Q K_{j+1}^T, rescale O by block j's
 * alpha while it runs, issue O += P_j V_j; wait for S_{j+1} only, release
 * K_{j+1}, run the softmax of block j+1 under P_j V_j; then wait for it,
 * release V_j and convert P_{j+1}.  kS0Issued: the first S is already on
 * its way into sc (issue_first_s, under the previous tile's epilogue). */
template <typename T, class C, bool kS0Issued>
__device__ void mainloop_overlap(RowState<C> &st, float (&sc)[C::kBlockN / 2], const FwdArgs &a,
                                 const FwdTile &t, const FwdSmem<C> &sm, const uint8_t *q, const Lane &ln,
                                 int it0) {
    constexpr int BN = C::kBlockN;
    constexpr bool kPingPong = C::kPingPong;
    const uint32_t q_addr = smem_u32(q) + ln.wg * 64 * 128;
    float alpha[2];
    uint32_t p[BN / 16][4];

    const int s0 = it0 % C::kStages;
    if constexpr (!kS0Issued) {
        mbar_wait(&sm.k_full[s0], (uint32_t)(it0 / C::kStages) & 1);
        if (kPingPong) turn_wait<C>(ln);
        FAT_SM90_STAMP(1 + ln.wg, kTurn);
        issue_qk<T, C>(sc, q_addr, smem_u32(sm.k(s0)));
        if (kPingPong) turn_pass<C>(ln);
    }
    wgmma_wait<0>();
    reg_fence(sc);
    FAT_SM90_STAMP(1 + ln.wg, kSDone);
    release_stage(&sm.k_empty[s0], ln);
    scores_softmax<C>(sc, alpha, st, a, t, ln, t.n_min); /* alpha = 0: o is still zero */
    pack_p<T, BN>(p, sc);

    int it = it0; /* the ring load whose P is in p */
    for (int n = t.n_min + 1; n <= t.n_max; ++n, ++it) {
        const int cur = it % C::kStages, next = (it + 1) % C::kStages;
        const uint32_t cur_parity = (uint32_t)(it / C::kStages) & 1;
        const uint32_t next_parity = (uint32_t)((it + 1) / C::kStages) & 1;
        mbar_wait(&sm.k_full[next], next_parity);
        if (kPingPong) turn_wait<C>(ln);
        FAT_SM90_STAMP(1 + ln.wg, kTurn);
        issue_qk<T, C>(sc, q_addr, smem_u32(sm.k(next)));
        rescale_o<C::kOCols>(st.o, alpha);
        mbar_wait(&sm.v_full[cur], cur_parity);
        issue_pv<T, C>(st.o, p, smem_u32(sm.v(cur)), smem_u32(sm.ones()));
        if (kPingPong) turn_pass<C>(ln);
        wgmma_wait<1>(); /* S of block n is done, P_j V_j may still run */
        reg_fence(sc);
        FAT_SM90_STAMP(1 + ln.wg, kSDone);
        release_stage(&sm.k_empty[next], ln);
        scores_softmax<C>(sc, alpha, st, a, t, ln, n);
        pin_before_wait<C>(sm.pin, ln, st, sc);
        wgmma_wait<0>();
        reg_fence(st.o);
        reg_fence(p);
        FAT_SM90_STAMP(1 + ln.wg, kPVDone);
        release_stage(&sm.v_empty[cur], ln);
        pack_p<T, BN>(p, sc);
    }

    const int cur = it % C::kStages;
    rescale_o<C::kOCols>(st.o, alpha);
    mbar_wait(&sm.v_full[cur], (uint32_t)(it / C::kStages) & 1);
    if (kPingPong) turn_wait<C>(ln);
    FAT_SM90_STAMP(1 + ln.wg, kTurn);
    issue_pv<T, C>(st.o, p, smem_u32(sm.v(cur)), smem_u32(sm.ones()));
    if (kPingPong) turn_pass<C>(ln);
    wgmma_wait<0>();
    reg_fence(st.o);
    reg_fence(p);
    FAT_SM90_STAMP(1 + ln.wg, kLoopEnd);
    release_stage(&sm.v_empty[cur], ln);
}

/* ---- epilogue ------------------------------------------------------------------------- */

/* Warpgroup wg's 64 staged rows of the tile (q: its Q buffer) to o by TMA
 * (thread 0 of the warpgroup): one box per 64-column panel below d_v; the
 * map clips columns >= d_v and, dense, rows >= sq.  One bulk group, whose
 * smem reads o_store_read_wait waits for. */
template <class C>
__device__ __forceinline__ void tma_store_rows(const FwdArgs &a, const FwdTile &t, const uint8_t *q, int wg) {
    const int32_t row = (int32_t)(t.seq.q_start + t.m0) + 64 * wg;
    const int32_t batch = a.cu_seqlens_q ? 0 : t.b;
#pragma unroll
    for (int p = 0; p < C::kPanels; ++p)
        if (64 * p < a.d_v) {
            const int32_t coords[4] = {64 * p, row, t.h, batch};
            cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &a.o_map, coords,
                                            q + p * C::kQPanelBytes + wg * 64 * 128);
        }
    cuda::ptx::cp_async_bulk_commit_group();
}

/* The issuing thread: every TMA store it issued has read its shared memory. */
__device__ __forceinline__ void o_store_read_wait() {
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>());
}

/* o / l to global through the warpgroup's rows of q, the O buffer or the
 * tile's Q buffer (all its wgmmas reading them are complete); lse = (m +
 * log2 l) ln 2. Rows past the sequence and columns >= d_v are never
 * written.  The rows leave by TMA store when the map exists and (varlen)
 * all 64 rows of the warpgroup lie in the sequence (the map spans the
 * packed rows), else by 16-byte stores of all 128 threads. */
template <typename T, class C>
__device__ void fwd_store(RowState<C> &st, const FwdArgs &a, const FwdTile &t, uint8_t *q,
                          const Lane &ln) {
    constexpr int D = C::kD;
    using Tile = SmemTile<C::kBlockM, D>;
    float inv[2], lse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        /* the ones columns hold the whole row's sum in every lane */
        const float l = C::kSumByMma ? st.o[D / 2 + 2 * half] : quad_sum(st.l[half]);
        inv[half] = l > 0.f ? 1.f / l : 0.f;
        lse[half] = l > 0.f ? (st.m[half] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    }
    scale_rows<C::kOCols>(st.o, inv);
    if constexpr (C::kOBuffers > 0) {
        /* the previous tile's TMA store (a tile ago) has read the O buffer */
        if (ln.tid == 0) o_store_read_wait();
        named_sync(1 + ln.wg, 128);
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); /* the rows were TMA/wgmma data */

    const int row_in_wg = 16 * ln.warp + ln.g;
#pragma unroll
    for (int blk = 0; blk < D / 8; ++blk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t off = Tile::offset(64 * ln.wg + row_in_wg + 8 * half, 8 * blk + 2 * ln.t4);
            *(uint32_t *)(q + off) = elem<T>::pack(st.o[4 * blk + 2 * half], st.o[4 * blk + 2 * half + 1]);
        }
    const bool varlen = a.cu_seqlens_q != nullptr;
    const bool by_tma = a.o_tma && (!varlen || t.m0 + 64 * (ln.wg + 1) <= t.seq.sq);
    if (by_tma) cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); /* staged rows -> TMA's reads */
    named_sync(1 + ln.wg, 128); /* the warpgroup's rows are staged */
    FAT_SM90_STAMP(1 + ln.wg, kStaged);

    if (by_tma) {
        if (ln.tid == 0) tma_store_rows<C>(a, t, q, ln.wg);
    } else {
        T *o_head = (T *)a.o + (varlen ? t.seq.q_start * a.o_row_stride : (int64_t)t.b * a.o_batch_stride) +
                    (int64_t)t.h * a.o_head_stride;
        constexpr int kChunksPerRow = D / 8;
        for (int i = ln.tid; i < 64 * kChunksPerRow; i += 128) {
            const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
            const int row = t.m0 + 64 * ln.wg + r;
            if (row < t.seq.sq && c < a.d_v)
                *(uint4 *)(o_head + (int64_t)row * a.o_row_stride + c) =
                    *(const uint4 *)(q + Tile::offset(64 * ln.wg + r, c));
        }
    }

    float *lse_head = a.lse + (varlen ? t.seq.q_start : (int64_t)t.b * a.lse_batch_stride) +
                      (int64_t)t.h * a.lse_head_stride;
    if (ln.t4 == 0)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = t.m0 + 64 * ln.wg + row_in_wg + 8 * half;
            if (row < t.seq.sq) lse_head[row] = lse[half];
        }
}

/* ---- consumers ------------------------------------------------------------------------- */

__device__ __forceinline__ Lane make_lane(int wg) {
    Lane ln;
    ln.wg = wg;
    ln.tid = threadIdx.x % 128;
    ln.warp = ln.tid / 32;
    ln.g = (ln.tid % 32) / 4;
    ln.t4 = ln.tid % 4;
    return ln;
}

template <class C> __device__ __forceinline__ void row_state_init(RowState<C> &st) {
#pragma unroll
    for (int i = 0; i < C::kOCols / 2; ++i) st.o[i] = 0.f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
}

/* Persistent CTAs give the Q buffer of tile number tile_no back to the
 * producer.  With an O buffer right after the main loop (only wgmmas read
 * Q); else after the epilogue staged O in it: its generic accesses end with
 * a proxy fence (before the next Q's TMA write) and its TMA store must have
 * read it (thread 0 issued it, and is lane 0 of the arriving warp 0). */
template <class C>
__device__ __forceinline__ void release_q(const FwdSmem<C> &sm, const Lane &ln, int tile_no) {
    if constexpr (C::kOBuffers == 0) {
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        if (ln.tid == 0) o_store_read_wait();
    }
    release_stage(&sm.q_empty[tile_no % C::kQBuffers], ln);
}

/* One tile: tile_no = tiles this CTA ran before (its Q buffer and that
 * buffer's phase), it0 = ring loads before it. */
template <typename T, class C>
__device__ void fwd_consume(const FwdArgs &a, const FwdTile &t, const FwdSmem<C> &sm, int wg, int tile_no,
                            int it0) {
    const Lane ln = make_lane(wg); /* recomputed per tile: cheaper than live across the loop */
    RowState<C> st;
    row_state_init(st);
    const int qb = tile_no % C::kQBuffers;
    uint8_t *q = sm.q(qb);
    FAT_SM90_STAMP(1 + wg, kTileBegin);
    mbar_wait(&sm.q_full[qb], (uint32_t)(tile_no / C::kQBuffers) & 1);
    FAT_SM90_STAMP(1 + wg, kQReady);
    if (t.n_min <= t.n_max) {
        if constexpr (C::kOverlap) {
            float sc[C::kBlockN / 2];
            mainloop_overlap<T, C, false>(st, sc, a, t, sm, q, ln, it0);
        } else {
            mainloop_serial<T, C>(st, a, t, sm, q, ln, it0);
        }
    }
    if constexpr (C::kPersistent && C::kOBuffers > 0) release_q(sm, ln, tile_no);
    fwd_store<T, C>(st, a, t, sm.o_stage(qb), ln);
    if constexpr (C::kPersistent && C::kOBuffers == 0) release_q(sm, ln, tile_no);
    FAT_SM90_STAMP(1 + wg, kTileEnd);
}

/* The first S of tile t (number tile_no, ring loads before it: it), issued
 * into sc once its Q (and first K) landed.  A tile with no keys, or none at
 * all (!exists: the CTA has no next tile), issues the same GEMM on its Q
 * buffer alone, whatever that holds: sc is then never read, and the wgmma
 * is issued on every path, so it never meets a branch in flight. */
template <typename T, class C>
__device__ __forceinline__ void issue_first_s(float (&sc)[C::kBlockN / 2], const FwdTile &t, bool exists,
                                              const FwdSmem<C> &sm, const Lane &ln, int tile_no, int it) {
    const int qb = tile_no % C::kQBuffers, s = it % C::kStages;
    const bool keys = exists && t.n_min <= t.n_max;
    if (exists) mbar_wait(&sm.q_full[qb], (uint32_t)(tile_no / C::kQBuffers) & 1);
    if (keys) mbar_wait(&sm.k_full[s], (uint32_t)(it / C::kStages) & 1);
    FAT_SM90_STAMP(1 + ln.wg, kTurn);
    const uint32_t q_base = smem_u32(sm.q(qb));
    issue_qk<T, C>(sc, q_base + ln.wg * 64 * 128, keys ? smem_u32(sm.k(s)) : q_base);
}

/* All tiles of a persistent CTA with kCarryS: after the last P V of tile t
 * the first S of tile t + 1 is issued, and tile t's epilogue runs while it
 * is on the tensor cores (the next Q waits in the other buffer). */
template <typename T, class C> __device__ void fwd_consume_carried(const FwdArgs &a, const FwdSmem<C> &sm, const Lane &ln) {
    float sc[C::kBlockN / 2];
    FwdTile t, next;
    int k = 0, it = 0;
    if (!next_tile<C>(a, &k, &t)) return;
    issue_first_s<T, C>(sc, t, true, sm, ln, 0, it);
    for (int tile_no = 0;; ++tile_no) {
        FAT_SM90_STAMP(1 + ln.wg, kTileBegin);
        FAT_SM90_STAMP(1 + ln.wg, kQReady); /* (waited for in issue_first_s) */
        RowState<C> st;
        row_state_init(st);
        if (t.n_min <= t.n_max)
            mainloop_overlap<T, C, true>(st, sc, a, t, sm, sm.q(tile_no % C::kQBuffers), ln, it);
        else
            wgmma_wait<0>(); /* the unused S */
        release_q(sm, ln, tile_no);
        it += key_blocks(t);
        const bool more = next_tile<C>(a, &k, &next);
        issue_first_s<T, C>(sc, next, more, sm, ln, tile_no + 1, it);
        fwd_store<T, C>(st, a, t, sm.o_stage(0), ln);
        FAT_SM90_STAMP(1 + ln.wg, kTileEnd);
        if (!more) break;
        t = next;
    }
    wgmma_wait<0>(); /* the S issued for no tile */
}

/* ---- kernel ---------------------------------------------------------------------------- */

/* The body exists only in the sm_90a device pass: a build that also targets
 * sm_80 compiles an empty kernel there, which the dispatcher never launches. */
template <typename T, class C>
__global__ void __launch_bounds__(C::kThreads, 1) fwd_kernel(const __grid_constant__ FwdArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    const FwdSmem<C> sm(smem_raw);
    if (threadIdx.x == 0) {
        for (int b = 0; b < C::kQBuffers; ++b) {
            cuda::ptx::mbarrier_init(&sm.q_full[b], 1);
            cuda::ptx::mbarrier_init(&sm.q_empty[b], C::kConsumerWarps);
        }
        for (int s = 0; s < C::kStages; ++s) {
            cuda::ptx::mbarrier_init(&sm.k_full[s], 1);
            cuda::ptx::mbarrier_init(&sm.v_full[s], 1);
            cuda::ptx::mbarrier_init(&sm.k_empty[s], C::kConsumerWarps);
            cuda::ptx::mbarrier_init(&sm.v_empty[s], C::kConsumerWarps);
        }
        cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
        FAT_SM90_STAMP_INIT();
    }
    if constexpr (C::kSumByMma) { /* ones in every element, so the swizzle does not matter */
        const uint32_t one = elem<T>::pack(1.f, 1.f);
        for (uint32_t i = threadIdx.x; i < C::kOnesBytes / 16; i += C::kThreads)
            ((uint4 *)sm.ones())[i] = make_uint4(one, one, one, one);
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); /* generic writes -> wgmma reads */
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    /* tile_no counts this CTA's tiles with rows, it the ring's loads */
    FwdTile t;
    if (wg == 0) {
        regs_release<C::kProducerRegs>();
        if (threadIdx.x != 0) return;
        /* (next_tile here spills in the 24-register producer) */
        for (int k = 0, tile_no = 0, it = 0; cta_tile<C>(a, k, &t); ++k) {
            if (t.rows <= 0) continue; /* varlen: this block lies past its sequence */
            fwd_produce<C>(a, t, sm, tile_no, it);
            ++tile_no;
            it += key_blocks(t);
        }
    } else {
        regs_claim<C::kConsumerRegs>();
        if (C::kPingPong && wg == C::kConsumers) turn_pass<C>(make_lane(wg - 1)); /* warpgroup 0 first */
        if constexpr (C::kCarryS) {
            fwd_consume_carried<T, C>(a, sm, make_lane(wg - 1));
        } else {
            /* this loop form, not next_tile's: ptxas spills 8-100 bytes with that one */
            for (int k = 0, tile_no = 0, it = 0; cta_tile<C>(a, k, &t); ++k) {
                if (t.rows <= 0) continue;
                fwd_consume<T, C>(a, t, sm, wg - 1, tile_no, it);
                ++tile_no;
                it += key_blocks(t);
            }
        }
        if (C::kPingPong && wg == 1) turn_wait<C>(make_lane(0)); /* the last warpgroup's last pass */
        /* the shared memory stays until the last TMA store has read it */
        if (threadIdx.x % 128 == 0) o_store_read_wait();
    }
#endif
}

/* ---- host side ---------------------------------------------------------------------------- */

typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                  CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                  CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver, without linking libcuda. */
inline EncodeTiledFn encode_tiled_fn() {
    static EncodeTiledFn fn = []() -> EncodeTiledFn {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            return nullptr;
        return (EncodeTiledFn)ptr;
    }();
    return fn;
}

/* A 4D map (cols, rows, heads, batch) of 2-byte elements, boxes of 64
 * columns x box_rows rows, 128B swizzle, zero fill out of range.  A stride
 * of a dimension of size 1 is never used; it is replaced by a legal one. */
inline bool encode_map(CUtensorMap *map, const void *ptr, bool is_half, int cols, int64_t rows, int heads,
                       int batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                       int box_rows) {
    EncodeTiledFn encode = encode_tiled_fn();
    if (encode == nullptr) return false;
    if (rows < 1) rows = 1;
    if (heads == 1) head_stride = row_stride;
    if (batch == 1) batch_stride = row_stride;
    const int64_t strides[3] = {row_stride, head_stride, batch_stride};
    for (int64_t s : strides)
        if (s <= 0 || s % 8 != 0 || s >= ((int64_t)1 << 39)) return false;
    const cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batch};
    const cuuint64_t byte_strides[3] = {(cuuint64_t)row_stride * 2, (cuuint64_t)head_stride * 2,
                                        (cuuint64_t)batch_stride * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    return encode(map, is_half ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                  const_cast<void *>(ptr), dims, byte_strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, class C> bool make_fwd_args(const fat_params &p, FwdArgs *a) {
    const bool varlen = p.cu_seqlens_q != nullptr, half = kIsHalf<T>;
    const int batch = varlen ? 1 : p.b;
    const int64_t rows_q = varlen ? p.total_q : p.sq, rows_k = varlen ? p.total_k : p.sk;
    if (!encode_map(&a->q_map, p.q, half, p.d, rows_q, p.hq, batch, p.q_row_stride, p.q_head_stride,
                    p.q_batch_stride, C::kBlockM) ||
        !encode_map(&a->k_map, p.k, half, p.d, rows_k, p.hkv, batch, p.k_row_stride, p.k_head_stride,
                    p.k_batch_stride, C::kBlockN) ||
        !encode_map(&a->v_map, p.v, half, p.d_v, rows_k, p.hkv, batch, p.v_row_stride, p.v_head_stride,
                    p.v_batch_stride, C::kBlockN))
        return false;
    /* O by TMA store where TMA can describe it (else 16-byte thread stores) */
    a->o_tma = encode_map(&a->o_map, p.o, half, p.d_v, rows_q, p.hq, batch, p.o_row_stride, p.o_head_stride,
                          p.o_batch_stride, 64);
    a->o = p.o;
    a->lse = p.lse;
    a->cu_seqlens_q = p.cu_seqlens_q;
    a->cu_seqlens_k = p.cu_seqlens_k;
    a->o_batch_stride = p.o_batch_stride;
    a->o_row_stride = p.o_row_stride;
    a->o_head_stride = p.o_head_stride;
    a->lse_batch_stride = p.lse_batch_stride;
    a->lse_head_stride = p.lse_head_stride;
    a->sq = p.sq;
    a->sk = p.sk;
    a->group = p.hq / p.hkv;
    a->d_v = p.d_v;
    fat_effective_window(&p, &a->window_left, &a->window_right);
    a->batch = p.b;
    a->hq = p.hq;
    a->m_blocks = (p.sq + C::kBlockM - 1) / C::kBlockM;
    const int64_t tiles = (int64_t)a->m_blocks * p.b * p.hq;
    if (tiles > INT32_MAX) return false;
    a->tiles = (int)tiles;
    /* causal (with no left window) query blocks cost in proportion to
     * their index: persistent CTAs take them in mirrored pairs */
    a->paired = p.causal && a->window_left < 0;
    a->job_blocks = a->paired ? (a->m_blocks + 1) / 2 : a->m_blocks;
    a->jobs = a->job_blocks * p.b * p.hq;
    const double log2e = 1.4426950408889634;
    if (p.softcap > 0) {
        a->exp_scale = 1.f;
        a->tanh_scale = (float)(p.softmax_scale / p.softcap);
        a->softcap_log2 = (float)(p.softcap * log2e);
    } else {
        a->exp_scale = (float)(p.softmax_scale * log2e);
        a->tanh_scale = 0.f;
        a->softcap_log2 = 0.f;
    }
    return true;
}

/* Launches one variant with prepared arguments: one CTA per tile, or
 * (persistent) one per SM, each running tiles until all are done. */
template <typename T, class C> fat_status launch_fwd_args(const FwdArgs &a, cudaStream_t stream) {
    auto kernel = fwd_kernel<T, C>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes) !=
        cudaSuccess)
        return FAT_ERR_CUDA;
    dim3 grid(a.m_blocks, a.hq, a.batch);
    if constexpr (C::kPersistent) {
        int device = 0, sms = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            return FAT_ERR_CUDA;
        grid = dim3(a.jobs < sms ? a.jobs : sms);
    }
    if (a.tiles == 0) return FAT_OK;
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    return cudaGetLastError() == cudaSuccess ? FAT_OK : FAT_ERR_CUDA;
}

/* Launches one variant; FAT_ERR_UNSUPPORTED when the tensors cannot be
 * described to TMA (a stride not a multiple of 8 elements) or the grid is
 * too large. */
template <typename T, class C> fat_status launch_fwd(const fat_params &p, cudaStream_t stream) {
    FwdArgs a;
    if (p.hq > 65535 || p.b > 65535 || !make_fwd_args<T, C>(p, &a)) return FAT_ERR_UNSUPPORTED;
    return launch_fwd_args<T, C>(a, stream);
}

/* The variants sm90_fwd chooses from (measurements: benchmarks/NOTES.md).
 * kBlockN 128 (80 at D = 256, shared memory), 3 stages at D = 64, else 2. */
template <int D, bool PingPong, bool Persistent = false>
using FwdBase = FwdConfig<D, D == 256 ? 80 : 128, D == 64 ? 3 : 2, true, PingPong, Persistent>;

/* The default of each head dim: FwdDefault<D>::launch picks a variant by
 * the query length (and causal), from the H200 tables of NOTES.md
 * (dev/sm90_fwd_check, bf16, 16 heads, 16k tokens; runs 5a-10b; O by TMA
 * store and persistent CTAs with an O buffer since run 10b):
 *   D = 128: non-causal up to 2k pingpong persistent (+4% over overlap
 *            BN128 at 2k, run 10b), up to 4k the same carrying S across
 *            tiles (+3% over overlap, +4% over pingpong persistent, run
 *            10b), beyond pingpong n176 (FA3's tile; runs 8a, 9a, 10b);
 *            causal up to 4k pingpong persistent (+3-4% over overlap
 *            persistent at 2k-4k, run 10b), beyond pingpong n176;
 *   D = 64:  non-causal three consumer warpgroups, ping-pong, persistent
 *            (+6-18% at 512-4k, run 8a; since lazy rescaling +3% at 8k and
 *            level at 16k over pingpong n192 persistent, run 19a, H100);
 *            causal up to 2k pingpong persistent (run 7a) with the row
 *            sums from the P V GEMM (kSumByMma: +2-4% at 2k, run 19b,
 *            H100), beyond n192 persistent (+4% at 4k, +6% at 8k, level
 *            at 16k, run 10b);
 *   D = 256: non-causal up to 1k pingpong persistent (+6-7% over overlap,
 *            run 9a), 2k overlap BN80, beyond pingpong BN80; causal up to 1k
 *            overlap, up to 8k pingpong persistent (+4-9% at 2k-8k, run
 *            9a), beyond pingpong. */
template <int D> struct FwdDefault;
template <> struct FwdDefault<128> {
    template <typename T> static fat_status launch(const fat_params &p, cudaStream_t stream) {
        using PingPongPersistent = FwdBase<128, true, true>;
        if (p.sq > 4096) return launch_fwd<T, FwdConfig<128, 176, 2, true, true>>(p, stream);
        if (p.causal || p.sq <= 2048) return launch_fwd<T, PingPongPersistent>(p, stream);
        return launch_fwd<T, FwdConfig<128, 128, 2, true, true, true, 2, true>>(p, stream);
    }
};
template <> struct FwdDefault<64> {
    template <typename T> static fat_status launch(const fat_params &p, cudaStream_t stream) {
        using PingPongPersistentOnes = FwdConfig<64, 128, 3, true, true, true, 2, false, true>;
        using WidePersistent = FwdConfig<64, 192, 3, true, true, true>;
        if (p.causal)
            return p.sq <= 2048 ? launch_fwd<T, PingPongPersistentOnes>(p, stream)
                                : launch_fwd<T, WidePersistent>(p, stream);
        return launch_fwd<T, FwdConfig<64, 128, 2, true, true, true, 3>>(p, stream);
    }
};
template <> struct FwdDefault<256> {
    template <typename T> static fat_status launch(const fat_params &p, cudaStream_t stream) {
        using Overlap = FwdBase<256, false>;
        using PingPong = FwdBase<256, true>;
        using PingPongPersistent = FwdBase<256, true, true>;
        if (p.causal) {
            if (p.sq <= 1024) return launch_fwd<T, Overlap>(p, stream);
            return p.sq <= 8192 ? launch_fwd<T, PingPongPersistent>(p, stream) : launch_fwd<T, PingPong>(p, stream);
        }
        if (p.sq <= 1024) return launch_fwd<T, PingPongPersistent>(p, stream);
        return p.sq <= 2048 ? launch_fwd<T, Overlap>(p, stream) : launch_fwd<T, PingPong>(p, stream);
    }
};

} /* namespace sm90 */

template <typename T, int D> fat_status sm90_fwd(const fat_params &p, cudaStream_t stream) {
    return sm90::FwdDefault<D>::template launch<T>(p, stream);
}

} /* namespace fat */
