"""Bad inputs: exception type and a message naming the argument."""
import re

import pytest
import torch

import flash_attn_t

attention = flash_attn_t.attention
attention_varlen = flash_attn_t.attention_varlen


def _qkv(B=1, Sq=8, Sk=8, Hq=4, Hkv=2, D=16, Dv=None, dtype=torch.float32, device="cpu"):
    Dv = D if Dv is None else Dv
    return (torch.randn(B, Sq, Hq, D, dtype=dtype, device=device),
            torch.randn(B, Sk, Hkv, D, dtype=dtype, device=device),
            torch.randn(B, Sk, Hkv, Dv, dtype=dtype, device=device))


def _vl(lq=(3, 5), lk=(4, 4), Hq=4, Hkv=2, D=16):
    cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32)
    return (torch.randn(sum(lq), Hq, D), torch.randn(sum(lk), Hkv, D), torch.randn(sum(lk), Hkv, D),
            cu_q, cu_k, max(lq), max(lk))


# --- dtypes -----------------------------------------------------------------
@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("other", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_mismatch(which, other):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    args[which] = args[which].to(other)
    with pytest.raises(TypeError, match=rf"\b{which}\b"):
        attention(**args)


def test_dtype_mismatch_q():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"\b(q|k|v)\b"):
        attention(q.half(), k, v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype(dtype):
    q, k, v = _qkv()
    with pytest.raises(TypeError):
        attention(q.to(dtype), k.to(dtype), v.to(dtype))


def test_float64_is_cpu_only_or_ok():
    q, k, v = _qkv(dtype=torch.float64)
    attention(q, k, v)  # CPU float64 must work


def test_varlen_dtype_mismatch():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    with pytest.raises(TypeError, match=r"\bv\b"):
        attention_varlen(q, k, v.half(), cu_q, cu_k, mq, mk)


# --- shapes -----------------------------------------------------------------
@pytest.mark.parametrize("which,shape", [
    ("q", (8, 4, 16)), ("q", (1, 1, 8, 4, 16)), ("k", (8, 2, 16)), ("v", (1, 8, 2, 16, 1)),
])
def test_wrong_rank_dense(which, shape):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    args[which] = torch.randn(*shape)
    # the message names the argument and its shape: the numbers are formatted by the
    # extension's C++ (a second, static libstdc++ in _C garbled or crashed exactly here)
    shown = re.escape("[" + ", ".join(map(str, shape)) + "]")
    with pytest.raises(ValueError, match=rf"\b{which}\b.*{shown}"):
        attention(**args)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_rank_varlen(which):
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    args = dict(q=q, k=k, v=v)
    args[which] = args[which].unsqueeze(0)
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        attention_varlen(args["q"], args["k"], args["v"], cu_q, cu_k, mq, mk)


def test_batch_mismatch():
    q, _, _ = _qkv(B=2)
    _, k, v = _qkv(B=3)
    with pytest.raises(ValueError, match=r"\b(q|k)\b"):
        attention(q, k, v)


def test_batch_mismatch_v():
    q, k, _ = _qkv(B=2)
    v = torch.randn(3, 8, 2, 16)
    with pytest.raises(ValueError, match=r"\bv\b"):
        attention(q, k, v)


def test_seqlen_mismatch_k_v():
    q, k, _ = _qkv()
    v = torch.randn(1, 9, 2, 16)
    with pytest.raises(ValueError, match=r"\b(k|v)\b"):
        attention(q, k, v)


def test_kv_head_mismatch():
    q, k, _ = _qkv()
    v = torch.randn(1, 8, 1, 16)
    with pytest.raises(ValueError, match=r"\b(k|v)\b"):
        attention(q, k, v)


def test_qk_head_dim_mismatch():
    q, _, v = _qkv()
    k = torch.randn(1, 8, 2, 32)
    with pytest.raises(ValueError, match=r"\b(q|k)\b|head_dim"):
        attention(q, k, v)


@pytest.mark.parametrize("D,Dv", [(257, 16), (16, 257), (512, 512)])
def test_head_dim_too_large(D, Dv):
    q, k, v = _qkv(D=D, Dv=Dv)
    with pytest.raises(ValueError, match=r"head_dim"):
        attention(q, k, v)


def test_head_dim_zero():
    q, k, v = _qkv(D=0)
    with pytest.raises(ValueError, match=r"head_dim|\bq\b"):
        attention(q, k, v)


@pytest.mark.parametrize("Hq,Hkv", [(4, 3), (3, 2), (2, 4)])
def test_heads_not_divisible(Hq, Hkv):
    q, k, v = _qkv(Hq=Hq, Hkv=Hkv)
    with pytest.raises(ValueError, match=r"\b(q|k)\b|head"):
        attention(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_last_dim_not_contiguous(which):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    t = args[which]
    args[which] = torch.randn(*t.shape[:-1], t.shape[-1] * 2)[..., ::2]
    assert args[which].stride(-1) != 1
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        attention(**args)


def test_last_dim_not_contiguous_varlen():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    q = torch.randn(q.shape[0], q.shape[1], q.shape[2] * 2)[..., ::2]
    with pytest.raises(ValueError, match=r"\bq\b"):
        attention_varlen(q, k, v, cu_q, cu_k, mq, mk)


# --- options ----------------------------------------------------------------
@pytest.mark.parametrize("window", [(-2, -1), (-1, -2), (-5, 3), (4, -100)])
def test_bad_window(window):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"window_size"):
        attention(q, k, v, window_size=window)


def test_bad_window_causal():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"window_size"):
        attention(q, k, v, causal=True, window_size=(-3, -1))


