"""Small forward + backward calls on CUDA for compute-sanitizer (memcheck,
racecheck, synccheck): odd sizes, causal, window, softcap, GQA, varlen, head
dims that need padding.  Run:  compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py
"""
import torch

import flash_attn_t


def run_dense(B, Sq, Sk, Hq, Hkv, D, backward=True, **kw):
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    out = flash_attn_t.attention(q, k, v, **kw)
    if backward:
        out.sum().backward()


def run_varlen(lens, Hq, Hkv, D, **kw):
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    t = sum(lens)
    q = torch.randn(t, Hq, D, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(t, Hkv, D, device="cuda", dtype=torch.float16, requires_grad=True)
    v = torch.randn(t, Hkv, D, device="cuda", dtype=torch.float16, requires_grad=True)
    flash_attn_t.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), **kw).sum().backward()


if __name__ == "__main__":
    run_dense(1, 97, 131, 4, 2, 64, causal=True)
    run_dense(1, 300, 520, 2, 1, 64)  # several key blocks of the D = 64 backward (128 keys each)
    run_dense(2, 130, 70, 2, 1, 128, window_size=(20, 5), softcap=5.0)
    run_dense(1, 300, 300, 2, 2, 128, causal=True)  # D = 128 backward steps on the diagonal
    run_dense(1, 65, 65, 2, 2, 59, deterministic=True)
    run_dense(1, 33, 200, 2, 2, 256, causal=True)
    run_varlen([5, 130, 1, 77], 4, 1, 128, causal=True)
    # the sm90a forward's long-sequence variants (FwdDefault): forward only
    run_dense(1, 4100, 4100, 1, 1, 64, backward=False, causal=True)
    run_dense(1, 8200, 8200, 1, 1, 128, backward=False, causal=True)
    run_dense(1, 2100, 2100, 1, 1, 256, backward=False, causal=True)
    # persistent defaults (two Q buffers) with more tiles than SMs: CTAs run several
    run_dense(4, 600, 600, 16, 4, 64, backward=False, causal=True)
    run_dense(2, 1000, 1000, 16, 16, 128, backward=False, causal=True)
    run_dense(4, 1000, 1000, 16, 16, 128, backward=False)  # pingpong persistent
    # causal persistent CTAs take mirrored pairs of query blocks; 9 blocks: the middle one alone
    run_dense(1, 1100, 1100, 12, 4, 128, backward=False, causal=True)
    run_dense(4, 1000, 1000, 16, 16, 256, backward=False)  # D = 256 pingpong persistent
    # D = 64 non-causal: three consumer warpgroups, persistent (several tiles per CTA) and not
    run_dense(3, 900, 700, 64, 16, 64, backward=False)
    run_dense(1, 6000, 6000, 2, 2, 64, backward=False)  # n192 persistent
    # D = 128 non-causal 2k-4k: persistent, the next tile's first S under the epilogue
    run_dense(2, 3000, 3000, 8, 8, 128, backward=False)
    run_varlen([3000, 5, 1200, 2100], 4, 2, 128)  # rows past a sequence: thread stores
    run_dense(2, 2500, 2500, 16, 4, 64, backward=False, causal=True)  # n192 persistent causal
    torch.cuda.synchronize()
    print("sanitize_small: done,", flash_attn_t.last_cuda_backend())
