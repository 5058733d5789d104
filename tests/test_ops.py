"""torch.library integration: opcheck, torch.compile (no graph break, dynamic
sequence lengths without recompiles) and torch.export."""
import math

import pytest
import torch

import flash_attn_t
from reference import assert_close_to_ref, ref_fwd_bwd

ops = torch.ops.flash_attn_t


def _dense(device, B=2, Sq=9, Sk=13, Hq=4, Hkv=2, D=16, Dv=None, dtype=torch.float32, rg=False):
    Dv = D if Dv is None else Dv
    q = torch.randn(B, Sq, Hq, D, dtype=dtype, device=device, requires_grad=rg)
    k = torch.randn(B, Sk, Hkv, D, dtype=dtype, device=device, requires_grad=rg)
    v = torch.randn(B, Sk, Hkv, Dv, dtype=dtype, device=device, requires_grad=rg)
    return q, k, v


def _varlen(device, lq=(3, 0, 7, 2), lk=(5, 2, 7, 0), Hq=4, Hkv=2, D=16, dtype=torch.float32, rg=False):
    cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(sum(lq), Hq, D, dtype=dtype, device=device, requires_grad=rg)
    k = torch.randn(sum(lk), Hkv, D, dtype=dtype, device=device, requires_grad=rg)
    v = torch.randn(sum(lk), Hkv, D, dtype=dtype, device=device, requires_grad=rg)
    return q, k, v, cu_q, cu_k, max(lq), max(lk)


