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

/* The accumulator operands d[i..i+7] and their "%i, ..." names (8 a macro). */
#define FAT_ACC8(i)                                                                            \
    "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),             \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FAT_ACC4(i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FAT_R0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FAT_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FAT_R16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define FAT_R24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define FAT_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FAT_R32_4 ", %32, %33, %34, %35"
#define FAT_R40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FAT_R48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FAT_R56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define FAT_R64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FAT_R72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define FAT_R80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define FAT_R88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FAT_R96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define FAT_R104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define FAT_R112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define FAT_R120 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define FAT_STR_(x) #x
#define FAT_STR(x) FAT_STR_(x)
/* m64nNk16 with accumulators REGS/ACCS, then TAIL (the other operands and
 * the scale/transpose immediates); operand PRED is the accumulate flag. */
#define FAT_WGMMA_ASM(N, AB, REGS, ACCS, TAIL, PRED, ...)                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" FAT_STR(PRED) ", 0;\n"                     \
                 "wgmma.mma_async.sync.aligned.m64n" FAT_STR(N) "k16.f32" AB " {" REGS "}," TAIL  \
                 ";\n}\n"                                                                        \
                 : ACCS                                                                          \
                 : __VA_ARGS__)
/* K0..K5 = N/2 .. N/2 + 5: the operand numbers after the N/2 accumulators. */
#define FAT_WGMMA_SS(N, AB, REGS, ACCS, K0, K1, K2)                                              \
    FAT_WGMMA_ASM(N, AB, REGS, FAT_UNPAREN ACCS, " %" FAT_STR(K0) ", %" FAT_STR(K1) ", p, 1, 1, 0, 0", \
                  K2, "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define FAT_WGMMA_RS(N, AB, REGS, ACCS, K0, K1, K2, K3, K4, K5)                                  \
    FAT_WGMMA_ASM(N, AB, REGS, FAT_UNPAREN ACCS,                                                 \
                  " {%" FAT_STR(K0) ", %" FAT_STR(K1) ", %" FAT_STR(K2) ", %" FAT_STR(K3)         \
                  "}, %" FAT_STR(K4) ", p, 1, 1, 1",                                             \
                  K5, "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
#define FAT_UNPAREN(...) __VA_ARGS__
#define FAT_WGMMA_SHAPE(N, REGS, ACCS, K0, K1, K2, K3, K4, K5)                                   \
    template <> struct Wgmma<N> {                                                                \
        template <typename T>                                                                    \
        static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, \
                                                  int accumulate) {                              \
            if constexpr (kIsHalf<T>) FAT_WGMMA_SS(N, ".f16.f16", REGS, ACCS, K0, K1, K2);       \
            else FAT_WGMMA_SS(N, ".bf16.bf16", REGS, ACCS, K0, K1, K2);                          \
        }                                                                                        \
        template <typename T>                                                                    \
        static __device__ __forceinline__ void rs_mn(float (&d)[N / 2], const uint32_t (&a)[4],  \
                                                     uint64_t b_desc, int accumulate) {          \
            if constexpr (kIsHalf<T>) FAT_WGMMA_RS(N, ".f16.f16", REGS, ACCS, K0, K1, K2, K3, K4, K5); \
            else FAT_WGMMA_RS(N, ".bf16.bf16", REGS, ACCS, K0, K1, K2, K3, K4, K5);              \
        }                                                                                        \
    };

FAT_WGMMA_SHAPE(64, FAT_R0 FAT_R8 FAT_R16 FAT_R24,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24)),
                32, 33, 34, 35, 36, 37)
FAT_WGMMA_SHAPE(72, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32_4,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC4(32)),
                36, 37, 38, 39, 40, 41)
FAT_WGMMA_SHAPE(80, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC8(32)),
                40, 41, 42, 43, 44, 45)
FAT_WGMMA_SHAPE(128, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32 FAT_R40 FAT_R48 FAT_R56,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC8(32), FAT_ACC8(40), FAT_ACC8(48), FAT_ACC8(56)),
                64, 65, 66, 67, 68, 69)
FAT_WGMMA_SHAPE(176, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32 FAT_R40 FAT_R48 FAT_R56 FAT_R64 FAT_R72 FAT_R80,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC8(32), FAT_ACC8(40), FAT_ACC8(48), FAT_ACC8(56), FAT_ACC8(64), FAT_ACC8(72), FAT_ACC8(80)),
                88, 89, 90, 91, 92, 93)
FAT_WGMMA_SHAPE(192, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32 FAT_R40 FAT_R48 FAT_R56 FAT_R64 FAT_R72 FAT_R80 FAT_R88,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC8(32), FAT_ACC8(40), FAT_ACC8(48), FAT_ACC8(56), FAT_ACC8(64), FAT_ACC8(72), FAT_ACC8(80), FAT_ACC8(88)),
                96, 97, 98, 99, 100, 101)
FAT_WGMMA_SHAPE(256, FAT_R0 FAT_R8 FAT_R16 FAT_R24 FAT_R32 FAT_R40 FAT_R48 FAT_R56 FAT_R64 FAT_R72 FAT_R80 FAT_R88 FAT_R96 FAT_R104 FAT_R112 FAT_R120,
                (FAT_ACC8(0), FAT_ACC8(8), FAT_ACC8(16), FAT_ACC8(24), FAT_ACC8(32), FAT_ACC8(40), FAT_ACC8(48), FAT_ACC8(56), FAT_ACC8(64), FAT_ACC8(72), FAT_ACC8(80), FAT_ACC8(88), FAT_ACC8(96), FAT_ACC8(104), FAT_ACC8(112), FAT_ACC8(120)),
                128, 129, 130, 131, 132, 133)

#undef FAT_WGMMA_SHAPE
#undef FAT_UNPAREN
#undef FAT_WGMMA_RS
#undef FAT_WGMMA_SS
#undef FAT_WGMMA_ASM
#undef FAT_STR
#undef FAT_STR_
#undef FAT_R0
#undef FAT_R32_4
#undef FAT_ACC4
#undef FAT_R8
#undef FAT_R16
#undef FAT_R24
#undef FAT_R32
#undef FAT_R40
#undef FAT_R48
#undef FAT_R56
#undef FAT_R64
#undef FAT_R72
#undef FAT_R80
#undef FAT_R88
#undef FAT_R96
#undef FAT_R104
#undef FAT_R112
#undef FAT_R120

} /* namespace sm90 */
} /* namespace fat */
