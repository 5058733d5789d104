/*
 * sm80_bwd_bench.cu - times tile configurations of the sm80 backward
 * (fat_sm80_bwd.cuh: prep + dkdv + dq convert, non-deterministic) side by
 * side, to choose BwdConfig per head dim.  bf16, batch * seqlen = 16k tokens,
 * hidden 2048 (heads = 2048 / D), non-causal and causal; O and lse come from
 * the sm80 forward.  TFLOPS use FA3's backward count, 2.5 x the forward's
 * 4 B H S^2 D (halved when causal).  Each variant's dq, dk, dv are compared
 * with the first variant's of the same head dim (max abs difference), so a
 * broken configuration shows.  A variant whose shared memory the device
 * lacks prints "unsupported".
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
 *        dev/sm80_bwd_bench.cu csrc/fat_common.c -o /tmp/sm80_bwd_bench
 *   /tmp/sm80_bwd_bench [head_dim seqlen [names]]   (default: the whole grid)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/fat_sm80_bwd.cuh"
#include "cuda/fat_sm80_bwd_workspace.cu"
#include "cuda/fat_sm80_fwd.cuh"
#include "dev_bench.cuh"

/* All tensors (b, s, h, d) contiguous, bf16; lse (b, h, s) fp32. */
struct Problem {
    int b, s, h, d;
    bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    void *workspace;
    size_t workspace_bytes;
};

fat_params params_of(const Problem &pr, int causal) {
    fat_params p = {};
    p.q = pr.q; p.k = pr.k; p.v = pr.v; p.o = pr.o; p.lse = pr.lse;
    p.dout = pr.dout; p.dq = pr.dq; p.dk = pr.dk; p.dv = pr.dv;
    const int64_t row = (int64_t)pr.h * pr.d, batch = row * pr.s;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
    p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = batch;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
    p.do_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = pr.d;
    p.do_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = pr.d;
    p.lse_batch_stride = (int64_t)pr.h * pr.s; p.lse_head_stride = pr.s;
    p.b = pr.b; p.sq = p.sk = pr.s; p.hq = p.hkv = pr.h; p.d = p.d_v = pr.d;
    p.dtype = FAT_BFLOAT16; p.softmax_scale = 1.0 / sqrt((double)pr.d);
    p.causal = causal; p.window_left = p.window_right = -1;
    p.workspace = pr.workspace; p.workspace_bytes = pr.workspace_bytes;
    return p;
}


template <class Cfg> Variant variant(const char *name) {
    return {name, Cfg::D, fat::sm80_bwd_tiles<bf16, Cfg>};
}

/* usage: sm80_bwd_bench [head_dim seqlen [names]]  (default: the whole grid; 0: every
 * head dim / seqlen of it; names: only the variants whose name contains one of
 * these comma-separated substrings) */
