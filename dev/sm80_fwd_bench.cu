/*
 * sm80_fwd_bench.cu - times tile configurations of the sm80 forward kernel
 * (fat_sm80_fwd.cuh) side by side, to choose Sm80FwdConfig per head dim.
 * bf16, batch * seqlen = 16k tokens, hidden 2048 (heads = 2048 / D),
 * non-causal and causal; each variant's output is compared with the first
 * variant's (max abs difference) so a broken configuration shows.
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
 *        dev/sm80_fwd_bench.cu csrc/fat_common.c -o /tmp/sm80_fwd_bench
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/fat_sm80_fwd.cuh"
#include "dev_bench.cuh"

struct Problem {
    int b, s, h, d;
    bf16 *q, *k, *v, *o;
    float *lse;
};

fat_params params_of(const Problem &pr, int causal) {
    fat_params p = {};
    p.q = pr.q; p.k = pr.k; p.v = pr.v; p.o = pr.o; p.lse = pr.lse;
    const int64_t row = (int64_t)pr.h * pr.d, batch = row * pr.s;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = pr.d;
    p.lse_batch_stride = (int64_t)pr.h * pr.s; p.lse_head_stride = pr.s;
    p.b = pr.b; p.sq = p.sk = pr.s; p.hq = p.hkv = pr.h; p.d = p.d_v = pr.d;
    p.dtype = FAT_BFLOAT16; p.softmax_scale = 1.0 / sqrt((double)pr.d);
    p.causal = causal; p.window_left = p.window_right = -1;
    return p;
}


template <class Cfg> fat_status launch(const fat_params &p, cudaStream_t stream) {
    return fat::sm80_fwd_tiles<bf16, Cfg>(p, stream);
}

template <class Cfg> Variant variant(const char *name) {
    return {name, Cfg::D, launch<Cfg>};
}


/* usage: sm80_fwd_bench [head_dim seqlen [names]]  (default: the whole grid; 0: every
 * head dim / seqlen of it; names: only the variants whose name contains one of
 * these comma-separated substrings) */
