"""One warm forward + backward call at B=1, S=8192, H=16, D=128 (bf16) for a
profiler:  ncu --clock-control none -k regex:dkdv -c 1 python3 scripts/profile_bwd.py"""
import torch

import flash_attn_t

q, k, v = (torch.randn(1, 8192, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
for _ in range(2):
    out = flash_attn_t.attention(q, k, v)
    out.backward(torch.ones_like(out))
torch.cuda.synchronize()
