/*
 * sm90_timeline.cuh - per-CTA event timeline of the sm90a forward kernel,
 * for dev/sm90_fwd_check.cu built with -DFAT_SM90_TIMELINE (included before
 * csrc/cuda/fat_sm90_fwd.cuh, whose FAT_SM90_STAMP hooks then record).
 *
 * The first kCtas CTAs record, per role (0: the producer thread, 1 + wg:
 * thread 0 of consumer warpgroup wg), events as (clock64 << 8 | event) in
 * buf[cta][role][0 .. kEntries); the count of each role lives in shared
 * memory and is copied to counts[cta][role] as the role records.  Clocks
 * are SM cycles, comparable within one CTA only.
 */
#pragma once

#include <stdint.h>

namespace fat {
namespace timeline {

enum Event {
    kProducerQ,  /* producer: Q load issued (after its buffer's empty wait) */
    kProducerK,  /* producer: K load issued (after the stage's empty wait) */
    kProducerV,  /* producer: V load issued */
    kTileBegin,  /* consumer: fwd_consume entered */
    kQReady,     /* consumer: the tile's Q landed */
    kTurn,       /* consumer: its ping-pong turn came (or, without, the GEMM issue) */
    kSDone,      /* consumer: S = Q K^T of a block complete */
    kPVDone,     /* consumer: P V of a block complete (inside the loop) */
    kLoopEnd,    /* consumer: the tile's last P V complete */
    kStaged,     /* consumer: O staged in shared memory (epilogue barrier passed) */
    kTileEnd,    /* consumer: fwd_store returned */
};

constexpr int kCtas = 8, kRoles = 5, kEntries = 8192;
__device__ unsigned long long buf[kCtas][kRoles][kEntries];
__device__ int counts[kCtas][kRoles];

__device__ __forceinline__ uint32_t *role_counts() {
    __shared__ uint32_t n[kRoles];
    return n;
}

/* thread 0, before the kernel's first __syncthreads */
__device__ __forceinline__ void init() {
    if (blockIdx.x < kCtas)
        for (int r = 0; r < kRoles; ++r) role_counts()[r] = 0;
}

__device__ __forceinline__ void stamp(int role, int event) {
    if (blockIdx.x >= kCtas || threadIdx.x % 128 != 0) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    const uint32_t i = role_counts()[role];
    if (i < kEntries) {
        buf[blockIdx.x][role][i] = t << 8 | (unsigned)event;
        role_counts()[role] = i + 1;
        counts[blockIdx.x][role] = i + 1;
    }
}

} /* namespace timeline */
} /* namespace fat */

#define FAT_SM90_STAMP_INIT() fat::timeline::init()
#define FAT_SM90_STAMP(role, event) fat::timeline::stamp(role, fat::timeline::event)
