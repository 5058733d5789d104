"""python -m flash_attn_t: what was built, a correctness check against PyTorch's
attention on the best available device, and a short speed comparison."""
import argparse
import time

import torch
import torch.nn.functional as F

import flash_attn_t


def _rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def _median_seconds(fn, device, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _sdpa(q, k, v, causal):
    # SDPA takes (B, H, S, D); flash_attn_t takes (B, S, H, D).
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), is_causal=causal,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()

    print(f"flash_attn_t {flash_attn_t.__version__}, torch {torch.__version__}")
    print(f"built kernel paths: {', '.join(flash_attn_t.built_backends())}")
    cuda_built = any(b.startswith("sm") for b in flash_attn_t.built_backends())
    device = torch.device("cuda" if torch.cuda.is_available() and cuda_built else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"checking on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}), {dtype}")

    ok = True
    b, h, hkv, s, d = 2, 8, 2, args.seqlen, args.head_dim
    for causal in (False, True):
        q = torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=True)
        dout = torch.randn(b, s, h, d, device=device, dtype=dtype)
        out = flash_attn_t.attention(q, k, v, causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref = _sdpa(q.double(), k.double(), v.double(), causal)
        ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
        errors = [_rel_err(out, ref)] + [_rel_err(g, r) for g, r in zip(grads, ref_grads)]
        bound = 1e-5 if dtype == torch.float32 else 2e-2
        passed = all(e <= bound for e in errors)
        ok &= passed
        print(f"  causal={causal!s:5}  rel. error vs float64 SDPA: out {errors[0]:.1e}, "
              f"dq {errors[1]:.1e}, dk {errors[2]:.1e}, dv {errors[3]:.1e}  "
              f"{'ok' if passed else 'FAILED'}")

    print(f"speed, forward, B={b} H={h} Hkv={hkv} S={s} D={d}, causal:")
    q, k, v = (t.detach() for t in (q, k, v))
    flops = 4 * b * h * s * s * d / 2
    for name, fn in (("flash_attn_t", lambda: flash_attn_t.attention(q, k, v, causal=True)),
                     ("torch sdpa", lambda: _sdpa(q, k, v, True))):
        sec = _median_seconds(fn, device)
        print(f"  {name:13} {sec * 1e3:9.2f} ms  {flops / sec / 1e9:8.1f} GFLOPS")
    if device.type == "cpu" and torch.cuda.is_available():
        print("note: a GPU is present but this build has no CUDA kernels")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
