"""Forward (out, lse) and backward (dq, dk, dv) of flash_attn_t vs the float64
oracle in tests/reference.py.

fp32: rel_err <= 1e-5.  fp16/bf16: rel_err <= 2 * rel_err(PyTorch math in the
same low dtype) + 1e-6 on the same inputs (see reference.assert_close_to_ref).
"""
import math

import pytest
import torch

import flash_attn_t
from conftest import default_dtype, skip_if_unsupported
from reference import assert_close_to_ref, ref_fwd_bwd, visible_mask

LOWP = (torch.float16, torch.bfloat16)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _ours(q, k, v, dout, cu_q=None, cu_k=None, max_q=None, max_k=None, **kw):
    q = q.detach().clone().requires_grad_(True)
    k = k.detach().clone().requires_grad_(True)
    v = v.detach().clone().requires_grad_(True)
    if cu_q is None:
        out, lse = flash_attn_t.attention(q, k, v, return_lse=True, **kw)
    else:
        out, lse = flash_attn_t.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                                                 return_lse=True, **kw)
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _refs(q, k, v, dout, **kw):
    """The float64 oracle and, for 16-bit inputs, torch's same-dtype math."""
    args = [t.detach().cpu() for t in (q, k, v, dout)]
    ref = ref_fwd_bwd(*args, upcast=True, **kw)
    pt = ref_fwd_bwd(*args, upcast=False, **kw) if q.dtype in LOWP else [None] * 5
    return ref, pt


def check_case(q, k, v, dout, cu_q=None, cu_k=None, max_q=None, max_k=None, **kw):
    """Runs ours, the float64 oracle and (low precision) torch's own math."""
    dtype = q.dtype
    ours = _ours(q, k, v, dout, cu_q, cu_k, max_q, max_k, **kw)
    ref_kw = dict(kw)
    if cu_q is not None:
        ref_kw.update(cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())
    cpu = lambda t: t.detach().cpu()
    ref = ref_fwd_bwd(cpu(q), cpu(k), cpu(v), cpu(dout), upcast=True, **ref_kw)
    pt = [None] * 5
    if dtype in LOWP:
        pt = ref_fwd_bwd(cpu(q), cpu(k), cpu(v), cpu(dout), upcast=False, **ref_kw)
    out, lse = ours[0], ours[1]
    assert out.dtype == dtype
    assert lse.dtype == torch.float32
    assert out.device == q.device and lse.device == q.device
    for name, o, r, p in zip(("out", "lse", "dq", "dk", "dv"), ours, ref, pt):
        # lse is float32 by the API, so a float64 run gets the fp32 bound on it
        d = torch.float32 if (name == "lse" and dtype == torch.float64) else dtype
        assert_close_to_ref(name, o, r, p, dtype=d)
    return ours, ref


def make(B, Sq, Sk, Hq, Hkv, D, Dv=None, dtype=None, device="cpu", scale=1.0):
    Dv = D if Dv is None else Dv
    dtype = default_dtype(device) if dtype is None else dtype
    q = (torch.randn(B, Sq, Hq, D) * scale).to(dtype).to(device)
    k = (torch.randn(B, Sk, Hkv, D) * scale).to(dtype).to(device)
    v = torch.randn(B, Sk, Hkv, Dv).to(dtype).to(device)
    dout = torch.randn(B, Sq, Hq, Dv).to(dtype).to(device)
    return q, k, v, dout


def _bh(Sq, Sk):
    """Small batch/heads for big sequences to keep the CPU runtime modest."""
    n = max(Sq, Sk)
    if n >= 1000:
        return 1, 1
    if n >= 200:
        return 1, 2
    return 2, 3


