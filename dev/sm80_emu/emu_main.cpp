/*
 * emu_main.cpp - runs the sm80 forward (csrc/cuda/fat_sm80_fwd.cuh, through
 * its own launcher) and backward kernels (fat_sm80_bwd.cuh) on the CPU under
 * emu_shim.h, for odd-sized dense and varlen problems at every compiled head
 * dim: causal, sliding windows, softcap, GQA/MQA, d < D, empty sequences,
 * deterministic and atomic dQ, and tile variants of both passes.  Compares o,
 * lse, dq, dk, dv with a float64 reference (max error over max |ref|; lse
 * absolute), requires exact zeros (lse -inf) where no key / query is visible,
 * and checks that no element outside the outputs' valid rows and columns
 * (strided, padded layouts) was written.  The backward's launch sequence below
 * mirrors fat::sm80_bwd (not compiled here): prep, dkdv, then dq_kernel or the
 * convert.
 */
#include "emu_shim.h"

#include "fat_sm80_bwd.cuh"
#include "fat_sm80_fwd.cuh"

#include <random>
#include <string>

namespace emu {
std::vector<Fiber> fibers;
std::vector<ThreadState> tstate;
ucontext_t sched_ctx;
int cur, nthreads;
unsigned block_x;
long progress;
Group warp_group[32], cta_group;
Exchange wx[32];
unsigned char *shared_base;
size_t shared_bytes;
bool eager_copies;
std::function<void()> fiber_body;
std::vector<Range> buffers;
std::vector<Shadow> shadow;
bool race_check = true;

static void fiber_entry() {
    fiber_body();
    fibers[cur].done = true;
    swapcontext(&fibers[cur].ctx, &sched_ctx);
}

void run_grid(unsigned grid, int threads, size_t smem, const std::function<void()> &body) {
    for (unsigned blk = 0; blk < grid; ++blk) {
        block_x = blk;
        nthreads = threads;
        shared_bytes = smem;
        if (smem) memset(shared_base, 0xff, smem); /* garbage: NaN patterns */
        shadow.assign(smem, Shadow());
        fibers.assign(threads, Fiber());
        tstate.assign(threads, ThreadState());
        for (auto &g : warp_group) g = Group();
        cta_group = Group();
        fiber_body = body;
        for (int t = 0; t < threads; ++t) {
            Fiber &f = fibers[t];
            f.stack.resize(256 * 1024);
            f.done = false;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, fiber_entry, 0);
        }
        int remaining = threads;
        while (remaining > 0) {
            long before = progress;
            int finished = 0;
            for (int t = 0; t < threads; ++t) {
                if (fibers[t].done) continue;
                cur = t;
                swapcontext(&sched_ctx, &fibers[t].ctx);
                if (fibers[t].done) ++finished;
            }
            remaining -= finished;
            if (remaining > 0 && finished == 0 && progress == before) fail("deadlock: barrier never completes");
        }
    }
}
} /* namespace emu */

namespace emu {
alignas(1024) unsigned char fwd_smem[1 << 18];
}
namespace fat { namespace bwd80 {
alignas(1024) unsigned char dkdv_smem[1 << 18];
alignas(1024) unsigned char dq_smem[1 << 18];
} }

/* ---- problem ---- */
struct Problem {
    std::string name;
    bool bf16;
    int b, sq, sk, hq, hkv, d, dv;
    int causal, wl, wr;
    double softcap;
    int deterministic;
    std::vector<int> lens_q, lens_k; /* varlen when not empty */
    double scale_mul = 1.0;          /* on softmax_scale: > 1 moves row maxima, so lazy rescales run */
};

static const uint16_t kCanary = 0x7e7e;

struct Tensor { /* 2-byte elements with strides */
    std::vector<uint16_t> data;
    int64_t batch_stride = 0, row_stride, head_stride;
};

template <typename T> static float to_f(uint16_t b) { return fat::elem<T>::to_float(T{b}); }
template <typename T> static uint16_t from_f(float f) { return fat::elem<T>::from_float(f).x; }

/* Runs the forward with FwdCfg and / or the backward with Cfg (both of head
 * dim Cfg::D) on one problem. */
