"""Plain-PyTorch oracles for flash_attn_t.  Nothing here imports flash_attn_t.

attention_ref(..., upcast=True)   the float64 oracle: every input is converted
                                  to float64 and the scores are masked
                                  explicitly, so it is exact up to ~1e-16.
attention_ref(..., upcast=False)  PyTorch's own math attention computed in the
                                  input dtype (scores, softcap, softmax, P@V all
                                  in fp16/bf16 with torch ops).  Its error
                                  against the float64 oracle is the yardstick
                                  for fp16/bf16: a kernel that is as good as
                                  PyTorch's low-precision math is allowed at most
                                  twice that error (see assert_close_to_ref).

Layouts follow flash_attn_t: dense q (B, Sq, Hq, D), k (B, Sk, Hkv, D),
v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv), lse (B, Hq, Sq);
varlen q (total_q, Hq, D) ... -> out (total_q, Hq, Dv), lse (Hq, total_q).
"""
import math

import torch

# Relative error bound for float32 outputs and gradients (brief: 1e-5).
FP32_RTOL = 1e-5
# float64 kernels (CPU, for gradcheck) against the float64 oracle.
FP64_RTOL = 1e-10
# fp16/bf16: err(ours) <= LOWP_FACTOR * err(torch low precision) + LOWP_EPS.
# LOWP_EPS = 1e-6 is ~500x below the fp16 unit roundoff (4.9e-4) and ~4000x
# below bf16's (3.9e-3), so it never hides a real low-precision error; it only
# keeps the bound meaningful in degenerate cases where the torch low-precision
# computation happens to be exact (e.g. a single visible key: out == v
# bit-exactly) while the kernel carries fp32-accumulation noise (~1e-7).
LOWP_FACTOR = 2.0
LOWP_EPS = 1e-6
# When the float64 reference is identically zero (the softmax gradient of a
# row with a single visible key cancels exactly, so dq == 0), a relative error
# is undefined; then the absolute max is bounded instead.  Gradients here are
# O(1) and fp32 accumulation noise is ~1e-7 per term, so 1e-4 is generous for
# noise and still 10x below fp16's resolution at 1.0.
ZERO_REF_ATOL = 1e-4


def rel_err(x, ref):
    """||x - ref|| / ||ref|| in float64 (Frobenius norms)."""
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def visible_mask(sq, sk, causal=False, window_size=(-1, -1), device="cpu"):
    """(sq, sk) bool: key j visible to query i (bottom-right aligned)."""
    wl, wr = window_size
    if causal:
        wr = 0
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    shift = sk - sq
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wr >= 0:
        vis &= j <= i + shift + wr
    if wl >= 0:
        vis &= j >= i + shift - wl
    return vis


def _dense_ref(q, k, v, causal, softmax_scale, window_size, softcap, upcast):
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0
    g = Hq // Hkv
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    # GQA / MQA: query head h reads kv head h // g
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    qh = q.transpose(1, 2)  # (B, Hq, Sq, D)
    kh = k.transpose(1, 2)
    vh = v.transpose(1, 2)
    s = torch.matmul(qh * softmax_scale, kh.transpose(-1, -2))  # (B, Hq, Sq, Sk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    vis = visible_mask(Sq, Sk, causal, window_size, device=q.device)
    empty = ~vis.any(dim=-1, keepdim=True)  # (Sq, 1) rows without any key
    s = s.masked_fill(~vis, float("-inf"))
    # rows with no key: give softmax finite input (avoids NaN), zero them after
    s_safe = s.masked_fill(empty, 0.0)
    lse = torch.logsumexp(s_safe, dim=-1)  # (B, Hq, Sq)
    lse = lse.masked_fill(empty.squeeze(-1), float("-inf"))
    p = torch.softmax(s_safe, dim=-1)
    p = p.masked_fill(empty, 0.0)
    out = torch.matmul(p, vh).transpose(1, 2)  # (B, Sq, Hq, Dv)
    return out, lse