# ---------------------------------------------------------------------------
# sequence lengths, Sq != Sk both ways, causal
# ---------------------------------------------------------------------------
SEQS = [(1, 1), (17, 17), (97, 97), (257, 257), (1025, 1025),
        (1, 257), (257, 1), (17, 97), (97, 17), (113, 1025), (1025, 113)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk", SEQS)
def test_seqlens(device, dtype, causal, Sq, Sk):
    B, H = _bh(Sq, Sk)
    q, k, v, dout = make(B, Sq, Sk, H, H, 64, dtype=dtype, device=device)
    check_case(q, k, v, dout, causal=causal)


# ---------------------------------------------------------------------------
# head dims
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [1, 8, 32, 59, 64, 96, 111, 128, 256])
def test_head_dims(device, dtype, causal, D):
    q, k, v, dout = make(2, 97, 83, 2, 2, D, dtype=dtype, device=device)
    check_case(q, k, v, dout, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D,Dv", [(64, 32), (32, 64), (59, 111), (128, 256), (256, 1), (1, 256), (96, 64)])
def test_dv_differs(device, dtype, D, Dv):
    q, k, v, dout = make(2, 61, 77, 2, 1, D, Dv, dtype=dtype, device=device)
    check_case(q, k, v, dout, causal=True)
    check_case(q, k, v, dout, causal=False)


# ---------------------------------------------------------------------------
# GQA / MQA
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq,Hkv", [(8, 1), (16, 2), (8, 4), (6, 3), (3, 1)])
def test_gqa(device, dtype, causal, Hq, Hkv):
    q, k, v, dout = make(2, 45, 70, Hq, Hkv, 64, dtype=dtype, device=device)
    check_case(q, k, v, dout, causal=causal)


# ---------------------------------------------------------------------------
# sliding window (with and without causal), Sq != Sk
# ---------------------------------------------------------------------------
WINDOWS = [(5, 3), (0, 0), (-1, 7), (10, -1), (0, -1), (-1, 0), (100, 100), (1, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("Sq,Sk", [(97, 97), (40, 150), (150, 40)])
def test_window(device, dtype, causal, window, Sq, Sk):
    q, k, v, dout = make(1, Sq, Sk, 2, 1, 64, dtype=dtype, device=device)
    check_case(q, k, v, dout, causal=causal, window_size=window)


# ---------------------------------------------------------------------------
# softcap (large scores so tanh saturates), custom softmax_scale
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [0.5, 5.0, 30.0])
def test_softcap(device, dtype, causal, softcap):
    q, k, v, dout = make(2, 80, 95, 4, 2, 64, dtype=dtype, device=device, scale=2.0)
    check_case(q, k, v, dout, causal=causal, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0])
def test_softmax_scale(device, dtype, scale):
    q, k, v, dout = make(2, 50, 60, 2, 2, 32, dtype=dtype, device=device)
    check_case(q, k, v, dout, softmax_scale=scale)
    check_case(q, k, v, dout, softmax_scale=scale, causal=True, softcap=3.0)


def test_default_scale_is_inv_sqrt_d(device):
    q, k, v, _ = make(1, 20, 30, 2, 2, 48, device=device)
    a = flash_attn_t.attention(q, k, v)
    b = flash_attn_t.attention(q, k, v, softmax_scale=1.0 / math.sqrt(48))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# fully masked rows: zeros, lse -inf, zero grads, no NaN
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("Sq,Sk,causal,window", [
    (10, 4, True, (-1, -1)),     # Sq > Sk causal: first 6 rows see nothing
    (100, 30, True, (-1, -1)),
    (60, 20, False, (3, 0)),     # window leaves rows empty
    (60, 20, False, (-1, 5)),
    (64, 16, True, (2, -1)),
])
def test_fully_masked_rows(device, dtype, Sq, Sk, causal, window):
    q, k, v, dout = make(2, Sq, Sk, 4, 2, 64, dtype=dtype, device=device)
    empty = ~visible_mask(Sq, Sk, causal, window).any(-1)
    assert empty.any() and not empty.all()
    (out, lse, dq, dk, dv), _ = check_case(q, k, v, dout, causal=causal, window_size=window)
    empty = empty.to(out.device)
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert (out[:, empty] == 0).all()
    assert (dq[:, empty] == 0).all()
    assert torch.isneginf(lse[:, :, empty]).all()
    assert torch.isfinite(lse[:, :, ~empty]).all()
    for t in (out, dq, dk, dv):
        assert not torch.isnan(t).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mostly_masked_rows(device, dtype):
    # Sq > Sk with window (0, 0) and shift so negative that nothing is visible
    # for most rows; and Sk visible nowhere when window_right pushes it off.
    q, k, v, dout = make(1, 50, 5, 2, 2, 32, dtype=dtype, device=device)
    out, lse, dq, dk, dv = _ours(q, k, v, dout, window_size=(0, 0))
    vis = visible_mask(50, 5, False, (0, 0))
    empty = ~vis.any(-1)
    assert empty.sum() == 45
    assert (out[:, empty.to(out.device)] == 0).all()
    for t in (out, lse, dq, dk, dv):
        assert not torch.isnan(t).any()


# ---------------------------------------------------------------------------
# non-contiguous inputs and gradients
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous(device, dtype, causal):
    B, H, Sq, Sk, D = 2, 4, 70, 90, 64
    # (B, H, S, D) -> transpose(1, 2) gives (B, S, H, D) with stride(-1) == 1
    q = torch.randn(B, H, Sq, D).to(dtype).to(device).transpose(1, 2)
    k = torch.randn(B, H, Sk, D).to(dtype).to(device).transpose(1, 2)
    # v: slice of a wider tensor (padded head dim), last dim still contiguous
    v = torch.randn(B, Sk, H, D + 16).to(dtype).to(device)[..., 8:8 + D]
    dout = torch.randn(B, H, Sq, D).to(dtype).to(device).transpose(1, 2)
    assert not q.is_contiguous() and not v.is_contiguous() and not dout.is_contiguous()
    check_case(q, k, v, dout, causal=causal)


def test_non_contiguous_batch_stride(device):
    # every second batch entry, and a sequence slice
    dt = default_dtype(device)
    q = torch.randn(4, 50, 2, 32, device=device, dtype=dt)[::2]
    k = torch.randn(4, 60, 2, 32, device=device, dtype=dt)[::2, 5:55]
    v = torch.randn(4, 60, 2, 32, device=device, dtype=dt)[1::2, :50]
    dout = torch.randn(2, 50, 2, 32, device=device, dtype=dt)
    check_case(q, k, v, dout, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_expanded_dout(device, dtype):
    # out.sum().backward() hands the kernel a dout whose strides are all 0
    q, k, v, _ = make(2, 33, 47, 4, 2, 64, dtype=dtype, device=device)
    dout = torch.ones(2, 33, 4, 64, dtype=dtype, device=device)
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    flash_attn_t.attention(qq, kk, vv, causal=True).sum().backward()
    ours = _ours(q, k, v, dout, causal=True)
    for a, b in zip((qq.grad, kk.grad, vv.grad), ours[2:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref = ref_fwd_bwd(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal=True)
    pt = ref_fwd_bwd(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), upcast=False, causal=True)
    for name, i in (("dq", 2), ("dk", 3), ("dv", 4)):
        assert_close_to_ref(name, (qq.grad, kk.grad, vv.grad)[i - 2], ref[i], pt[i], dtype=dtype)


def test_no_lse_return_and_lse_not_needed(device):
    q, k, v, dout = make(2, 30, 30, 2, 2, 32, device=device)
    out = flash_attn_t.attention(q, k, v)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, 30, 2, 32)


# ---------------------------------------------------------------------------
# varlen
# ---------------------------------------------------------------------------
def make_varlen(lens_q, lens_k, Hq, Hkv, D, Dv=None, dtype=None, device="cpu", scale=1.0):
    Dv = D if Dv is None else Dv
    dtype = default_dtype(device) if dtype is None else dtype
    tq, tk = sum(lens_q), sum(lens_k)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0).tolist()), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0).tolist()), dtype=torch.int32, device=device)
    q = (torch.randn(tq, Hq, D) * scale).to(dtype).to(device)
    k = (torch.randn(tk, Hkv, D) * scale).to(dtype).to(device)
    v = torch.randn(tk, Hkv, Dv).to(dtype).to(device)
    dout = torch.randn(tq, Hq, Dv).to(dtype).to(device)
    return q, k, v, dout, cu_q, cu_k, max(lens_q), max(lens_k)


