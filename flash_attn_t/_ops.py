"""Registers what torch needs around the C++ ops torch.ops.flash_attn_t.fwd/bwd:
fake (meta) kernels for FakeTensor / torch.compile / torch.export, and autograd.

Shapes (see csrc/flash_attn_t.h): dense q (B, Sq, Hq, D), v (B, Sk, Hkv, Dv)
-> out (B, Sq, Hq, Dv), lse (B, Hq, Sq); varlen q (total_q, Hq, D) ->
out (total_q, Hq, Dv), lse (Hq, total_q). Output shapes depend only on input
shapes, never on kernel tile sizes.
"""
import torch

from . import _C  # noqa: F401  (loads the library that defines the ops)

fwd = torch.ops.flash_attn_t.fwd
bwd = torch.ops.flash_attn_t.bwd


@torch.library.register_fake("flash_attn_t::fwd")
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              softmax_scale, causal, window_left, window_right, softcap,
              deterministic=False):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("flash_attn_t::bwd")
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, softmax_scale, causal, window_left, window_right,
              softcap, deterministic=False):
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


_OPTIONS = ("max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal",
            "window_left", "window_right", "softcap", "deterministic")


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, *options = inputs
    if len(options) < len(_OPTIONS):
        options.append(False)  # deterministic's default
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = dict(zip(_OPTIONS, options))


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    o = ctx.options
    dq, dk, dv = bwd(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                     o["max_seqlen_q"], o["max_seqlen_k"], o["softmax_scale"],
                     o["causal"], o["window_left"], o["window_right"],
                     o["softcap"], o["deterministic"])
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("flash_attn_t::fwd", _backward,
                                setup_context=_setup_context)