int main(int argc, char **argv) {
    const int only_d = argc > 2 ? atoi(argv[1]) : 0, only_s = argc > 2 ? atoi(argv[2]) : 0;
    const char *only_name = argc > 3 ? argv[3] : nullptr; /* comma-separated substrings of the variant names */
    using namespace fat::bwd80;
    /* name: warps, key tiles per warp, split of D, query block, stages; warpmask:
     * BwdTiles::kWarpMask */
    const Variant variants[] = {
        variant<BwdConfig<128>>("d128 default"),
        variant<BwdConfig<128, true>>("d128 default pairs"),
        variant<BwdConfig<128, false, false>>("d128 default no warpmask"),
        variant<BwdConfig<128, true, false>>("d128 default pairs no warpmask"),
        variant<BwdCompact<128>::type>("d128 compact (A100)"),
        variant<BwdTiles<128, 8, 2, 2, 64, 1>>("d128 w8 k2 s2 m64 st1"),
        variant<BwdTiles<128, 8, 2, 4, 128, 2>>("d128 w8 k2 s4 m128 st2"),
        variant<BwdTiles<128, 8, 1, 2, 128, 2>>("d128 w8 k1 s2 m128 st2"),
        variant<BwdTiles<128, 8, 2, 4, 64, 2>>("d128 w8 k2 s4 m64 st2"),
        variant<BwdTiles<128, 4, 2, 2, 64, 1>>("d128 w4 k2 s2 m64 st1"),
        variant<BwdTiles<128, 4, 2, 2, 32, 2>>("d128 w4 k2 s2 m32 st2"),
        variant<BwdTiles<128, 4, 2, 4, 64, 2>>("d128 w4 k2 s4 m64 st2"),
        variant<BwdConfig<64>>("d64 default"),
        variant<BwdConfig<64, true>>("d64 default pairs"),
        variant<BwdConfig<64, false, true>>("d64 default warpmask"),
        variant<BwdConfig<64, true, true>>("d64 default pairs warpmask"),
        variant<BwdTiles<64, 8, 1, 1, 64, 2>>("d64 w8 k1 s1 m64 st2"),
        variant<BwdTiles<64, 8, 1, 1, 128, 2>>("d64 w8 k1 s1 m128 st2"),
        variant<BwdTiles<64, 8, 2, 2, 128, 2>>("d64 w8 k2 s2 m128 st2"),
        variant<BwdTiles<64, 8, 2, 2, 128, 1>>("d64 w8 k2 s2 m128 st1"),
        variant<BwdTiles<64, 8, 2, 2, 64, 2>>("d64 w8 k2 s2 m64 st2"),
        variant<BwdTiles<64, 8, 2, 1, 32, 2>>("d64 w8 k2 s1 m32 st2"),
        variant<BwdTiles<64, 8, 1, 1, 32, 2>>("d64 w8 k1 s1 m32 st2"),
    };
    const int tokens = 16384, hidden = 2048;
    const int seqlens[] = {1024, 2048, 4096, 8192, 16384};
    printf("%-28s %6s %6s %9s %8s %9s %9s %9s\n", "variant", "seqlen", "causal", "ms", "TFLOPS",
           "dq diff", "dk diff", "dv diff");
    for (int d : {128, 64}) {
        for (int s : seqlens) {
            if ((only_d && d != only_d) || (only_s && s != only_s)) continue;
            Problem pr = {tokens / s, s, hidden / d, d};
            const size_t n = (size_t)tokens * hidden;
            for (bf16 **t : {&pr.q, &pr.k, &pr.v, &pr.o, &pr.dout, &pr.dq, &pr.dk, &pr.dv})
                cudaMalloc(t, n * 2);
            cudaMalloc(&pr.lse, (size_t)tokens * pr.h * 4);
            pr.workspace_bytes = fat::sm80_bwd_workspace_bytes(params_of(pr, 0), d);
            cudaMalloc(&pr.workspace, pr.workspace_bytes);
            fill_random<<<1024, 256>>>(pr.q, n, 1); fill_random<<<1024, 256>>>(pr.k, n, 2);
            fill_random<<<1024, 256>>>(pr.v, n, 3); fill_random<<<1024, 256>>>(pr.dout, n, 4);
            for (int causal = 0; causal < 2; ++causal) {
                const fat_params p = params_of(pr, causal);
                const fat_status fwd = d == 128 ? fat::sm80_fwd<bf16, 128>(p, 0)
                                                : fat::sm80_fwd<bf16, 64>(p, 0);
                if (fwd != FAT_OK) { printf("forward failed\n"); return 1; }
                std::vector<float> first[3];
                for (const Variant &v : variants) {
                    if (v.d != d || !name_matches(v.name, only_name)) continue;
                    const fat_status st = v.fn(p, 0);
                    if (st != FAT_OK) {
                        printf("%-28s %6d %6d %s\n", v.name, s, causal,
                               st == FAT_ERR_UNSUPPORTED ? "unsupported" : "launch failed");
                        continue;
                    }
                    cudaDeviceSynchronize();
                    std::vector<float> got[3] = {to_host(pr.dq, n), to_host(pr.dk, n), to_host(pr.dv, n)};
                    float diff[3] = {0, 0, 0};
                    for (int i = 0; i < 3; ++i) {
                        if (first[i].empty()) first[i] = got[i];
                        else diff[i] = max_diff(first[i], got[i]);
                    }
                    const float ms = time_ms(v.fn, p);
                    const double flops = 2.5 * 4.0 * pr.b * pr.h * (double)s * s * d / (causal ? 2 : 1);
                    printf("%-28s %6d %6d %9.3f %8.1f %9.2e %9.2e %9.2e\n", v.name, s, causal, ms,
                           flops / ms / 1e9, diff[0], diff[1], diff[2]);
                }
            }
            for (bf16 *t : {pr.q, pr.k, pr.v, pr.o, pr.dout, pr.dq, pr.dk, pr.dv}) cudaFree(t);
            cudaFree(pr.lse); cudaFree(pr.workspace);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("%s\n", e == cudaSuccess ? "ok" : cudaGetErrorString(e));
    return e != cudaSuccess;
}
