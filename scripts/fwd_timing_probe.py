"""Why the torch bench and dev/sm80_fwd_bench.cu disagree on one kernel
(run 16b: D = 128, 16k, non-causal, 350.9 against 375.2 TFLOPS): times the
forward of flash_attn_t's sm80 path and of torch's FlashAttention-2 at bf16,
16k tokens, hidden 2048, with both benches' inputs (torch.randn, and the dev
bench's uniform values in [-1.5, 1.5)) and both timing methods (a 256 MB L2
flush before each timed call, median, as bench.py; back to back, the mean of
a run of calls, as the dev bench).
    python3 scripts/fwd_timing_probe.py [--d 128] [--seqlens 1024 16384]"""
import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed_flushed(fn, reps):
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    ts = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def timed_back_to_back(fn, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    import flash_attn_t
    os.environ["FLASH_ATTN_T_BACKEND"] = "sm80"
    for s in args.seqlens:
        b, h = max(1, 16384 // s), 2048 // args.d
        flops = 4.0 * b * h * s * s * args.d / (2 if args.causal else 1)
        reps = max(5, min(200, int(2e13 / flops)))
        for data in ("randn", "uniform"):
            g = torch.Generator(device="cuda").manual_seed(0)
            def make():
                if data == "randn":
                    x = torch.randn(b, s, h, args.d, device="cuda", generator=g)
                else:
                    x = torch.rand(b, s, h, args.d, device="cuda", generator=g) * 3 - 1.5
                return x.to(torch.bfloat16)
            q, k, v = make(), make(), make()
            impls = {
                "fat-sm80": lambda: flash_attn_t.attention(q, k, v, causal=args.causal),
                "fa2": lambda: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=args.causal),
            }
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                for name, fn in impls.items():
                    fn()
                    torch.cuda.synchronize()
                    for method, timer in (("flushed", timed_flushed), ("back-to-back", timed_back_to_back)):
                        ms = timer(fn, reps)
                        print("D=%d S=%5d causal=%d %-8s %-9s %-13s %8.3f ms %7.1f TFLOPS"
                              % (args.d, s, args.causal, data, name, method, ms, flops / ms / 1e9),
                              flush=True)


if __name__ == "__main__":
    main()