template <typename T, class Cfg, class FwdCfg>
static bool run_problem(const Problem &pr, uint64_t seed, bool run_fwd, bool run_bwd) {
    constexpr int D = Cfg::D;
    static_assert(FwdCfg::D == D, "one head dim");
    const bool varlen = !pr.lens_q.empty();
    const int B = pr.b;
    std::vector<int> cu_q(B + 1, 0), cu_k(B + 1, 0);
    std::vector<int> Lq(B), Lk(B);
    for (int i = 0; i < B; ++i) {
        Lq[i] = varlen ? pr.lens_q[i] : pr.sq;
        Lk[i] = varlen ? pr.lens_k[i] : pr.sk;
        cu_q[i + 1] = cu_q[i] + Lq[i];
        cu_k[i + 1] = cu_k[i] + Lk[i];
    }
    const int max_q = varlen ? *std::max_element(Lq.begin(), Lq.end()) : pr.sq;
    const int max_k = varlen ? *std::max_element(Lk.begin(), Lk.end()) : pr.sk;
    const int64_t rows_q = varlen ? cu_q[B] : (int64_t)B * pr.sq, rows_k = varlen ? cu_k[B] : (int64_t)B * pr.sk;

    auto make = [&](int heads, int width, int rows_per_batch, int64_t total_rows) {
        Tensor t;
        t.head_stride = width + 8;
        t.row_stride = heads * t.head_stride + 8;
        t.batch_stride = varlen ? 0 : rows_per_batch * t.row_stride + 16;
        size_t n = varlen ? total_rows * t.row_stride : B * t.batch_stride;
        t.data.assign(n + 64, kCanary);
        return t;
    };
    Tensor q = make(pr.hq, pr.d, pr.sq, rows_q), k = make(pr.hkv, pr.d, pr.sk, rows_k),
           v = make(pr.hkv, pr.dv, pr.sk, rows_k), o = make(pr.hq, pr.dv, pr.sq, rows_q),
           dout = make(pr.hq, pr.dv, pr.sq, rows_q), dq = make(pr.hq, pr.d, pr.sq, rows_q),
           dk = make(pr.hkv, pr.d, pr.sk, rows_k), dvt = make(pr.hkv, pr.dv, pr.sk, rows_k);
    auto off = [&](const Tensor &t, int b, int i, int h, int c, bool kside) -> int64_t {
        int64_t start = kside ? cu_k[b] : cu_q[b];
        return varlen ? (start + i) * t.row_stride + (int64_t)h * t.head_stride + c
                      : b * t.batch_stride + (int64_t)i * t.row_stride + (int64_t)h * t.head_stride + c;
    };
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    auto fill = [&](Tensor &t, int heads, int width, bool kside, float amp) {
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < (kside ? Lk[b] : Lq[b]); ++i)
                for (int h = 0; h < heads; ++h)
                    for (int c = 0; c < width; ++c) t.data[off(t, b, i, h, c, kside)] = from_f<T>(amp * uni(rng));
    };
    fill(q, pr.hq, pr.d, false, 1.5f);
    fill(k, pr.hkv, pr.d, true, 1.5f);
    fill(v, pr.hkv, pr.dv, true, 1.f);
    fill(dout, pr.hq, pr.dv, false, 1.f);

    fat_params p;
    memset(&p, 0, sizeof p);
    p.b = B; p.sq = max_q; p.sk = max_k; p.hq = pr.hq; p.hkv = pr.hkv; p.d = pr.d; p.d_v = pr.dv;
    p.dtype = pr.bf16 ? FAT_BFLOAT16 : FAT_FLOAT16;
    p.softmax_scale = 1.0 / std::sqrt((double)pr.d) * 1.3 * pr.scale_mul;
    p.causal = pr.causal; p.window_left = pr.wl; p.window_right = pr.wr; p.softcap = pr.softcap;
    p.deterministic = pr.deterministic;
    int wl, wr;
    fat_effective_window(&p, &wl, &wr);
    const int group = pr.hq / pr.hkv;

    /* forward in float64 */
    const int64_t lse_head_stride = varlen ? rows_q + 3 : pr.sq + 3;
    const int64_t lse_batch_stride = varlen ? 0 : pr.hq * lse_head_stride + 5;
    std::vector<float> lse(varlen ? pr.hq * lse_head_stride + 8 : B * lse_batch_stride + 8, 1234.f);
    auto lse_off = [&](int b, int h, int i) -> int64_t {
        return varlen ? (int64_t)h * lse_head_stride + cu_q[b] + i : b * lse_batch_stride + h * lse_head_stride + i;
    };
    auto visible = [&](int b, int i, int j) {
        int64_t shift = (int64_t)Lk[b] - Lq[b];
        return (wr < 0 || j <= i + shift + wr) && (wl < 0 || j >= i + shift - wl);
    };
    const double scale = p.softmax_scale, cap = p.softcap;
    auto score = [&](int b, int h, int i, int j, double *dt) {
        int hk = h / group;
        double s = 0;
        for (int c = 0; c < pr.d; ++c)
            s += (double)to_f<T>(q.data[off(q, b, i, h, c, false)]) * to_f<T>(k.data[off(k, b, j, hk, c, true)]);
        s *= scale;
        if (cap > 0) { double t = std::tanh(s / cap); if (dt) *dt = 1 - t * t; return cap * t; }
        if (dt) *dt = 1;
        return s;
    };
    /* reference outputs */
    std::vector<char> q_sees(rows_q, 0), k_seen(rows_k, 0); /* structural zeros otherwise */
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < Lq[b]; ++i)
            for (int j = 0; j < Lk[b]; ++j)
                if (visible(b, i, j)) q_sees[cu_q[b] + i] = k_seen[cu_k[b] + j] = 1;
    std::vector<double> rdq((size_t)rows_q * pr.hq * pr.d, 0), rdk((size_t)rows_k * pr.hkv * pr.d, 0),
        rdv((size_t)rows_k * pr.hkv * pr.dv, 0), ro((size_t)rows_q * pr.hq * pr.dv, 0);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < pr.hq; ++h) {
            int hk = h / group, n = Lk[b];
            for (int i = 0; i < Lq[b]; ++i) {
                std::vector<double> s(n), P(n, 0), dt(n);
                double mx = -INFINITY;
                for (int j = 0; j < n; ++j) {
                    s[j] = visible(b, i, j) ? score(b, h, i, j, &dt[j]) : -INFINITY;
                    mx = std::max(mx, s[j]);
                }
                double sum = 0;
                for (int j = 0; j < n; ++j) sum += s[j] == -INFINITY ? 0 : std::exp(s[j] - mx);
                double l = sum > 0 ? mx + std::log(sum) : -INFINITY;
                lse[lse_off(b, h, i)] = (float)l;
                for (int j = 0; j < n; ++j) P[j] = (s[j] == -INFINITY) ? 0 : std::exp(s[j] - (double)(float)l);
                for (int c = 0; c < pr.dv; ++c) {
                    double acc = 0;
                    for (int j = 0; j < n; ++j) acc += P[j] * to_f<T>(v.data[off(v, b, j, hk, c, true)]);
                    o.data[off(o, b, i, h, c, false)] = from_f<T>((float)acc);
                    ro[((cu_q[b] + i) * pr.hq + h) * pr.dv + c] = acc;
                }
                double dot = 0;
                for (int c = 0; c < pr.dv; ++c)
                    dot += (double)to_f<T>(dout.data[off(dout, b, i, h, c, false)]) * to_f<T>(o.data[off(o, b, i, h, c, false)]);
                int64_t rq = cu_q[b] + i; /* flat row (dense: cu_q = b * sq too) */
                for (int j = 0; j < n; ++j) {
                    if (P[j] == 0) continue;
                    double dp = 0;
                    for (int c = 0; c < pr.dv; ++c)
                        dp += (double)to_f<T>(dout.data[off(dout, b, i, h, c, false)]) * to_f<T>(v.data[off(v, b, j, hk, c, true)]);
                    double ds = P[j] * (dp - dot) * dt[j];
                    int64_t rk = cu_k[b] + j;
                    for (int c = 0; c < pr.d; ++c) {
                        rdq[(rq * pr.hq + h) * pr.d + c] += scale * ds * to_f<T>(k.data[off(k, b, j, hk, c, true)]);
                        rdk[(rk * pr.hkv + hk) * pr.d + c] += scale * ds * to_f<T>(q.data[off(q, b, i, h, c, false)]);
                    }
                    for (int c = 0; c < pr.dv; ++c)
                        rdv[(rk * pr.hkv + hk) * pr.dv + c] += P[j] * to_f<T>(dout.data[off(dout, b, i, h, c, false)]);
                }
            }
        }

    /* kernel inputs */
    std::vector<int32_t> cuq32(cu_q.begin(), cu_q.end()), cuk32(cu_k.begin(), cu_k.end());
    p.q = q.data.data(); p.k = k.data.data(); p.v = v.data.data(); p.o = o.data.data();
    p.lse = lse.data(); p.dout = dout.data.data();
    p.dq = dq.data.data(); p.dk = dk.data.data(); p.dv = dvt.data.data();
