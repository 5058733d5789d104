/*
 * causal_order_check.cu - checks pairs_finish_sooner (fat_sm80_primitives.cuh)
 * against exact list scheduling (every CTA starts on the slot that frees up
 * first, in launch order) over causal grids of 1-256 heads x 2-256 blocks,
 * with the block costs of the sm80 forward (D = 128: 128 x 48 tiles, 264
 * slots) and backward (D = 128: 128-key blocks, 64-row steps, 132 slots; the
 * same on 264 slots).  Prints each grid where the choice runs more than 1 %
 * behind the better order, and the mean and worst loss.  Host only:
 *   nvcc -std=c++17 -O2 -Icsrc -Icsrc/cuda dev/causal_order_check.cu -o /tmp/causal_order_check
 */
#include <stdio.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <vector>

#include "cuda/fat_sm80_primitives.cuh"

static double list_makespan(const std::vector<double> &ctas, int slots) {
    std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
    for (int i = 0; i < slots; ++i) free_at.push(0.0);
    double end = 0;
    for (double w : ctas) {
        const double t = free_at.top() + w;
        free_at.pop();
        free_at.push(t);
        end = std::max(end, t);
    }
    return end;
}

int main() {
    struct Pass { const char *name; int block, step, overhead, slots; };
    const Pass passes[] = {{"fwd d128", 128, 48, 2, 264}, {"bwd d128", 128, 64, 2, 132}, {"bwd 264 slots", 128, 64, 2, 264}};
    const int seqlens[] = {256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768};
    const int heads[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256};
    double loss_sum = 0, worst = 0;
    int grids = 0, over_1pct = 0;
    for (const Pass &pass : passes)
        for (int s : seqlens)
            for (int h : heads) {
                const int n = (s + pass.block - 1) / pass.block;
                if ((int64_t)n * h > 50000) continue;
                /* block j (heaviest first) sees (n - j) blocks' worth of the other side */
                auto cost = [&](int j) { return pass.overhead + (double)(n - j) * pass.block / pass.step; };
                std::vector<double> single, pairs;
                for (int c = 0; c < h; ++c) {
                    for (int j = 0; j < n; ++j) single.push_back(cost(j));
                    for (int j = 0; j < (n + 1) / 2; ++j) pairs.push_back(cost(j) + (n - 1 - j > j ? cost(n - 1 - j) : 0));
                }
                const double t_single = list_makespan(single, pass.slots), t_pairs = list_makespan(pairs, pass.slots);
                const bool chose_pairs = fat::pairs_finish_sooner(cost, n, h, pass.slots);
                const double loss = (chose_pairs ? t_pairs : t_single) / std::min(t_single, t_pairs) - 1;
                if (loss > 0.01)
                    printf("%-14s seqlen %6d heads %4d: single %9.1f pairs %9.1f chose %s, %.1f %% behind\n", pass.name,
                           s, h, t_single, t_pairs, chose_pairs ? "pairs" : "single", 100 * loss);
                loss_sum += loss;
                worst = std::max(worst, loss);
                over_1pct += loss > 0.01;
                ++grids;
            }
    printf("%d grids: mean loss %.2f %%, worst %.1f %%, %d more than 1 %% behind\n", grids, 100 * loss_sum / grids,
           100 * worst, over_1pct);
    return worst > 0.05;
}
