/*
 * emu_shim.h - host emulation of the CUDA features the sm80 forward and
 * backward use, so the kernels (index logic, pipelines, fragment layouts) run
 * on a CPU.
 * Every CUDA thread is a ucontext fiber; warp collectives (ldmatrix, mma,
 * shuffles) rendezvous all 32 lanes and the last one to arrive computes the
 * result by the PTX ISA fragment layouts; __syncthreads is a CTA barrier.
 * cp.async copies are queued per thread and performed at cp.async.wait_group
 * (lazy mode, catches reads before the wait) or at issue (eager mode).
 */
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <vector>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n)

struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { uint32_t x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

namespace emu {

inline float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ff;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }
    if (e == 31) return bits_f(sign | 0x7f800000u | (m << 13));
    return bits_f(sign | ((e + 112) << 23) | (m << 13));
}
inline uint16_t float_to_half(float f) { /* round to nearest even via double math */
    if (std::isnan(f)) return 0x7e00;
    double a = std::fabs((double)f);
    uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7c00;
    if (a < 6.103515625e-05) { /* subnormal: units of 2^-24 */
        double q = std::nearbyint(a / 5.9604644775390625e-8);
        return sign | (uint16_t)q;
    }
    int ex; double fr = std::frexp(a, &ex); /* a = fr * 2^ex, fr in [0.5,1) */
    double mant = std::nearbyint(fr * 2048.0); /* 11 bits */
    if (mant >= 2048.0) { mant /= 2; ex += 1; }
    int e = ex - 1 + 15;
    if (e >= 31) return sign | 0x7c00;
    return sign | (uint16_t)(e << 10) | (uint16_t)((int)mant - 1024);
}
inline float bf16_to_float(uint16_t h) { return bits_f((uint32_t)h << 16); }
inline uint16_t float_to_bf16(float f) {
    uint32_t x = f_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- fibers ---- */
struct Fiber { ucontext_t ctx; std::vector<char> stack; bool done; };
struct Group { int count = 0; long gen = 0; };
struct Copy { uint32_t dst; const void *src; int bytes; bool valid; };
struct ThreadState {
    std::vector<std::vector<Copy>> groups;
    std::vector<Copy> open;
};
struct Exchange { uint32_t in[32][8]; float fin[32][8]; uint32_t out[32][4]; float fout[32][4]; };

extern std::vector<Fiber> fibers;
extern std::vector<ThreadState> tstate;
extern ucontext_t sched_ctx;
extern int cur, nthreads;
extern unsigned block_x;
extern long progress;
extern Group warp_group[32], cta_group;
extern Exchange wx[32];
extern unsigned char *shared_base;
extern size_t shared_bytes;
extern bool eager_copies;
extern std::function<void()> fiber_body;

struct Range { const char *p; size_t n; };
extern std::vector<Range> buffers;

inline void fail(const char *msg) { fprintf(stderr, "EMU FAILURE: %s (thread %d, block %u)\n", msg, cur, block_x); abort(); }
inline void check_global(const void *p, size_t n) {
    const char *c = (const char *)p;
    for (auto &r : buffers) if (c >= r.p && c + n <= r.p + r.n) return;
    fail("global access outside every tensor");
}
/* shared-memory race detector: per byte, the warp and CTA-barrier epoch of
 * the last write and read; cp.async bytes are pending from issue to wait */
struct Shadow { long w_epoch = -1, r_epoch = -1; short writer = -1, reader = -1; bool pending = false; };
extern std::vector<Shadow> shadow;
extern bool race_check;
inline long epoch();
inline void race(const char *what, uint32_t addr);
inline void note_read(uint32_t addr, int bytes, int w) {
    if (!race_check) return;
    for (int i = 0; i < bytes; ++i) {
        Shadow &s = shadow[addr + i];
        if (s.pending) race("read of a byte with a cp.async in flight", addr + i);
        if (s.w_epoch == epoch() && s.writer != w) race("read after another warp's write without a barrier", addr + i);
        if (s.r_epoch == epoch() && s.reader != w) s.reader = -2; else if (s.r_epoch != epoch()) { s.reader = w; s.r_epoch = epoch(); }
    }
}
inline void note_write(uint32_t addr, int bytes, int w, bool start_pending, bool finish_pending) {
    if (!race_check) return;
    for (int i = 0; i < bytes; ++i) {
        Shadow &s = shadow[addr + i];
        if (!finish_pending) {
            if (s.r_epoch == epoch() && s.reader != w) race("write after another warp's read without a barrier", addr + i);
            if (s.w_epoch == epoch() && s.writer != w) race("write after another warp's write without a barrier", addr + i);
        }
        if (start_pending) { s.pending = true; continue; }
        s.pending = false;
        s.w_epoch = epoch();
        s.writer = w;
    }
}
inline unsigned char *shared_at(uint32_t addr, int bytes, int align) {
    if (addr % align) fail("misaligned shared access");
    if ((size_t)addr + bytes > shared_bytes) fail("shared access out of bounds");
    return shared_base + addr;
}
inline long epoch() { return cta_group.gen; }
inline void race(const char *what, uint32_t addr) { fprintf(stderr, "RACE at shared byte %u: ", addr); fail(what); }
inline void yield() { swapcontext(&fibers[cur].ctx, &sched_ctx); }
inline void arrive_wait(Group &g, int size, const std::function<void()> &last = nullptr) {
    long my = g.gen;
    if (++g.count == size) {
        if (last) last();
        g.count = 0;
        ++g.gen;
        ++progress;
        return;
    }
    while (g.gen == my) yield();
}
inline int lane() { return cur & 31; }
inline int warp() { return cur >> 5; }
inline void warp_collective(const std::function<void()> &last) { arrive_wait(warp_group[warp()], 32, last); }
inline void do_copy(const Copy &c, bool finalize = true) {
    unsigned char *dst = shared_at(c.dst, c.bytes, c.bytes);
    if (finalize) note_write(c.dst, c.bytes, warp(), false, true);
    if (c.valid) { check_global(c.src, c.bytes); memcpy(dst, c.src, c.bytes); }
    else memset(dst, 0, c.bytes);
}
inline float2 read_shared_f2(const float *p) {
    uint32_t addr = (uint32_t)((const unsigned char *)p - shared_base);
    float2 v;
    memcpy(&v, shared_at(addr, 8, 8), 8);
    note_read(addr, 8, warp());
    return v;
}
void run_grid(unsigned grid, int threads, size_t smem_bytes, const std::function<void()> &body);
extern unsigned char fwd_smem[]; /* the forward kernel's dynamic shared memory */
/* cp.async of bytes (4 or 16): pending in the race checker until its group's wait */
inline void cp_async(uint32_t smem_addr, const void *gmem, int bytes, bool valid) {
    Copy c{smem_addr, gmem, bytes, valid};
    shared_at(smem_addr, bytes, bytes);
    note_write(smem_addr, bytes, warp(), true, false);
    if (eager_copies) do_copy(c, false);
    tstate[cur].open.push_back(c);
}
inline void st_shared_u32(uint32_t addr, uint32_t value) {
    memcpy(shared_at(addr, 4, 4), &value, 4);
    note_write(addr, 4, warp(), false, false);
}
inline void ld_shared_v4(uint4 &v, uint32_t addr) {
    memcpy(&v, shared_at(addr, 16, 16), 16);
    note_read(addr, 16, warp());
}

struct Idx { unsigned x, y, z; };
inline Idx thread_idx() { return {(unsigned)cur, 0, 0}; }
inline Idx block_idx() { return {block_x, 0, 0}; }
} /* namespace emu */