#define STRIDES(name, t) p.name##_batch_stride = t.batch_stride; p.name##_row_stride = t.row_stride; p.name##_head_stride = t.head_stride;
    STRIDES(q, q) STRIDES(k, k) STRIDES(v, v) STRIDES(o, o) STRIDES(do, dout) STRIDES(dq, dq) STRIDES(dk, dk) STRIDES(dv, dvt)
    p.lse_batch_stride = lse_batch_stride; p.lse_head_stride = lse_head_stride;
    if (varlen) { p.cu_seqlens_q = cuq32.data(); p.cu_seqlens_k = cuk32.data(); p.total_q = rows_q; p.total_k = rows_k; }
    const fat::bwd80::WorkspaceLayout wl_ = fat::bwd80::workspace_layout(p, D);
    std::vector<unsigned char> ws(wl_.total + 256, 0xff);
    p.workspace = ws.data(); p.workspace_bytes = wl_.total;

    /* compare */
    bool ok = true;
    auto check = [&](const char *nm, Tensor &t, const std::vector<double> &ref, int heads, int width, bool kside) {
        std::vector<char> written(t.data.size(), 0);
        double max_ref = 0, max_err = 0;
        long zero_bad = 0, nan_bad = 0;
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < (kside ? Lk[b] : Lq[b]); ++i)
                for (int h = 0; h < heads; ++h)
                    for (int c = 0; c < width; ++c) {
                        int64_t o_ = off(t, b, i, h, c, kside);
                        written[o_] = 1;
                        int64_t flat = (kside ? cu_k[b] : cu_q[b]) + i;
                        double r = ref[(flat * heads + h) * width + c];
                        double x = to_f<T>(t.data[o_]);
                        if (std::isnan(x)) { ++nan_bad; continue; }
                        max_ref = std::max(max_ref, std::fabs(r));
                        max_err = std::max(max_err, std::fabs(x - r));
                        if (!(kside ? k_seen : q_sees)[flat] && x != 0) ++zero_bad;
                    }
        long canary_bad = 0;
        for (size_t i = 0; i < t.data.size(); ++i)
            if (!written[i] && t.data[i] != kCanary) ++canary_bad;
        double rel = max_ref > 0 ? max_err / max_ref : max_err;
        double tol = pr.bf16 ? 3e-2 : 6e-3;
        bool good = rel <= tol && zero_bad == 0 && canary_bad == 0 && nan_bad == 0;
        printf("    %-3s max|ref| %9.3e  max err %9.3e  rel %8.2e  zero_bad %ld  canary_bad %ld  nan %ld  %s\n", nm, max_ref,
               max_err, rel, zero_bad, canary_bad, nan_bad, good ? "ok" : "FAIL");
        ok = ok && good;
    };
    auto check_lse = [&](const std::vector<float> &got) {
        std::vector<char> written(got.size(), 0);
        double max_err = 0;
        long inf_bad = 0, canary_bad = 0;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < pr.hq; ++h)
                for (int i = 0; i < Lq[b]; ++i) {
                    const int64_t o_ = lse_off(b, h, i);
                    written[o_] = 1;
                    const float r = lse[o_], x = got[o_];
                    if (r == -INFINITY || x == -INFINITY) inf_bad += r != x;
                    else max_err = std::max(max_err, std::fabs((double)x - r) / std::max(1.0, std::fabs((double)r)));
                }
        for (size_t i = 0; i < got.size(); ++i)
            if (!written[i] && got[i] != 1234.f) ++canary_bad;
        const bool good = max_err <= 1e-3 && inf_bad == 0 && canary_bad == 0;
        printf("    lse max err %8.2e (relative to max(1, |lse|))  inf_bad %ld  canary_bad %ld  %s\n", max_err,
               inf_bad, canary_bad, good ? "ok" : "FAIL");
        ok = ok && good;
    };
    if (run_fwd) {
        Tensor o2 = make(pr.hq, pr.dv, pr.sq, rows_q);
        std::vector<float> lse2(lse.size(), 1234.f);
        fat_params pf = p;
        pf.o = o2.data.data();
        pf.lse = lse2.data();
        emu::buffers.clear();
        for (Tensor *t : {&q, &k, &v, &o2}) emu::buffers.push_back({(const char *)t->data.data(), t->data.size() * 2});
        emu::buffers.push_back({(const char *)lse2.data(), lse2.size() * 4});
        emu::buffers.push_back({(const char *)cuq32.data(), cuq32.size() * 4});
        emu::buffers.push_back({(const char *)cuk32.data(), cuk32.size() * 4});
        printf("[%s] D=%d %s  forward tiles w%d mt%d n%d qreg %d exp2 %d lazy %d split %d subn %d ctas %d pairs %s\n",
               pr.name.c_str(), D, pr.bf16 ? "bf16" : "fp16", FwdCfg::kWarps, FwdCfg::kMTiles,
               FwdCfg::kBlockN, FwdCfg::kQInRegs, FwdCfg::kExp2Fma, FwdCfg::kLazyRescale,
               FwdCfg::kSplitSoftcap, FwdCfg::kSubN, FwdCfg::kMinBlocksPerSm,
               FwdCfg::kAlwaysPairs ? "always" : FwdCfg::kPairs ? "modelled" : "no");
        /* the default through the dispatcher's entry (with its shared-memory fallback) */
        const fat_status st = std::is_same<FwdCfg, fat::Sm80FwdConfig<D>>::value
                                  ? fat::sm80_fwd<T, D>(pf, nullptr)
                                  : fat::sm80_fwd_tiles<T, FwdCfg>(pf, nullptr);
        if (st != FAT_OK) {
            printf("    launcher returned %d  FAIL\n", (int)st);
            ok = false;
        }
        printf("    ran with %zu bytes of shared memory a CTA\n", emu::last_fwd_smem);
        check("o", o2, ro, pr.hq, pr.dv, false);
        check_lse(lse2);
    }
    if (!run_bwd) return ok;
    emu::buffers.clear();
    for (Tensor *t : {&q, &k, &v, &o, &dout, &dq, &dk, &dvt}) emu::buffers.push_back({(const char *)t->data.data(), t->data.size() * 2});
    emu::buffers.push_back({(const char *)lse.data(), lse.size() * 4});
    emu::buffers.push_back({(const char *)ws.data(), wl_.total});
    emu::buffers.push_back({(const char *)cuq32.data(), cuq32.size() * 4});
    emu::buffers.push_back({(const char *)cuk32.data(), cuk32.size() * 4});

    /* the launcher's sequence (fat::sm80_bwd without the CUDA runtime) */
    const fat::bwd80::BwdArgs args = fat::bwd80::tile_args<Cfg>(p);
    const unsigned row_blocks = (unsigned)fat::bwd80::row_kernel_ctas<D>(args);
    constexpr int row_threads = fat::bwd80::kRowThreads;
    emu::shared_base = fat::bwd80::dkdv_smem;
    emu::run_grid(row_blocks, row_threads, 0, [&] { fat::bwd80::bwd_prep_kernel<T, D>(args); });
    const unsigned kv_blocks = (unsigned)fat::bwd80::dkdv_ctas<Cfg>(args);
    emu::run_grid(kv_blocks, Cfg::kThreads, fat::bwd80::DkdvSmem<Cfg>::kBytes, [&] { fat::bwd80::dkdv_kernel<T, Cfg>(args); });
    if (p.deterministic) {
        emu::shared_base = fat::bwd80::dq_smem;
        const unsigned q_blocks = (unsigned)((p.sq + Cfg::kQBlockM - 1) / Cfg::kQBlockM * p.hq * p.b);
        emu::run_grid(q_blocks, Cfg::kQThreads, fat::bwd80::DqSmem<Cfg>::kBytes, [&] { fat::bwd80::dq_kernel<T, Cfg>(args); });
    } else {
        emu::run_grid(row_blocks, row_threads, 0, [&] { fat::bwd80::bwd_dq_convert_kernel<T, D>(args); });
    }

    printf("[%s] D=%d %s  tiles w%d k%d s%d m%d st%d pairs %d warpmask %d (%u key-block CTAs)\n", pr.name.c_str(), D,
           pr.bf16 ? "bf16" : "fp16", Cfg::kWarps, Cfg::kKeyTiles, Cfg::kSplitD, Cfg::kBlockM, Cfg::kStages,
           (int)args.paired, (int)Cfg::kWarpMask, kv_blocks);
    check("dq", dq, rdq, pr.hq, pr.d, false);
    check("dk", dk, rdk, pr.hkv, pr.d, true);
    check("dv", dvt, rdv, pr.hkv, pr.dv, true);
    return ok;
}