@pytest.mark.parametrize("softcap", [-1.0, -1e-6])
def test_bad_softcap(softcap):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"softcap"):
        attention(q, k, v, softcap=softcap)


def test_bad_window_and_softcap_varlen():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    with pytest.raises(ValueError, match=r"window_size"):
        attention_varlen(q, k, v, cu_q, cu_k, mq, mk, window_size=(-2, 0))
    with pytest.raises(ValueError, match=r"softcap"):
        attention_varlen(q, k, v, cu_q, cu_k, mq, mk, softcap=-2.0)


# --- cu_seqlens -------------------------------------------------------------
@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.int16])
def test_cu_seqlens_dtype(which, dtype):
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    a[which] = a[which].to(dtype)
    with pytest.raises((TypeError, ValueError), match=which):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq, mk)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_not_monotonic(which):
    q, k, v, cu_q, cu_k, mq, mk = _vl(lq=(3, 5), lk=(4, 4))
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    bad = a[which].clone()
    bad[1] = bad[2] + 1   # [0, x+1, x] decreasing, last entry kept == total
    a[which] = bad
    with pytest.raises(ValueError, match=which):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq, mk)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_negative_start(which):
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    bad = a[which].clone()
    bad[0] = -2
    a[which] = bad
    with pytest.raises(ValueError, match=which):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq, mk)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_past_end(which):
    """A last entry beyond total rows would read out of bounds."""
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    bad = a[which].clone()
    bad[-1] += 100
    a[which] = bad
    with pytest.raises(ValueError, match=which):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq + 100, mk + 100)


def test_cu_seqlens_length_mismatch():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    cu_k3 = torch.tensor([0, 4, 6, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens"):
        attention_varlen(q, k, v, cu_q, cu_k3, mq, mk)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_wrong_rank(which):
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    a[which] = a[which].view(1, -1)
    with pytest.raises(ValueError, match=which):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq, mk)


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_too_short(which):
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    a = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    a[which] = torch.zeros(0, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens"):
        attention_varlen(q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], mq, mk)


def test_varlen_not_tensor():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        attention_varlen(q, k, v, [0, 3, 8], cu_k, mq, mk)


def test_not_a_tensor():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"\bk\b"):
        attention(q, k.numpy(), v)


# --- device -----------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("which", ["k", "v"])
def test_device_mismatch(which):
    q, k, v = _qkv(device="cuda", dtype=torch.float16)
    args = dict(q=q, k=k, v=v)
    args[which] = args[which].cpu()
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        attention(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_mismatch_cu_seqlens():
    q, k, v, cu_q, cu_k, mq, mk = _vl()
    q, k, v, cu_k = q.cuda().half(), k.cuda().half(), v.cuda().half(), cu_k.cuda()
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention_varlen(q, k, v, cu_q, cu_k, mq, mk)


# --- FlashAttention-2 compatibility: unsupported features ---------------------
def test_dropout_not_implemented():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_t.flash_attn_func(q, k, v, dropout_p=0.1)
    q2, k2, v2, cu_q, cu_k, mq, mk = _vl()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_t.flash_attn_varlen_func(q2, k2, v2, cu_q, cu_k, mq, mk, dropout_p=0.5)


def test_alibi_not_implemented():
    q, k, v = _qkv()
    slopes = torch.rand(4)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        flash_attn_t.flash_attn_func(q, k, v, alibi_slopes=slopes)
    q2, k2, v2, cu_q, cu_k, mq, mk = _vl()
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        flash_attn_t.flash_attn_varlen_func(q2, k2, v2, cu_q, cu_k, mq, mk, alibi_slopes=slopes)


def test_dropout_zero_ok():
    q, k, v = _qkv()
    torch.testing.assert_close(flash_attn_t.flash_attn_func(q, k, v, dropout_p=0.0),
                               attention(q, k, v), rtol=0, atol=0)
