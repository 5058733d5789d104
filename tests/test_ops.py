"""torch.library integration: opcheck, torch.compile (no graph break, dynamic
sequence lengths without recompiles, CUDA graphs on the GPU) and torch.export."""
import math

import pytest
import torch

import flash_attn_t
from conftest import CUDA_BUILT, default_dtype
from reference import assert_close_to_ref, ref_fwd_bwd

needs_cuda = pytest.mark.skipif(not (CUDA_BUILT and torch.cuda.is_available()),
                                reason="needs a CUDA build of flash_attn_t and a GPU")

ops = torch.ops.flash_attn_t


def _dense(device, B=2, Sq=9, Sk=13, Hq=4, Hkv=2, D=16, Dv=None, dtype=None, rg=False):
    Dv = D if Dv is None else Dv
    dtype = default_dtype(device) if dtype is None else dtype
    q = torch.randn(B, Sq, Hq, D, dtype=dtype, device=device, requires_grad=rg)
    k = torch.randn(B, Sk, Hkv, D, dtype=dtype, device=device, requires_grad=rg)
    v = torch.randn(B, Sk, Hkv, Dv, dtype=dtype, device=device, requires_grad=rg)
    return q, k, v


def _varlen(device, lq=(3, 0, 7, 2), lk=(5, 2, 7, 0), Hq=4, Hkv=2, D=16, dtype=None, rg=False):
    dtype = default_dtype(device) if dtype is None else dtype
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
    _assert_matches_ref(out, (qq.grad, kk.grad, vv.grad), q, k, v, dout, **kw)


def _assert_matches_ref(out, grads, q, k, v, dout, **kw):
    """out and grads vs the float64 oracle; 16-bit bounds from torch's same-dtype math."""
    args = [t.detach().cpu() for t in (q, k, v, dout)]
    ref = ref_fwd_bwd(*args, **kw)
    pt = ref_fwd_bwd(*args, upcast=False, **kw) if q.dtype != torch.float32 else [None] * 5
    for name, ours, i in (("out", out, 0), ("dq", grads[0], 2), ("dk", grads[1], 3),
                          ("dv", grads[2], 4)):
        assert_close_to_ref(name, ours, ref[i], pt[i])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_fwd_bwd(device, backend):
    torch._dynamo.reset()
    q, k, v = _dense(device, Sq=20, Sk=20)
    dout = torch.randn(2, 20, 4, 16, device=device, dtype=q.dtype)
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
    _assert_matches_ref(out, (qq.grad, kk.grad, vv.grad), q, k, v, dout, causal=True,
                        cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())


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
        dout = torch.randn(2, S, 4, 16, device=device, dtype=q.dtype)
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
        _assert_matches_ref(out, (qq.grad, kk.grad, vv.grad), q, k, v, dout, causal=True,
                            cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())

    run((3, 4, 7, 9), (5, 2, 7, 3))  # totals 23 and 17: no duck-sizing collision
    with torch._dynamo.config.patch(error_on_recompile=True):
        run((6, 5, 2, 9), (5, 8, 7, 3))
        run((13, 2, 3, 4), (11, 12, 7, 5))


# ---------------------------------------------------------------------------
# CUDA graphs: torch.compile(mode="reduce-overhead")
# ---------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compile_cudagraphs_fwd_bwd(layout, dtype):
    """reduce-overhead records the forward and the backward as CUDA graphs and replays them on
    new input values. No graph may be skipped (a skip means the op cannot be captured, e.g. it
    launches off the current stream or syncs), and every call must equal the uncompiled call
    bitwise (deterministic=True: the same kernels on the same inputs) and be within the 16-bit
    bound of the float64 oracle."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    kw = dict(causal=True, softcap=3.0, window_size=(40, -1))
    ref_kw = dict(kw)
    if layout == "dense":
        def f(q, k, v):
            return flash_attn_t.attention(q, k, v, deterministic=True, **kw)

        def make():
            return _dense("cuda", B=2, Sq=300, Sk=300, Hq=4, Hkv=2, D=64, dtype=dtype)
    else:
        lens = (70, 1, 200, 129)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
        ref_kw.update(cu_seqlens_q=cu.cpu(), cu_seqlens_k=cu.cpu())

        def f(q, k, v):
            return flash_attn_t.attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                 deterministic=True, **kw)

        def make():
            return _varlen("cuda", lens, lens, Hq=4, Hkv=2, D=64, dtype=dtype)[:3]

    cf = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, record, replays: new values in fresh tensors every call
        q, k, v = make()
        dout = torch.randn(*q.shape[:-1], v.shape[-1], dtype=dtype, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = cf(*leaves)
        out.backward(dout)
        got = [out.detach().clone()] + [t.grad.clone() for t in leaves]
        eager = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        e_out = f(*eager)
        e_out.backward(dout)
        want = [e_out.detach()] + [t.grad for t in eager]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
            assert torch.equal(g, w), f"{name}: the CUDA-graph call differs from the eager call"
        _assert_matches_ref(got[0], got[1:], q, k, v, dout, **ref_kw)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


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
    m = _Attn().to(device, default_dtype(device))
    x = torch.randn(2, 12, 32, device=device, dtype=default_dtype(device))
    ep = torch.export.export(m, (x,))
    names = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any("flash_attn_t" in n for n in names), names
    torch.testing.assert_close(ep.module()(x), m(x), rtol=0, atol=0)


def test_export_module_dynamic_seq(device):
    m = _Attn().to(device, default_dtype(device))
    x = torch.randn(2, 12, 32, device=device, dtype=default_dtype(device))
    S = torch.export.Dim("S", min=2, max=4096)
    ep = torch.export.export(m, (x,), dynamic_shapes={"x": {1: S}})
    for s in (5, 12, 77):
        x2 = torch.randn(2, s, 32, device=device, dtype=x.dtype)
        torch.testing.assert_close(ep.module()(x2), m(x2), rtol=0, atol=0)