def attention_ref(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1),
                  softcap=0.0, cu_seqlens_q=None, cu_seqlens_k=None, upcast=True):
    """Returns (out, lse).  upcast=True: float64 oracle; False: input dtype.

    Differentiable (plain autograd through torch ops).  With cu_seqlens the
    inputs are varlen-packed and every sequence is computed on its own with
    the dense formula.
    """
    if cu_seqlens_q is None:
        return _dense_ref(q, k, v, causal, softmax_scale, window_size, softcap, upcast)
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].unsqueeze(0)
        ks = k[ck[b]:ck[b + 1]].unsqueeze(0)
        vs = v[ck[b]:ck[b + 1]].unsqueeze(0)
        o, l = _dense_ref(qs, ks, vs, causal, softmax_scale, window_size, softcap, upcast)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def ref_fwd_bwd(q, k, v, dout, upcast=True, **kw):
    """(out, lse, dq, dk, dv) of attention_ref with upstream gradient dout."""
    dtype = torch.float64 if upcast else q.dtype
    qq = q.detach().to(dtype).requires_grad_(True)
    kk = k.detach().to(dtype).requires_grad_(True)
    vv = v.detach().to(dtype).requires_grad_(True)
    out, lse = attention_ref(qq, kk, vv, upcast=upcast, **kw)
    out.backward(dout.detach().to(out.dtype))
    return out.detach(), lse.detach(), qq.grad, kk.grad, vv.grad


def _err_and_norm(x, ref):
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    return torch.linalg.vector_norm(x - ref).item(), torch.linalg.vector_norm(ref).item()


def assert_close_to_ref(name, ours, ref, pt=None, dtype=None):
    """ours vs the float64 oracle ref, with the dtype-dependent bound.

    float32: rel_err <= 1e-5.  float64: rel_err <= 1e-10.
    float16/bfloat16: rel_err <= 2 * rel_err(pt, ref) + 1e-6 where pt is the
    low-precision torch result on the same inputs.
    lse-like tensors with -inf: the -inf pattern must match exactly and the
    finite entries are compared.
    """
    dtype = dtype or ours.dtype
    ours = ours.detach().cpu()
    ref = ref.detach().cpu()
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ours).any(), f"{name}: NaN in result"
    if pt is not None:
        pt = pt.detach().cpu()
    ref_inf = torch.isinf(ref)
    if ref_inf.any() or torch.isinf(ours).any():
        ours_inf = torch.isinf(ours)
        assert torch.equal(ours_inf, ref_inf), f"{name}: +-inf pattern differs from reference"
        assert torch.equal(ours[ours_inf], ref[ref_inf].to(ours.dtype)), f"{name}: inf sign differs"
        fin = ~ref_inf
        ours, ref = ours[fin], ref[fin]
        if pt is not None:
            pt = pt[fin]
            # the low-precision torch reference can overflow/underflow; keep it finite
            pt = torch.where(torch.isfinite(pt), pt, torch.zeros_like(pt))
        if ref.numel() == 0:
            return
    err, nrm = _err_and_norm(ours, ref)
    if nrm == 0.0:
        amax = ours.detach().abs().max().item() if ours.numel() else 0.0
        assert amax <= ZERO_REF_ATOL, f"{name}: reference is 0 but max |ours| = {amax:.3e}"
        return
    rel = err / nrm
    if dtype == torch.float32:
        assert rel <= FP32_RTOL, f"{name}: rel_err {rel:.3e} > {FP32_RTOL:.0e} (fp32)"
    elif dtype == torch.float64:
        assert rel <= FP64_RTOL, f"{name}: rel_err {rel:.3e} > {FP64_RTOL:.0e} (fp64)"
    else:
        assert pt is not None, "low-precision comparison needs the torch low-precision result"
        pt_err, _ = _err_and_norm(pt, ref)
        bound = LOWP_FACTOR * pt_err / nrm + LOWP_EPS
        assert rel <= bound, (f"{name}: rel_err {rel:.3e} > {LOWP_FACTOR} * torch {dtype} "
                              f"rel_err {pt_err / nrm:.3e} + {LOWP_EPS:.0e}")
