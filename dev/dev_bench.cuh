/*
 * dev_bench.cuh - what the dev/ variant benchmarks share: random bf16 inputs,
 * a variant table entry (name, head dim, launcher), the name filter, CUDA-event timing (median
 * of 10 after 3 warm-up launches) and max-abs differences on the host.
 */
#pragma once

#include <math.h>
#include <stdint.h>

#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "flash_attn_t.h"

using bf16 = __nv_bfloat16;

__global__ void fill_random(bf16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += gridDim.x * (size_t)blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        x[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 3.0f);
    }
}

typedef fat_status (*launch_fn)(const fat_params &, cudaStream_t);
struct Variant {
    const char *name;
    int d;
    launch_fn fn;
};

float time_ms(launch_fn fn, const fat_params &p) {
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) fn(p, 0);
    std::vector<float> ms;
    for (int i = 0; i < 10; ++i) {
        cudaEventRecord(a);
        fn(p, 0);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float t; cudaEventElapsedTime(&t, a, b); ms.push_back(t);
    }
    cudaEventDestroy(a); cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

std::vector<float> to_host(const bf16 *x, size_t n) {
    std::vector<bf16> h(n);
    cudaMemcpy(h.data(), x, n * 2, cudaMemcpyDeviceToHost);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
    return f;
}

float max_diff(const std::vector<float> &x, const std::vector<float> &y) {
    float m = 0;
    for (size_t i = 0; i < x.size(); ++i) m = fmaxf(m, fabsf(x[i] - y[i]));
    return m;
}

/* Whether name contains one of the comma-separated substrings of filter
 * (no filter or an empty one: every name). */
static bool name_matches(const char *name, const char *filter) {
    if (!filter || !*filter) return true;
    const std::string parts = filter;
    for (size_t start = 0;;) {
        const size_t end = parts.find(',', start);
        const std::string part = parts.substr(start, end - start);
        if (!part.empty() && strstr(name, part.c_str())) return true;
        if (end == std::string::npos) return false;
        start = end + 1;
    }
}