template <class Cfg, class FwdCfg = fat::Sm80FwdConfig<Cfg::D>>
static bool run_both(const Problem &pr, uint64_t seed, bool run_fwd, bool run_bwd) {
    return pr.bf16 ? run_problem<__nv_bfloat16, Cfg, FwdCfg>(pr, seed, run_fwd, run_bwd)
                   : run_problem<__half, Cfg, FwdCfg>(pr, seed, run_fwd, run_bwd);
}
template <class Cfg> static bool run_both(const Problem &pr, uint64_t seed) { /* backward variant */
    return run_both<Cfg>(pr, seed, false, true);
}
template <int D> static bool run_both(const Problem &pr, uint64_t seed) { /* both defaults */
    return run_both<fat::bwd80::BwdConfig<D>>(pr, seed, true, true);
}
template <class FwdCfg> static bool run_fwd(const Problem &pr, uint64_t seed) { /* forward variant */
    return run_both<fat::bwd80::BwdConfig<FwdCfg::D>, FwdCfg>(pr, seed, true, false);
}

/* Tile variants of dev/sm80_fwd_bench.cu (Case::fwd_variant = 1 + index). */
using fat::Sm80FwdTiles;
static bool run_fwd_variant(int D, int v, const Problem &pr, uint64_t seed) {
    using namespace fat;
    if (D == 128 && v == 0) return run_fwd<Sm80FwdTiles<128, 4, 2, 32>>(pr, seed); /* log2-domain scores */
    if (D == 128 && v == 1) return run_fwd<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma | kFwdSplitSoftcap>>(pr, seed);
    if (D == 128 && v == 2) return run_fwd<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale | kFwdHalfS>>(pr, seed);
    if (D == 128 && v == 3) return run_fwd<Sm80FwdTiles<128, 8, 1, 64, true>>(pr, seed);
    if (D == 128 && v == 4)
        return run_fwd<Sm80FwdTiles<128, 4, 1, 32, true, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>(pr, seed);
    if (D == 64 && v == 0) return run_fwd<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale>>(pr, seed);
    if (D == 64 && v == 1)
        return run_fwd<Sm80FwdTiles<64, 8, 1, 64, true, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>(pr, seed);
    if (D == 128 && v == 5) return run_fwd<Sm80FwdConfig<128, kFwdAlwaysPairs>>(pr, seed);
    if (D == 64 && v == 2) return run_fwd<Sm80FwdConfig<64, kFwdAlwaysPairs>>(pr, seed);
    if (D == 128 && v == 6) /* the default before kFwdEarlyK */
        return run_fwd<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs>>(pr, seed);
    if (D == 64 && v == 3) return run_fwd<Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale | kFwdEarlyK>>(pr, seed);
    if (D == 128 && v == 7) /* two K/V buffer pairs */
        return run_fwd<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdKvRing>>(pr, seed);
    if (D == 64 && v == 4) return run_fwd<Sm80FwdCompact<64>::type>(pr, seed);
    if (D == 64 && v == 5) { /* SMs of sm_86's 100 KB: the default falls back to Sm80FwdCompact */
        emu::smem_per_sm = 100 * 1024;
        const bool ok = run_fwd<Sm80FwdConfig<64>>(pr, seed);
        emu::smem_per_sm = 0;
        const bool compact = emu::last_fwd_smem == Sm80FwdCompact<64>::type::kSmemBytes;
        if (!compact) printf("    not the compact configuration  FAIL\n");
        return ok && compact;
    }
    if (D == 128 && v == 8) return run_fwd<Sm80FwdCompact<128>::type>(pr, seed);
    if (D == 128 && v == 9) { /* an A100's 164 KB: the D = 128 default falls back too */
        emu::smem_per_sm = 164 * 1024;
        const bool ok = run_fwd<Sm80FwdConfig<128>>(pr, seed);
        emu::smem_per_sm = 0;
        const bool compact = emu::last_fwd_smem == Sm80FwdCompact<128>::type::kSmemBytes;
        if (!compact) printf("    not the compact configuration  FAIL\n");
        return ok && compact;
    }
    return false;
}