OPT = [
    (False, -1, -1, 0.0),
    (True, -1, -1, 0.0),
    (True, 3, -1, 2.0),
    (False, 2, 1, 0.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal,wl,wr,softcap", OPT)
def test_opcheck_fwd_dense(device, dtype, causal, wl, wr, softcap):
    q, k, v = _dense(device, dtype=dtype, rg=True)
    args = (q, k, v, None, None, q.shape[1], k.shape[1], 1 / math.sqrt(16), causal, wl, wr, softcap)
    torch.library.opcheck(ops.fwd.default, args)


@pytest.mark.parametrize("causal,wl,wr,softcap", OPT)
def test_opcheck_fwd_varlen(device, causal, wl, wr, softcap):
    q, k, v, cu_q, cu_k, mq, mk = _varlen(device, rg=True)
    args = (q, k, v, cu_q, cu_k, mq, mk, 0.25, causal, wl, wr, softcap)
    torch.library.opcheck(ops.fwd.default, args)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal,wl,wr,softcap", OPT)
def test_opcheck_bwd_dense(device, deterministic, causal, wl, wr, softcap):
    q, k, v = _dense(device, Dv=8)
    scale = 1 / math.sqrt(16)
    out, lse = ops.fwd(q, k, v, None, None, q.shape[1], k.shape[1], scale, causal, wl, wr, softcap)
    dout = torch.randn_like(out)
    args = (dout, q, k, v, out, lse, None, None, q.shape[1], k.shape[1], scale, causal, wl, wr,
            softcap, deterministic)
    torch.library.opcheck(ops.bwd.default, args)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal,wl,wr,softcap", OPT)
def test_opcheck_bwd_varlen(device, deterministic, causal, wl, wr, softcap):
    q, k, v, cu_q, cu_k, mq, mk = _varlen(device)
    out, lse = ops.fwd(q, k, v, cu_q, cu_k, mq, mk, 0.25, causal, wl, wr, softcap)
    dout = torch.randn_like(out)
    args = (dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, 0.25, causal, wl, wr, softcap, deterministic)
    torch.library.opcheck(ops.bwd.default, args)


def test_ops_fwd_bwd_shapes(device):
    q, k, v = _dense(device, Dv=8)
    out, lse = ops.fwd(q, k, v, None, None, 9, 13, 0.25, True, -1, -1, 0.0)
    assert out.shape == (2, 9, 4, 8) and out.dtype == q.dtype
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    dq, dk, dv = ops.bwd(torch.randn_like(out), q, k, v, out, lse, None, None, 9, 13, 0.25, True,
                         -1, -1, 0.0, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------
def _fn(q, k, v):
    return flash_attn_t.attention(q, k, v, causal=True, softcap=3.0, window_size=(6, -1))


def _check_compiled_grads(cf, q, k, v, dout, kw, mark_dynamic=False):
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    if mark_dynamic:
        for t in (qq, kk, vv):
            torch._dynamo.mark_dynamic(t, 1)
    out = cf(qq, kk, vv)
    out.backward(dout)
    ref = ref_fwd_bwd(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), **kw)
    assert_close_to_ref("out", out, ref[0])
    assert_close_to_ref("dq", qq.grad, ref[2])
    assert_close_to_ref("dk", kk.grad, ref[3])
    assert_close_to_ref("dv", vv.grad, ref[4])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_fwd_bwd(device, backend):
    torch._dynamo.reset()
    q, k, v = _dense(device, Sq=20, Sk=20)
    dout = torch.randn(2, 20, 4, 16, device=device)
    cf = torch.compile(_fn, fullgraph=True, backend=backend)
    _check_compiled_grads(cf, q, k, v, dout, dict(causal=True, softcap=3.0, window_size=(6, -1)))


def test_compile_no_graph_break_explain(device):
    torch._dynamo.reset()
    q, k, v = _dense(device, rg=True)
    expl = torch._dynamo.explain(lambda q, k, v: _fn(q, k, v).sum())(q, k, v)
    assert expl.graph_break_count == 0, expl.break_reasons
    assert expl.graph_count == 1


def test_compile_varlen_fullgraph(device):
    torch._dynamo.reset()
    q, k, v, cu_q, cu_k, mq, mk = _varlen(device)

    def f(q, k, v, cu_q, cu_k):
        return flash_attn_t.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = cf(qq, kk, vv, cu_q, cu_k)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = ref_fwd_bwd(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal=True,
                      cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())
    assert_close_to_ref("out", out, ref[0])
    assert_close_to_ref("dq", qq.grad, ref[2])
    assert_close_to_ref("dk", kk.grad, ref[3])
    assert_close_to_ref("dv", vv.grad, ref[4])


@pytest.mark.parametrize("mode", ["dynamic_true", "mark_dynamic"])
def test_compile_dynamic_seqlen_no_recompile(device, mode):
    torch._dynamo.reset()
    kw = dict(causal=True, softcap=3.0, window_size=(6, -1))
    if mode == "dynamic_true":
        cf = torch.compile(_fn, fullgraph=True, dynamic=True, backend="aot_eager")
    else:
        cf = torch.compile(_fn, fullgraph=True, backend="aot_eager")

    def run(S):
        q, k, v = _dense(device, Sq=S, Sk=S + 3)
        dout = torch.randn(2, S, 4, 16, device=device)
        _check_compiled_grads(cf, q, k, v, dout, kw, mark_dynamic=(mode == "mark_dynamic"))

    run(21)  # first compile (dynamic); 21 collides with no other dim (duck sizing)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for S in (23, 40, 71, 9, 16):
            run(S)


def test_compile_dynamic_varlen_no_recompile(device):
    """Varlen with changing total lengths and max_seqlen ints (SymInt in the schema)."""
    torch._dynamo.reset()

    def f(q, k, v, cu_q, cu_k, mq, mk):
        return flash_attn_t.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)

    cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")

    def run(lq, lk):
        q, k, v, cu_q, cu_k, mq, mk = _varlen(device, lq, lk)
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out = cf(qq, kk, vv, cu_q, cu_k, mq, mk)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref = ref_fwd_bwd(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal=True,
                          cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())
        assert_close_to_ref("out", out, ref[0])
        assert_close_to_ref("dq", qq.grad, ref[2])
        assert_close_to_ref("dk", kk.grad, ref[3])
        assert_close_to_ref("dv", vv.grad, ref[4])

    run((3, 4, 7, 9), (5, 2, 7, 3))  # totals 23 and 17: no duck-sizing collision
    with torch._dynamo.config.patch(error_on_recompile=True):
        run((6, 5, 2, 9), (5, 8, 7, 3))
        run((13, 2, 3, 4), (11, 12, 7, 5))


# ---------------------------------------------------------------------------
# torch.export
# ---------------------------------------------------------------------------
class _Attn(torch.nn.Module):
    def __init__(self, D=16, H=4, Hkv=2):
        super().__init__()
        self.H, self.Hkv, self.D = H, Hkv, D
        self.qkv = torch.nn.Linear(32, (H + 2 * Hkv) * D)
        self.o = torch.nn.Linear(H * D, 32)

    def forward(self, x):
        B, S, _ = x.shape
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.H * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
        q = q.view(B, S, self.H, self.D)
        k = k.view(B, S, self.Hkv, self.D)
        v = v.view(B, S, self.Hkv, self.D)
        o = flash_attn_t.attention(q, k, v, causal=True, softcap=5.0)
        return self.o(o.reshape(B, S, self.H * self.D))


def test_export_module(device):
    m = _Attn().to(device)
    x = torch.randn(2, 12, 32, device=device)
    ep = torch.export.export(m, (x,))
    names = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any("flash_attn_t" in n for n in names), names
    torch.testing.assert_close(ep.module()(x), m(x), rtol=0, atol=0)


def test_export_module_dynamic_seq(device):
    m = _Attn().to(device)
    x = torch.randn(2, 12, 32, device=device)
    S = torch.export.Dim("S", min=2, max=4096)
    ep = torch.export.export(m, (x,), dynamic_shapes={"x": {1: S}})
    for s in (5, 12, 77):
        x2 = torch.randn(2, s, 32, device=device)
        torch.testing.assert_close(ep.module()(x2), m(x2), rtol=0, atol=0)
