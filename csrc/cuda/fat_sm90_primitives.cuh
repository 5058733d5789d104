/*
 * fat_sm90_primitives.cuh - Hopper (sm_90a) building blocks of the sm90
 * forward kernel: wgmma (warpgroup MMA), shared-memory matrix descriptors,
 * mbarrier waits, register reallocation.  TMA, mbarrier and fences come from
 * libcu++ <cuda/ptx>; inline PTX is used only where it has no wrapper.
 *
 * Shared-memory operand layout (the one TMA writes with 128B swizzle): a tile
 * of R rows x C columns of 2-byte elements is stored as C/64 panels; panel p
 * holds columns 64p..64p+63 of every row, rows 128 bytes apart, and inside
 * each 1024-byte group of 8 rows the 16-byte chunk index (address bits 4-6)
 * is XORed with the row index mod 8 (address bits 7-9).  Every panel starts
 * 1024-byte aligned.  wgmma reads such a panel through a descriptor with
 * swizzle mode 1 (128B):
 *   K-major (rows = M or N, columns = K; Q and K for S = Q K^T):
 *     SBO = 1024 (next 8 rows), LBO unused (1); a k16 step inside the panel
 *     adds 32 bytes to the start address, the next panel starts a new one.
 *   MN-major (rows = K, columns = N; V for O = P V, transpose bit set):
 *     SBO = 1024 (next 8 rows of K), LBO = panel bytes (next 64 columns of N);
 *     a k16 step adds 16 rows = 2048 bytes.
 * Accumulator fragment of m64nN (fp32), warp w of the warpgroup, lane 4g + t:
 *   d[4i + 0..1] = (row 16w + g,     cols 8i + 2t, 8i + 2t + 1)
 *   d[4i + 2..3] = (row 16w + g + 8, cols 8i + 2t, 8i + 2t + 1)
 * A fragment of m64k16 from registers (4 x 2-element registers):
 *   a[0] = (16w + g, 2t..2t+1)  a[1] = (16w + g + 8, 2t..)
 *   a[2] = (16w + g, 2t+8..)    a[3] = (16w + g + 8, 2t+8..)
 * so the S accumulator of cols 16kk..16kk+15, converted pairwise, is exactly
 * the A fragment of k-step kk of O += P V.
 */
#pragma once

#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace fat {
namespace sm90 {

template <typename T> constexpr bool kIsHalf = std::is_same<T, __half>::value;

/* ---- descriptors -------------------------------------------------------- */

/* 128B-swizzled operand descriptor: start address, LBO, SBO in bytes. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
/* K-major panel operand (Q, K). */
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) { return smem_desc(addr, 16, 1024); }
/* MN-major operand whose 64-column panels lie panel_bytes apart (V). */
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t panel_bytes) {
    return smem_desc(addr, panel_bytes, 1024);
}

/* ---- wgmma ordering ----------------------------------------------------- */

/* Before the first wgmma of a batch whose registers other code touched. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most Pending committed groups of this warpgroup are in flight. */
template <int Pending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
/* Pins register values in program order around wgmma issue and wait, so the
 * compiler neither reads an accumulator early nor writes one late. */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <int N> __device__ __forceinline__ void reg_fence2(float (&a)[N], float (&b)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(a[i]), "+f"(b[i])::"memory");
}

/* ---- softmax math ------------------------------------------------------- */

/* 2^x on the SFU, flushing denormals (one MUFU.EX2; exp2f adds a range
 * fix-up of three more instructions).  ex2(-inf) = +0. */
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- register reallocation between warpgroups --------------------------- */

template <int Regs> __device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs> __device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

/* ---- mbarrier ------------------------------------------------------------ */

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

/* ---- wgmma m64nNk16, fp32 accumulators, fp16/bf16 inputs ----------------
 * ss:    d (+)= A(smem, K-major) * B(smem, K-major)
 * rs_mn: d (+)= A(registers)     * B(smem, MN-major)
 * accumulate = 0 overwrites d.  Operands are read asynchronously: keep d, a
 * and the shared memory untouched until wgmma_wait says the group is done. */