/* Tile variants of dev/sm80_bwd_bench.cu (Case::variant = 1 + index). */
using fat::bwd80::BwdTiles;
static bool run_variant(int D, int v, const Problem &pr, uint64_t seed) {
    if (D == 128 && v == 0) return run_both<BwdTiles<128, 8, 2, 2, 64, 1>>(pr, seed);
    if (D == 128 && v == 1) return run_both<BwdTiles<128, 8, 2, 4, 128, 2>>(pr, seed);
    if (D == 128 && v == 2) return run_both<BwdTiles<128, 8, 1, 2, 128, 2>>(pr, seed);
    if (D == 128 && v == 3) return run_both<fat::bwd80::BwdCompact<128>::type>(pr, seed);
    if (D == 64 && v == 0) return run_both<BwdTiles<64, 8, 2, 2, 128, 1>>(pr, seed);
    if (D == 64 && v == 1) return run_both<BwdTiles<64, 8, 1, 1, 128, 2>>(pr, seed);
    if (D == 64 && v == 2) return run_both<BwdTiles<64, 8, 1, 1, 64, 2>>(pr, seed);
    if (D == 128 && v == 4) return run_both<fat::bwd80::BwdConfig<128, true>>(pr, seed);
    if (D == 64 && v == 3) return run_both<fat::bwd80::BwdConfig<64, true>>(pr, seed);
    if (D == 128 && v == 5) return run_both<fat::bwd80::BwdConfig<128, false, true>>(pr, seed);
    if (D == 128 && v == 6) return run_both<fat::bwd80::BwdConfig<128, true, true>>(pr, seed);
    if (D == 64 && v == 4) return run_both<fat::bwd80::BwdConfig<64, false, true>>(pr, seed);
    if (D == 64 && v == 5) return run_both<fat::bwd80::BwdConfig<64, true, true>>(pr, seed);
    return false;
}