/* The device queries of the launchers' block-order choice (pairs_finish_sooner)
 * and of their shared-memory fallbacks: a device of two SMs of 2 CTAs each,
 * so that small causal grids go either way; with emu::smem_per_sm set, as
 * many CTAs as fit it (1 KB reserved each, at most 2), and 1 KB less per CTA. */
namespace emu {
inline int smem_per_sm = 0;       /* bytes; 0: any number of bytes, 2 CTAs */
inline size_t last_fwd_smem = 0;  /* the dynamic shared memory of the last forward grid */
}
typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
inline cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int *value, int attr, int) {
    if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin)
        *value = emu::smem_per_sm ? emu::smem_per_sm - 1024 : 1 << 30;
    else
        *value = 2;
    return cudaSuccess;
}
template <class Kernel> inline cudaError_t cudaFuncSetAttribute(Kernel, int, int) { return cudaSuccess; }
template <class Kernel>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *ctas, Kernel, int, size_t bytes) {
    *ctas = emu::smem_per_sm ? std::min<int>(2, emu::smem_per_sm / (int)(bytes + 1024)) : 2;
    return cudaSuccess;
}

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx())

inline void __syncthreads() { emu::arrive_wait(emu::cta_group, emu::nthreads); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_collective(nullptr); }
inline float __shfl_xor_sync(unsigned, float x, int mask) {
    int l = emu::lane(), w = emu::warp();
    emu::wx[w].fin[l][0] = x;
    emu::warp_collective([w, mask] { for (int i = 0; i < 32; ++i) emu::wx[w].fout[i][0] = emu::wx[w].fin[i ^ mask][0]; });
    return emu::wx[w].fout[l][0];
}
inline int __any_sync(unsigned, int pred) {
    int l = emu::lane(), w = emu::warp();
    emu::wx[w].in[l][0] = pred != 0;
    emu::warp_collective([w] {
        uint32_t any = 0;
        for (int i = 0; i < 32; ++i) any |= emu::wx[w].in[i][0];
        for (int i = 0; i < 32; ++i) emu::wx[w].out[i][0] = any;
    });
    return (int)emu::wx[w].out[l][0];
}
inline float atomicAdd(float *p, float v) { emu::check_global(p, 4); float old = *p; *p = old + v; return old; }