int main(int argc, char **argv) {
    const int only_d = argc > 2 ? atoi(argv[1]) : 0, only_s = argc > 2 ? atoi(argv[2]) : 0;
    const char *only_name = argc > 3 ? argv[3] : nullptr; /* comma-separated substrings of the variant names */
    using namespace fat;
    const Variant variants[] = {
        variant<Sm80FwdConfig<128>>("d128 default"),
        variant<Sm80FwdConfig<128, kFwdAlwaysPairs>>("d128 default pairs"),
        variant<Sm80FwdCompact<128>::type>("d128 default compact"),
        variant<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdKvRing>>("d128 default no rsfirst"),
        variant<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdEarlyK | kFwdRescaleFirst>>("d128 default compact rsfirst"),
        variant<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs>>("d128 default compact latek"),
        variant<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdHalfS | kFwdKvRing>>("d128 w4 mt2 n64 lazy halfs ring pairs"),
        variant<Sm80FwdTiles<128, 4, 2, 32, false, kFwdExp2Fma | kFwdLazyRescale | kFwdPairs | kFwdKvRing | kFwdRescaleFirst>>("d128 w4 mt2 n32 lazy ring pairs rsfirst"),
        variant<Sm80FwdTiles<128, 4, 2, 32>>("d128 w4 mt2 n32"),
        variant<Sm80FwdTiles<128, 4, 2, 64>>("d128 w4 mt2 n64"),
        variant<Sm80FwdTiles<128, 8, 1, 64>>("d128 w8 mt1 n64"),
        variant<Sm80FwdTiles<128, 8, 1, 64, true>>("d128 w8 mt1 n64 qreg"),
        variant<Sm80FwdTiles<128, 8, 1, 32, true>>("d128 w8 mt1 n32 qreg"),
        variant<Sm80FwdTiles<128, 4, 1, 64, true>>("d128 w4 mt1 n64 qreg"),
        variant<Sm80FwdTiles<128, 4, 2, 32, false, kFwdExp2Fma>>("d128 w4 mt2 n32 exp2"),
        variant<Sm80FwdTiles<128, 4, 2, 32, false, kFwdExp2Fma | kFwdLazyRescale>>("d128 w4 mt2 n32 exp2 lazy"),
        variant<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma>>("d128 w4 mt2 n64 exp2"),
        variant<Sm80FwdTiles<128, 4, 2, 48, false, kFwdExp2Fma>>("d128 w4 mt2 n48 exp2"),
        variant<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma | kFwdSplitSoftcap>>("d128 w4 mt2 n64 exp2 split"),
        variant<Sm80FwdTiles<128, 4, 2, 32, false, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap>>("d128 w4 mt2 n32 exp2 lazy split"),
        variant<Sm80FwdTiles<128, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale | kFwdHalfS>>("d128 w4 mt2 n64 exp2 lazy halfs"),
        variant<Sm80FwdTiles<128, 4, 1, 64, true, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>("d128 w4 mt1 n64 qreg exp2 lazy split 3cta"),
        variant<Sm80FwdTiles<128, 4, 1, 32, true, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>("d128 w4 mt1 n32 qreg exp2 lazy split 3cta"),
        variant<Sm80FwdConfig<64>>("d64 default"),
        variant<Sm80FwdConfig<64, kFwdAlwaysPairs>>("d64 default pairs"),
        variant<Sm80FwdCompact<64>::type>("d64 default compact"),
        variant<Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale>>("d64 default compact no rsfirst"),
        variant<Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale | kFwdEarlyK>>("d64 default compact earlyk"),
        variant<Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale | kFwdKvRing>>("d64 default compact ring"),
        variant<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale | kFwdHalfS>>("d64 default one pair"),
        variant<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale | kFwdRescaleFirst>>("d64 w4 mt2 n128 lazy rsfirst"),
        variant<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale | kFwdHalfS | kFwdKvRing>>("d64 default halfs"),
        variant<Sm80FwdTiles<64, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale | kFwdKvRing>>("d64 w4 mt2 n64 lazy ring"),
        variant<Sm80FwdTiles<64, 4, 2, 96, false, kFwdExp2Fma | kFwdLazyRescale | kFwdHalfS>>("d64 w4 mt2 n96 lazy halfs"),
        variant<Sm80FwdTiles<64, 8, 1, 128, false, kFwdExp2Fma | kFwdLazyRescale>>("d64 w8 mt1 n128 lazy"),
        variant<Sm80FwdTiles<64, 4, 2, 64>>("d64 w4 mt2 n64"),
        variant<Sm80FwdTiles<64, 4, 2, 128>>("d64 w4 mt2 n128"),
        variant<Sm80FwdTiles<64, 8, 1, 64, true>>("d64 w8 mt1 n64 qreg"),
        variant<Sm80FwdTiles<64, 8, 1, 128, true>>("d64 w8 mt1 n128 qreg"),
        variant<Sm80FwdTiles<64, 4, 2, 64, false, kFwdExp2Fma>>("d64 w4 mt2 n64 exp2"),
        variant<Sm80FwdTiles<64, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale>>("d64 w4 mt2 n64 exp2 lazy"),
        variant<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale>>("d64 w4 mt2 n128 exp2 lazy"),
        variant<Sm80FwdTiles<64, 4, 2, 64, false, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap>>("d64 w4 mt2 n64 exp2 lazy split"),
        variant<Sm80FwdTiles<64, 4, 2, 128, false, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap>>("d64 w4 mt2 n128 exp2 lazy split"),
        variant<Sm80FwdTiles<64, 4, 2, 32, false, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>("d64 w4 mt2 n32 exp2 lazy split 3cta"),
        variant<Sm80FwdTiles<64, 8, 1, 64, true, kFwdExp2Fma | kFwdLazyRescale | kFwdSplitSoftcap | kFwdMoreCtas>>("d64 w8 mt1 n64 qreg exp2 lazy split 2cta"),
    };
    const int tokens = 16384, hidden = 2048;
    const int seqlens[] = {512, 1024, 2048, 4096, 8192, 16384};
    printf("%-44s %6s %6s %9s %8s %10s\n", "variant", "seqlen", "causal", "ms", "TFLOPS", "maxdiff");
    for (int d : {128, 64}) {
        for (int s : seqlens) {
            if ((only_d && d != only_d) || (only_s && s != only_s)) continue;
            Problem pr = {tokens / s, s, hidden / d, d};
            const size_t n = (size_t)tokens * hidden;
            cudaMalloc(&pr.q, n * 2); cudaMalloc(&pr.k, n * 2); cudaMalloc(&pr.v, n * 2);
            cudaMalloc(&pr.o, n * 2); cudaMalloc(&pr.lse, (size_t)tokens * pr.h * 4);
            bf16 *first = nullptr;
            cudaMalloc(&first, n * 2);
            fill_random<<<1024, 256>>>(pr.q, n, 1); fill_random<<<1024, 256>>>(pr.k, n, 2);
            fill_random<<<1024, 256>>>(pr.v, n, 3);
            for (int causal = 0; causal < 2; ++causal) {
                bool have_first = false;
                for (const Variant &v : variants) {
                    if (v.d != d || !name_matches(v.name, only_name)) continue;
                    const fat_params p = params_of(pr, causal);
                    if (v.fn(p, 0) != FAT_OK) { printf("%s: launch failed\n", v.name); continue; }
                    cudaDeviceSynchronize();
                    float diff = 0;
                    if (!have_first) { cudaMemcpy(first, pr.o, n * 2, cudaMemcpyDeviceToDevice); have_first = true; }
                    else diff = max_diff(to_host(first, n), to_host(pr.o, n));
                    const float ms = time_ms(v.fn, p);
                    const double flops = 4.0 * pr.b * pr.h * (double)s * s * d / (causal ? 2 : 1);
                    printf("%-44s %6d %6d %9.3f %8.1f %10.2e\n", v.name, s, causal, ms, flops / ms / 1e9, diff);
                }
            }
            cudaFree(pr.q); cudaFree(pr.k); cudaFree(pr.v); cudaFree(pr.o); cudaFree(pr.lse); cudaFree(first);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("%s\n", e == cudaSuccess ? "ok" : cudaGetErrorString(e));
    return e != cudaSuccess;
}