VARLENS = [
    ([1, 0, 97, 300, 3], [1, 0, 97, 300, 3]),
    ([1, 0, 97, 300, 3], [5, 3, 120, 64, 0]),    # last sequence has no keys
    ([17, 1, 200], [300, 1, 17]),
    ([64], [64]),
    ([0, 0, 5], [2, 0, 5]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", VARLENS, ids=lambda l: "q%s-k%s" % tuple("_".join(map(str, x)) for x in l))
def test_varlen(device, dtype, causal, lens):
    lq, lk = lens
    q, k, v, dout, cu_q, cu_k, mq, mk = make_varlen(lq, lk, 4, 2, 64, dtype=dtype, device=device)
    (out, lse, *_), _ = check_case(q, k, v, dout, cu_q, cu_k, mq, mk, causal=causal)
    assert out.shape == (sum(lq), 4, 64)
    assert lse.shape == (4, sum(lq))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_matches_dense_per_sequence(device, dtype):
    """Each varlen sequence must equal the dense call on that sequence alone."""
    lq, lk = [1, 0, 97, 300, 3], [7, 4, 97, 250, 30]
    q, k, v, dout, cu_q, cu_k, mq, mk = make_varlen(lq, lk, 4, 1, 64, dtype=dtype, device=device)
    vo, vl, vdq, vdk, vdv = _ours(q, k, v, dout, cu_q, cu_k, mq, mk, causal=True, window_size=(50, -1))
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        sl_q, sl_k = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        do, dl, ddq, ddk, ddv = _ours(q[sl_q][None], k[sl_k][None], v[sl_k][None], dout[sl_q][None],
                                      causal=True, window_size=(50, -1))
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(vo[sl_q], do[0], **tol)
        torch.testing.assert_close(vl[:, sl_q], dl[0], **tol)
        torch.testing.assert_close(vdq[sl_q], ddq[0], **tol)
        torch.testing.assert_close(vdk[sl_k], ddk[0], **tol)
        torch.testing.assert_close(vdv[sl_k], ddv[0], **tol)


# ---------------------------------------------------------------------------
# combinations
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D,Dv", [(64, 64), (111, 59), (128, 128)])
def test_combo_varlen(device, dtype, D, Dv):
    lq, lk = [1, 0, 97, 300, 3], [4, 2, 150, 260, 3]
    q, k, v, dout, cu_q, cu_k, mq, mk = make_varlen(lq, lk, 8, 1, D, Dv, dtype=dtype, device=device, scale=2.0)
    check_case(q, k, v, dout, cu_q, cu_k, mq, mk, causal=True, window_size=(32, 8), softcap=5.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("Sq,Sk", [(130, 70), (70, 130)])
def test_combo_dense(device, dtype, Sq, Sk):
    q, k, v, dout = make(2, Sq, Sk, 8, 2, 96, 64, dtype=dtype, device=device, scale=2.0)
    check_case(q, k, v, dout, causal=True, window_size=(20, -1), softcap=10.0, softmax_scale=0.2)


# ---------------------------------------------------------------------------
# FlashAttention-2 compatible wrappers
# ---------------------------------------------------------------------------
def test_flash_attn_func_compat(device):
    q, k, v, dout = make(2, 40, 50, 4, 2, 64, device=device)
    a, alse = flash_attn_t.attention(q, k, v, causal=True, window_size=(10, -1), softcap=3.0, return_lse=True)
    b = flash_attn_t.flash_attn_func(q, k, v, causal=True, window_size=(10, -1), softcap=3.0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    res = flash_attn_t.flash_attn_func(q, k, v, 0.0, None, True, (10, -1), 3.0, None, False, True)
    assert isinstance(res, tuple) and len(res) == 3 and res[2] is None
    torch.testing.assert_close(res[0], a, rtol=0, atol=0)
    torch.testing.assert_close(res[1], alse, rtol=0, atol=0)


def test_flash_attn_varlen_func_compat(device):
    q, k, v, dout, cu_q, cu_k, mq, mk = make_varlen([3, 20, 7], [9, 20, 1], 4, 2, 32, device=device)
    a, alse = flash_attn_t.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_lse=True)
    b = flash_attn_t.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    res = flash_attn_t.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3 and res[2] is None
    torch.testing.assert_close(res[0], a, rtol=0, atol=0)
    torch.testing.assert_close(res[1], alse, rtol=0, atol=0)


def test_flash_attn_func_grad(device):
    q, k, v, dout = make(1, 30, 30, 2, 2, 32, device=device)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    flash_attn_t.flash_attn_func(qq, kk, vv, causal=True).backward(dout)
    ref, pt = _refs(q, k, v, dout, causal=True)
    assert_close_to_ref("dq", qq.grad, ref[2], pt[2])
    assert_close_to_ref("dk", kk.grad, ref[3], pt[3])
    assert_close_to_ref("dv", vv.grad, ref[4], pt[4])


# ---------------------------------------------------------------------------
# deterministic backward, float64 path, built_backends
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic_backward_bitwise(device, dtype):
    q, k, v, dout = make(2, 300, 300, 8, 2, 64, dtype=dtype, device=device)
    runs = [_ours(q, k, v, dout, causal=True, deterministic=True) for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


def test_float64_cpu_exact_scale():
    # softmax_scale and softcap exactly representable in float32
    q, k, v, dout = make(2, 37, 45, 4, 2, 24, dtype=torch.float64)
    check_case(q, k, v, dout, causal=True, softcap=2.0, window_size=(9, 3), softmax_scale=0.25)


@pytest.mark.parametrize("kw", [dict(), dict(softmax_scale=0.25, softcap=0.3)], ids=["default_scale", "softcap0.3"])
def test_float64_cpu(kw):
    # default scale 1/sqrt(24) and softcap 0.3 are not float32-representable: a
    # float64 kernel must apply them in float64 (1e-10 bound on out and grads)
    q, k, v, dout = make(2, 37, 45, 4, 2, 24, dtype=torch.float64)
    check_case(q, k, v, dout, causal=True, window_size=(9, 3), **kw)


def test_built_backends():
    bk = flash_attn_t.built_backends()
    assert isinstance(bk, (list, tuple))
    assert all(isinstance(b, str) for b in bk)
    assert "cpu" in bk


def test_requires_grad_subset(device):
    # only v requires grad: dq/dk are not needed, dv must still be right
    q, k, v, dout = make(1, 40, 40, 2, 2, 32, device=device)
    vv = v.clone().requires_grad_(True)
    flash_attn_t.attention(q, k, vv, causal=True).backward(dout)
    ref, pt = _refs(q, k, v, dout, causal=True)
    assert_close_to_ref("dv", vv.grad, ref[4], pt[4])


def test_return_lse_backward(device):
    # backward through out when lse is also returned (lse unused)
    q, k, v, dout = make(1, 40, 40, 2, 2, 32, device=device)
    check_case(q, k, v, dout)