static bool run_d(int D, int variant, int fwd_variant, const Problem &pr, uint64_t seed) {
    if (fwd_variant > 0) return run_fwd_variant(D, fwd_variant - 1, pr, seed);
    if (variant > 0) return run_variant(D, variant - 1, pr, seed);
    switch (D) {
    case 32: return run_both<32>(pr, seed);
    case 64: return run_both<64>(pr, seed);
    case 96: return run_both<96>(pr, seed);
    case 128: return run_both<128>(pr, seed);
    case 192: return run_both<192>(pr, seed);
    case 256: return run_both<256>(pr, seed);
    }
    return false;
}

int main(int argc, char **argv) {
    emu::eager_copies = getenv("EMU_EAGER") != nullptr;
    const char *only = getenv("EMU_ONLY");
    struct Case { int D; Problem pr; int variant = 0; int fwd_variant = 0; };
    std::vector<Case> cases = {
        {64, {"dense causal gqa", false, 2, 70, 77, 4, 2, 64, 64, 1, -1, -1, 0, 0, {}, {}}},
        {64, {"dense causal gqa det", false, 2, 70, 77, 4, 2, 64, 64, 1, -1, -1, 0, 1, {}, {}}},
        {32, {"dense sq>sk causal", true, 1, 150, 40, 2, 1, 32, 32, 1, -1, -1, 0, 0, {}, {}}},
        {32, {"dense sq>sk causal det", true, 1, 150, 40, 2, 1, 32, 32, 1, -1, -1, 0, 1, {}, {}}},
        {96, {"dense window softcap d<D", false, 1, 90, 200, 2, 2, 88, 80, 0, 30, 7, 20.0, 0, {}, {}}},
        {96, {"dense window softcap d<D det", false, 1, 90, 200, 2, 2, 88, 80, 0, 30, 7, 20.0, 1, {}, {}}},
        {128, {"varlen window", true, 3, 0, 0, 2, 1, 120, 104, 0, 20, 5, 0, 0, {5, 130, 64}, {17, 100, 64}}},
        {128, {"varlen window det", true, 3, 0, 0, 2, 1, 120, 104, 0, 20, 5, 0, 1, {5, 130, 64}, {17, 100, 64}}},
        {128, {"varlen causal empty seqs", false, 4, 0, 0, 3, 3, 128, 128, 1, -1, -1, 0, 0, {0, 33, 70, 9}, {12, 0, 129, 1}}},
        {128, {"varlen causal empty seqs det", false, 4, 0, 0, 3, 3, 128, 128, 1, -1, -1, 0, 1, {0, 33, 70, 9}, {12, 0, 129, 1}}},
        {192, {"dense noncausal mqa", true, 1, 67, 130, 4, 1, 192, 184, 0, -1, -1, 0, 0, {}, {}}},
        {192, {"dense noncausal mqa det", true, 1, 67, 130, 4, 1, 192, 184, 0, -1, -1, 0, 1, {}, {}}},
        {256, {"dense causal softcap", false, 2, 65, 65, 2, 2, 256, 248, 1, -1, -1, 15.0, 0, {}, {}}},
        {256, {"dense causal softcap det", false, 2, 65, 65, 2, 2, 256, 248, 1, -1, -1, 15.0, 1, {}, {}}},
        {64, {"dense tiny", false, 1, 1, 1, 1, 1, 64, 64, 1, -1, -1, 0, 0, {}, {}}},
        {64, {"dense left window only", true, 1, 100, 60, 2, 1, 56, 64, 0, 10, -1, 0, 0, {}, {}}},
        {64, {"dense multi-block gqa3", false, 1, 300, 260, 3, 1, 64, 64, 0, -1, -1, 0, 0, {}, {}}},
        {64, {"dense multi-block gqa3 causal det", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 1, {}, {}}},
        {32, {"dense right window only fp16 det", false, 2, 77, 140, 2, 2, 32, 24, 0, -1, 12, 0, 1, {}, {}}},
        {32, {"dense right window only fp16", false, 2, 77, 140, 2, 2, 32, 24, 0, -1, 12, 0, 0, {}, {}}},
        {192, {"dense window softcap fp16", false, 1, 100, 90, 2, 1, 184, 192, 0, 40, 3, 10.0, 0, {}, {}}},
        {192, {"dense window softcap fp16 det", false, 1, 100, 90, 2, 1, 184, 192, 0, 40, 3, 10.0, 1, {}, {}}},
        {256, {"varlen bf16 causal", true, 2, 0, 0, 2, 1, 256, 256, 1, -1, -1, 0, 0, {70, 3}, {140, 66}}},
        {256, {"varlen bf16 causal det", true, 2, 0, 0, 2, 1, 256, 256, 1, -1, -1, 0, 1, {70, 3}, {140, 66}}},
        {96, {"varlen fp16 mixed", false, 3, 0, 0, 4, 2, 96, 96, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}},
        {96, {"varlen fp16 mixed det", false, 3, 0, 0, 4, 2, 96, 96, 0, -1, -1, 5.0, 1, {129, 1, 64}, {1, 129, 65}}},
        /* tile variants on the multi-block / masked cases */
        {128, {"var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 1},
        {128, {"var varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 1},
        {128, {"var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 2},
        {128, {"var varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 2},
        {128, {"var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 3},
        /* BwdCompact<128> (devices with less shared memory than BwdConfig<128> needs) */
        {128, {"compact dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 4},
        {128, {"compact varlen window softcap det", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 1, {5, 130, 64}, {17, 100, 64}}, 4},
        /* forward tile variants (the default forward runs on every case above without a variant) */
        {128, {"fwd var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 1},
        {128, {"fwd var varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 1},
        {128, {"fwd var varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 2},
        {128, {"fwd var dense noncausal", true, 2, 97, 150, 2, 2, 128, 128, 0, -1, -1, 0, 0, {}, {}}, 0, 2},
        {128, {"fwd var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 3},
        {128, {"fwd var varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 4},
        {128, {"fwd var dense causal gqa", false, 1, 200, 230, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 5},
        {64, {"fwd var dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 0, 1},
        {64, {"fwd var varlen fp16 mixed softcap", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 0, 1},
        {64, {"fwd var dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 0, 2},
        {64, {"fwd var varlen fp16 mixed softcap", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 0, 2},
        {64, {"var dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 1},
        {64, {"var varlen fp16 mixed", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 1},
        {64, {"var dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 2},
        {64, {"var dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 3},
        {64, {"var varlen fp16 mixed", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 3},
        /* pairs forward (Sm80FwdConfig<D, kFwdAlwaysPairs>) and backward (BwdConfig<D, true>) */
        {128, {"pairs dense causal gqa odd blocks", false, 1, 300, 330, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 6},
        {128, {"pairs dense causal gqa odd blocks", false, 1, 300, 330, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 5},
        {128, {"pairs dense sq>sk causal", true, 2, 400, 150, 2, 1, 128, 128, 1, -1, -1, 0, 0, {}, {}}, 0, 6},
        {128, {"pairs dense sq>sk causal", true, 2, 400, 150, 2, 1, 128, 128, 1, -1, -1, 0, 0, {}, {}}, 5},
        {128, {"pairs varlen causal empty seqs det", false, 4, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 1, {0, 300, 70, 9}, {12, 0, 390, 260}}, 0, 6},
        {128, {"pairs varlen causal empty seqs det", false, 4, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 1, {0, 300, 70, 9}, {12, 0, 390, 260}}, 5},
        {64, {"pairs dense sk>sq causal softcap", true, 1, 200, 500, 2, 2, 64, 64, 1, -1, -1, 8.0, 0, {}, {}}, 0, 3},
        {64, {"pairs dense sk>sq causal softcap", true, 1, 200, 500, 2, 2, 64, 64, 1, -1, -1, 8.0, 0, {}, {}}, 4},
        {64, {"pairs dense right window only gqa det", false, 2, 300, 270, 4, 2, 64, 56, 0, -1, 12, 0, 1, {}, {}}, 0, 3},
        {64, {"pairs dense right window only gqa det", false, 2, 300, 270, 4, 2, 64, 56, 0, -1, 12, 0, 1, {}, {}}, 4},
        {64, {"pairs varlen causal fp16", false, 3, 0, 0, 2, 1, 64, 64, 1, -1, -1, 0, 0, {390, 1, 129}, {390, 64, 300}}, 0, 3},
        {64, {"pairs varlen causal fp16", false, 3, 0, 0, 2, 1, 64, 64, 1, -1, -1, 0, 0, {390, 1, 129}, {390, 64, 300}}, 4},
        /* K_{j+1} loaded after the softmax (D = 128 without kFwdEarlyK) or right after S (D = 64 n96 with it) */
        {128, {"latek dense sq>sk causal", true, 2, 400, 150, 2, 1, 128, 128, 1, -1, -1, 0, 0, {}, {}}, 0, 7},
        {128, {"latek varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 7},
        {64, {"earlyk dense sk>sq causal softcap", true, 1, 200, 500, 2, 2, 64, 64, 1, -1, -1, 8.0, 0, {}, {}}, 0, 4},
        {64, {"earlyk varlen fp16 mixed", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 0, 4},
        /* the D = 128 forward with two K/V buffer pairs and the D = 64 compact one (one pair, 96 keys) */
        {128, {"ring pairs dense causal gqa odd blocks", false, 1, 300, 330, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 8},
        {128, {"ring varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 8},
        {128, {"ring varlen causal empty seqs", false, 4, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 1, {0, 300, 70, 9}, {12, 0, 390, 260}}, 0, 8},
        {64, {"fwd compact dense sk>sq causal softcap", true, 1, 200, 500, 2, 2, 64, 64, 1, -1, -1, 8.0, 0, {}, {}}, 0, 5},
        {64, {"fwd compact varlen fp16 mixed", false, 3, 0, 0, 4, 2, 64, 64, 0, -1, -1, 5.0, 0, {129, 1, 64}, {1, 129, 65}}, 0, 5},
        {64, {"fwd compact dense multi-block gqa3 causal", true, 1, 300, 260, 3, 1, 64, 48, 1, -1, -1, 0, 0, {}, {}}, 0, 5},
        {64, {"fwd compact fallback dense causal gqa", false, 1, 300, 330, 4, 2, 64, 64, 1, -1, -1, 0, 0, {}, {}}, 0, 6},
        /* large scores: lazy rescales with a nonzero correction (the D = 128 default rescales O
         * before the exponentials, kFwdRescaleFirst) */
        {128, {"large scores dense gqa", true, 1, 200, 700, 4, 2, 128, 128, 0, -1, -1, 0, 0, {}, {}, 8.0}},
        {128, {"large scores varlen causal", false, 3, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 0, {390, 1, 129}, {700, 64, 300}, 8.0}},
        {64, {"large scores dense causal", false, 2, 300, 700, 2, 1, 64, 64, 1, -1, -1, 0, 0, {}, {}, 8.0}},
        {64, {"large scores dense window", true, 1, 250, 600, 2, 2, 64, 56, 0, 200, 90, 0, 0, {}, {}, 8.0}},
        {64, {"fwd compact large scores dense", true, 1, 200, 700, 2, 1, 64, 64, 0, -1, -1, 0, 0, {}, {}, 8.0}, 0, 5},
        /* the D = 128 compact forward (early K load, one K/V pair) and its fallback */
        {128, {"fwd compact pairs dense causal gqa odd blocks", false, 1, 300, 330, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 0, 9},
        {128, {"fwd compact varlen window softcap", true, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 0, 9},
        {128, {"fwd compact large scores dense gqa", true, 1, 200, 700, 4, 2, 128, 128, 0, -1, -1, 0, 0, {}, {}, 8.0}, 0, 9},
        {128, {"fwd compact fallback dense causal gqa", false, 1, 300, 330, 4, 2, 128, 128, 1, -1, -1, 0, 0, {}, {}}, 0, 10},
        /* per-warp masks of the backward (BwdConfig<D, kPairs, true>): causal with sq != sk,
         * windows cutting one or both sides of a warp tile, sequence ends inside blocks */
        {128, {"warpmask dense causal sq<sk gqa", false, 2, 97, 200, 4, 2, 128, 128, 1, -1, -1, 0, 0, {}, {}}, 6},
        {128, {"warpmask dense causal sq>sk", true, 1, 200, 97, 2, 1, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 6},
        {128, {"warpmask dense causal multi-block softcap", true, 1, 300, 300, 2, 1, 128, 128, 1, -1, -1, 8.0, 0, {}, {}}, 6},
        {128, {"warpmask dense narrow window", false, 1, 300, 260, 2, 2, 128, 128, 0, 40, 10, 0, 0, {}, {}}, 6},
        {128, {"warpmask dense left window only det", true, 1, 200, 330, 2, 1, 120, 128, 0, 70, -1, 0, 1, {}, {}}, 6},
        {128, {"warpmask dense right window only", false, 1, 230, 200, 2, 1, 128, 128, 0, -1, 20, 0, 0, {}, {}}, 6},
        {128, {"warpmask varlen causal", true, 5, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 0, {97, 200, 1, 0, 130}, {200, 97, 64, 5, 130}}, 6},
        {128, {"warpmask varlen window softcap", false, 3, 0, 0, 2, 1, 120, 128, 0, 20, 5, 8.0, 0, {5, 130, 64}, {17, 100, 64}}, 6},
        {128, {"warpmask pairs dense causal gqa odd blocks", false, 1, 300, 330, 4, 2, 128, 120, 1, -1, -1, 0, 0, {}, {}}, 7},
        {128, {"warpmask pairs varlen causal", true, 4, 0, 0, 2, 1, 128, 128, 1, -1, -1, 0, 0, {0, 300, 97, 9}, {12, 0, 390, 200}}, 7},
        {64, {"warpmask dense causal sq<sk gqa", false, 2, 97, 200, 4, 2, 64, 64, 1, -1, -1, 0, 0, {}, {}}, 5},
        {64, {"warpmask dense causal sq>sk softcap", true, 1, 200, 97, 2, 1, 64, 56, 1, -1, -1, 8.0, 0, {}, {}}, 5},
        {64, {"warpmask dense narrow window", true, 1, 300, 260, 2, 2, 64, 64, 0, 40, 10, 0, 0, {}, {}}, 5},
        {64, {"warpmask dense left window only", false, 1, 200, 330, 2, 1, 64, 64, 0, 70, -1, 0, 0, {}, {}}, 5},
        {64, {"warpmask varlen right window only det", false, 3, 0, 0, 2, 1, 64, 64, 0, -1, 20, 0, 1, {97, 200, 1}, {200, 97, 64}}, 5},
        {64, {"warpmask pairs dense causal", false, 1, 300, 330, 2, 1, 64, 64, 1, -1, -1, 0, 0, {}, {}}, 6},
        {64, {"warpmask pairs varlen causal fp16", false, 3, 0, 0, 2, 1, 64, 64, 1, -1, -1, 0, 0, {390, 1, 129}, {390, 64, 300}}, 6},
    };
    int failures = 0, n = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        if (only && cases[i].pr.name.find(only) == std::string::npos) continue;
        ++n;
        if (!run_d(cases[i].D, cases[i].variant, cases[i].fwd_variant, cases[i].pr, 1000 + i)) ++failures;
    }
    printf("%d passed, %d failed\n", n - failures, failures);
    return failures != 0;
}