template <int N> struct Wgmma;

#define FAT_ACC8(d, i)                                                                         \
    "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),             \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

#define FAT_WGMMA_SS_N64(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"  \
                 " %32, %33, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N64(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"  \
                 " {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<64> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N64(".f16.f16");
        else FAT_WGMMA_SS_N64(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N64(".f16.f16");
        else FAT_WGMMA_RS_N64(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N64
#undef FAT_WGMMA_RS_N64

#define FAT_WGMMA_SS_N80(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39},"  \
                 " %40, %41, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N80(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39},"  \
                 " {%40, %41, %42, %43}, %44, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<80> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[40], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N80(".f16.f16");
        else FAT_WGMMA_SS_N80(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[40], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N80(".f16.f16");
        else FAT_WGMMA_RS_N80(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N80
#undef FAT_WGMMA_RS_N80

#define FAT_WGMMA_SS_N128(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"  \
                 " %64, %65, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N128(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"  \
                 " {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<128> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N128(".f16.f16");
        else FAT_WGMMA_SS_N128(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[64], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N128(".f16.f16");
        else FAT_WGMMA_RS_N128(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N128
#undef FAT_WGMMA_RS_N128

#define FAT_WGMMA_SS_N176(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87},"  \
                 " %88, %89, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N176(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %93, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87},"  \
                 " {%88, %89, %90, %91}, %92, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<176> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[88], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N176(".f16.f16");
        else FAT_WGMMA_SS_N176(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[88], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N176(".f16.f16");
        else FAT_WGMMA_RS_N176(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N176
#undef FAT_WGMMA_RS_N176

#define FAT_WGMMA_SS_N192(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95},"  \
                 " %96, %97, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80), FAT_ACC8(d, 88)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N192(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95},"  \
                 " {%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80), FAT_ACC8(d, 88)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<192> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[96], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N192(".f16.f16");
        else FAT_WGMMA_SS_N192(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[96], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N192(".f16.f16");
        else FAT_WGMMA_RS_N192(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N192
#undef FAT_WGMMA_RS_N192

#define FAT_WGMMA_SS_N256(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"  \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"  \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"  \
                 " %128, %129, p, 1, 1, 0, 0;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80), FAT_ACC8(d, 88), FAT_ACC8(d, 96), FAT_ACC8(d, 104), FAT_ACC8(d, 112), FAT_ACC8(d, 120)  \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS_N256(AB)  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"  \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32" AB " {"  \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"  \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"  \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"  \
                 " {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"  \
                 : FAT_ACC8(d, 0), FAT_ACC8(d, 8), FAT_ACC8(d, 16), FAT_ACC8(d, 24), FAT_ACC8(d, 32), FAT_ACC8(d, 40), FAT_ACC8(d, 48), FAT_ACC8(d, 56), FAT_ACC8(d, 64), FAT_ACC8(d, 72), FAT_ACC8(d, 80), FAT_ACC8(d, 88), FAT_ACC8(d, 96), FAT_ACC8(d, 104), FAT_ACC8(d, 112), FAT_ACC8(d, 120)  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
template <> struct Wgmma<256> {
    template <typename T>
    static __device__ __forceinline__ void ss(float (&d)[128], uint64_t a_desc, uint64_t b_desc,
                                              int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_SS_N256(".f16.f16");
        else FAT_WGMMA_SS_N256(".bf16.bf16");
    }
    template <typename T>
    static __device__ __forceinline__ void rs_mn(float (&d)[128], const uint32_t (&a)[4],
                                                 uint64_t b_desc, int accumulate) {
        if constexpr (kIsHalf<T>) FAT_WGMMA_RS_N256(".f16.f16");
        else FAT_WGMMA_RS_N256(".bf16.bf16");
    }
};
#undef FAT_WGMMA_SS_N256
#undef FAT_WGMMA_RS_N256

#undef FAT_ACC8

} /* namespace sm90 */
} /* namespace fat */