namespace fat {

template <typename T> struct elem;
template <> struct elem<__half> {
    static uint32_t pack(float lo, float hi) { return emu::float_to_half(lo) | ((uint32_t)emu::float_to_half(hi) << 16); }
    static float to_float(__half x) { return emu::half_to_float(x.x); }
    static __half from_float(float x) { return {emu::float_to_half(x)}; }
};
template <> struct elem<__nv_bfloat16> {
    static uint32_t pack(float lo, float hi) { return emu::float_to_bf16(lo) | ((uint32_t)emu::float_to_bf16(hi) << 16); }
    static float to_float(__nv_bfloat16 x) { return emu::bf16_to_float(x.x); }
    static __nv_bfloat16 from_float(float x) { return {emu::float_to_bf16(x)}; }
};

inline void cp_async_16(uint32_t smem_addr, const void *gmem, bool valid) {
    emu::cp_async(smem_addr, gmem, 16, valid);
}
inline void cp_async_commit() {
    auto &s = emu::tstate[emu::cur];
    s.groups.push_back(s.open);
    s.open.clear();
}
template <int Pending> inline void cp_async_wait() {
    auto &s = emu::tstate[emu::cur];
    while ((int)s.groups.size() > Pending) {
        for (auto &c : s.groups.front()) {
            if (!emu::eager_copies) emu::do_copy(c);
            else emu::note_write(c.dst, c.bytes, emu::warp(), false, true);
        }
        s.groups.erase(s.groups.begin());
    }
}
inline uint32_t smem_u32(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    if (c < emu::shared_base || c >= emu::shared_base + emu::shared_bytes) emu::fail("smem_u32 of a non-shared pointer");
    return (uint32_t)(c - emu::shared_base);
}

inline void ldmatrix_impl(uint32_t r[4], uint32_t addr, bool trans) {
    int l = emu::lane(), w = emu::warp();
    emu::wx[w].in[l][0] = addr;
    emu::warp_collective([w, trans] {
        auto &x = emu::wx[w];
        for (int q = 0; q < 4; ++q) {
            uint16_t m[8][8];
            for (int row = 0; row < 8; ++row) {
                memcpy(m[row], emu::shared_at(x.in[8 * q + row][0], 16, 16), 16);
                emu::note_read(x.in[8 * q + row][0], 16, w);
            }
            for (int L = 0; L < 32; ++L) {
                int g = L / 4, t = L % 4;
                uint16_t lo = trans ? m[2 * t][g] : m[g][2 * t];
                uint16_t hi = trans ? m[2 * t + 1][g] : m[g][2 * t + 1];
                x.out[L][q] = lo | ((uint32_t)hi << 16);
            }
        }
    });
    for (int q = 0; q < 4; ++q) r[q] = emu::wx[w].out[l][q];
}
inline void ldmatrix_x4(uint32_t r[4], uint32_t addr) { ldmatrix_impl(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) { ldmatrix_impl(r, addr, true); }

template <typename T> inline float elem_bits_to_float(uint16_t b) { return elem<T>::to_float(T{b}); }

template <typename T> inline void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    int l = emu::lane(), w = emu::warp();
    auto &x = emu::wx[w];
    for (int i = 0; i < 4; ++i) x.in[l][i] = a[i];
    x.in[l][4] = b[0];
    x.in[l][5] = b[1];
    for (int i = 0; i < 4; ++i) x.fin[l][i] = c[i];
    emu::warp_collective([w] {
        auto &x = emu::wx[w];
        float A[16][16], B[16][8], C[16][8];
        auto lo = [](uint32_t v) { return elem_bits_to_float<T>((uint16_t)(v & 0xffff)); };
        auto hi = [](uint32_t v) { return elem_bits_to_float<T>((uint16_t)(v >> 16)); };
        for (int L = 0; L < 32; ++L) {
            int g = L / 4, t = L % 4;
            const uint32_t *in = x.in[L];
            A[g][2 * t] = lo(in[0]); A[g][2 * t + 1] = hi(in[0]);
            A[g + 8][2 * t] = lo(in[1]); A[g + 8][2 * t + 1] = hi(in[1]);
            A[g][2 * t + 8] = lo(in[2]); A[g][2 * t + 9] = hi(in[2]);
            A[g + 8][2 * t + 8] = lo(in[3]); A[g + 8][2 * t + 9] = hi(in[3]);
            B[2 * t][g] = lo(in[4]); B[2 * t + 1][g] = hi(in[4]);
            B[2 * t + 8][g] = lo(in[5]); B[2 * t + 9][g] = hi(in[5]);
            C[g][2 * t] = x.fin[L][0]; C[g][2 * t + 1] = x.fin[L][1];
            C[g + 8][2 * t] = x.fin[L][2]; C[g + 8][2 * t + 1] = x.fin[L][3];
        }
        float Dm[16][8];
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 8; ++j) {
                double acc = C[i][j];
                for (int k = 0; k < 16; ++k) acc += (double)A[i][k] * B[k][j];
                Dm[i][j] = (float)acc;
            }
        for (int L = 0; L < 32; ++L) {
            int g = L / 4, t = L % 4;
            x.fout[L][0] = Dm[g][2 * t]; x.fout[L][1] = Dm[g][2 * t + 1];
            x.fout[L][2] = Dm[g + 8][2 * t]; x.fout[L][3] = Dm[g + 8][2 * t + 1];
        }
    });
    for (int i = 0; i < 4; ++i) c[i] = x.fout[l][i];
}

namespace bwd80 {
inline float exp2_approx(float x) { return exp2f(x); }
inline float tanh_approx(float x) {
    const float e = exp2_approx(x * 2.8853900817779268f);
    return 1.f - 2.f * (1.f / (e + 1.f));
}
inline void cp_async_4(uint32_t smem_addr, const void *gmem, bool valid) {
    emu::cp_async(smem_addr, gmem, 4, valid);
}
inline void st_shared_u32(uint32_t addr, uint32_t value) { emu::st_shared_u32(addr, value); }
} /* namespace bwd80 */
inline float fast_exp2(float x) { return exp2f(x); }
} /* namespace fat */
