"""Warm forward + backward calls of one implementation for a profiler, bf16,
16k tokens, hidden 2048 (heads = 2048 / D), as the fa3 benchmark suite:
    ncu --clock-control none -k regex:dkdv -c 1 python3 scripts/profile_bwd.py
    python3 scripts/profile_bwd.py --impl fa2 --d 64 --seqlen 1024 --causal --kernels
--impl fat: flash_attn_t (FLASH_ATTN_T_BACKEND picks the path); fa2 / cudnn:
torch SDPA's FLASH_ATTENTION / CUDNN_ATTENTION backend.  --kernels prints the CUDA time of each
kernel of one backward (torch.profiler, averaged over --iters calls)."""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("fat", "fa2", "cudnn"), default="fat")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    b, h = max(1, 16384 // args.seqlen), 2048 // args.d
    shape = (b, args.seqlen, h, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if args.impl == "fat":
        import flash_attn_t

        def forward():
            return flash_attn_t.attention(q, k, v, causal=args.causal)
    else:
        backend = SDPBackend.FLASH_ATTENTION if args.impl == "fa2" else SDPBackend.CUDNN_ATTENTION

        def forward():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=args.causal).transpose(1, 2)
    out = forward()
    grad = torch.randn_like(out)
    for _ in range(2):
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    torch.cuda.synchronize()
    if not args.kernels:
        return
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
        torch.cuda.synchronize()
    total = 0.0
    rows = []
    for e in prof.key_averages():
        us = e.device_time_total / args.iters
        if us > 0:
            rows.append((us, e.key))
            total += us
    print("%s D=%d S=%d causal=%d: %.1f us per backward" % (args.impl, args.d, args.seqlen,
                                                             args.causal, total))
    for us, name in sorted(rows, reverse=True):
        print("  %8.1f us  %s" % (us, name[:150]))


if __name__ == "__main__":
    main()
