"""torch.autograd.gradcheck of flash_attn_t in float64 (CPU) on tiny shapes."""
import pytest
import torch
from torch.autograd import gradcheck

import flash_attn_t


def _inputs(B, Sq, Sk, Hq, Hkv, D, Dv=None):
    Dv = D if Dv is None else Dv
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)
    return mk(B, Sq, Hq, D), mk(B, Sk, Hkv, D), mk(B, Sk, Hkv, Dv)


CASES = [
    dict(),
    dict(causal=True),
    dict(softcap=1.5),
    dict(causal=True, softcap=0.7),
    dict(window_size=(1, 1)),
    dict(causal=True, window_size=(2, -1)),
    dict(softmax_scale=0.9),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
@pytest.mark.parametrize("shape", [
    (1, 4, 4, 2, 2, 3, None),
    (2, 3, 5, 2, 1, 4, 2),     # Sq < Sk, MQA, Dv != D
    (1, 5, 3, 4, 2, 3, 3),     # Sq > Sk (causal -> empty rows), GQA
])
def test_gradcheck_dense(kw, shape):
    q, k, v = _inputs(*shape)
    f = lambda q, k, v: flash_attn_t.attention(q, k, v, **kw)
    assert gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, softcap=1.0, window_size=(1, -1))],
                         ids=["plain", "causal", "combo"])
def test_gradcheck_varlen(kw):
    lq, lk = [2, 0, 4, 1], [3, 2, 4, 0]
    cu_q = torch.tensor([0, 2, 2, 6, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 5, 9, 9], dtype=torch.int32)
    mk = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)
    q, k, v = mk(sum(lq), 4, 3), mk(sum(lk), 2, 3), mk(sum(lk), 2, 2)
    f = lambda q, k, v: flash_attn_t.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
    assert gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_flash_attn_func():
    q, k, v = _inputs(1, 3, 4, 2, 1, 3)
    f = lambda q, k, v: flash_attn_t.flash_attn_func(q, k, v, causal=True, softcap=2.0)
    assert gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)
