"""The public Python API: argument checks that need Python, defaults, and the
FlashAttention-2-compatible names. Every numeric limit (head dims, GQA
divisibility, window and softcap ranges, cu_seqlens sanity) is checked once, in
the C core's fat_validate; its message names the argument.

attention:        q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv)
                  -> out (B, Sq, Hq, Dv) [, lse (B, Hq, Sq) fp32]
attention_varlen: q (total_q, Hq, D), k/v (total_k, Hkv, D/Dv),
                  cu_seqlens_q/k (B + 1) int32 -> out (total_q, Hq, Dv)
                  [, lse (Hq, total_q) fp32]
"""
import math

import torch

from . import _ops


def _window(window_size):
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _scale(q, softmax_scale):
    if softmax_scale is not None:
        return float(softmax_scale)
    # head_dim 0 is refused by the core's validator, which names it.
    return 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
              softcap=0.0, return_lse=False, deterministic=False):
    """Exact attention softmax(scale * q k^T + mask) v over (batch, seqlen, heads, dim).

    causal masks keys after the query (bottom-right aligned when Sq != Sk);
    window_size=(left, right) keeps keys in [i + Sk - Sq - left, i + Sk - Sq + right],
    -1 meaning unbounded; softcap > 0 caps scores as softcap * tanh(s / softcap).
    K/V may have fewer heads than q (GQA/MQA). Returns out, or (out, lse) with
    lse (B, Hq, Sq) in float32.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    left, right = _window(window_size)
    out, lse = _ops.fwd(q, k, v, None, None, q.shape[1] if q.dim() == 4 else 0,
                        k.shape[1] if k.dim() == 4 else 0, _scale(q, softmax_scale),
                        bool(causal), left, right, float(softcap), bool(deterministic))
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     return_lse=False, deterministic=False):
    """attention() over packed variable-length sequences.

    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv); sequence b
    holds rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q (int32 prefix sums, B + 1
    entries). max_seqlen_q/k bound the sequence lengths. Returns out
    (total_q, Hq, Dv), or (out, lse) with lse (Hq, total_q) in float32.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        _check_tensor(name, t)
    left, right = _window(window_size)
    out, lse = _ops.fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        _scale(q, softmax_scale), bool(causal), left, right,
                        float(softcap), bool(deterministic))
    return (out, lse) if return_lse else out


def _refuse_unsupported(dropout_p, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p} is not supported yet: use dropout_p=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes is not supported yet: pass alibi_slopes=None")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_func's signature. return_attn_probs=True returns
    (out, softmax_lse, None): the probabilities are never materialised."""
    _refuse_unsupported(dropout_p, alibi_slopes)
    out, lse = attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                         window_size=window_size, softcap=softcap, return_lse=True,
                         deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func's signature (block_table: not supported yet)."""
    _refuse_unsupported(dropout_p, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("block_table (paged KV cache) is not supported yet")
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                window_size=window_size, softcap=softcap,
                                return_lse=True, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out
