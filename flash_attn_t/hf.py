"""HuggingFace transformers (5.x) integration: ``attn_implementation="flash_attn_t"``.

    import flash_attn_t                      # registers (see register_hf)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flash_attn_t")
    model.set_attn_implementation("flash_attn_t")

What register_hf() does
-----------------------
* ``transformers.AttentionInterface.register("flash_attn_t", flash_attn_t_attention_forward)``
* ``transformers.masking_utils.AttentionMaskInterface.register("flash_attn_t", flash_attention_mask)``:
  the very mask function transformers uses for ``flash_attention_2``. The model then hands the
  attention a 2D boolean padding mask (B, kv_len) -- sliced to the last kv_len columns for
  sliding/static caches -- or ``None`` when nothing is padded. Causality, sliding windows and
  chunking are expressed through kernel arguments, never through a 4D mask.
* Because the name contains "flash", transformers' ``is_flash_attention_requested`` is True for
  it, and ``PreTrainedModel._check_and_adjust_attn_implementation`` then "preloads" a flash
  implementation of that name through ``modeling_flash_attention_utils.lazy_import_flash_attention``;
  for an unknown name that falls through to the Hub ``kernels`` loader and raises
  ``ValueError: Could not find the currently requested flash attention implementation``. We
  therefore wrap ``modeling_flash_attention_utils._lazy_imports`` so that, for "flash_attn_t" only,
  it returns this package's FlashAttention-2-compatible functions (flash_attn_func,
  flash_attn_varlen_func). Every other name goes to the original function unchanged. (A side
  benefit: transformers' own flash code paths that look these functions up get our kernel.)

Semantics of flash_attn_t_attention_forward (mirrors transformers' flash_attention_2 path)
------------------------------------------------------------------------------------------
* inputs (B, H, S, D) as transformers passes them; output (B, S, H, D), attention weights None.
* GQA/MQA: k/v keep their Hkv heads (no repeat_kv); the kernel broadcasts.
* is_causal: the ``is_causal`` argument, else ``module.is_causal``, else True. Causal masking is
  bottom-right aligned, which is what KV-cache decoding and chunked prefill need.
* sliding_window=w (transformers' convention: a causal query sees itself and the w-1 previous
  keys, eager mask ``kv_idx > q_idx - w``) -> window_size=(w-1, 0) when causal and (w-1, w-1)
  otherwise (the symmetric convention transformers' flash path and ModernBERT use).
* softcap, scaling (None -> 1/sqrt(D)) forwarded.
* Padding (2D mask with zeros): unpad to varlen and pad back, exactly like transformers'
  ``_upad_input``: keys use the full mask, queries use the same indices when q_len == kv_len,
  one row per sequence when q_len == 1 (decode), else the last q_len mask columns (assumes left
  padding, as transformers does).
* Packed sequences: explicit ``cu_seq_lens_q/k`` (+ ``max_length_q/k`` or ``max_seqlen_q/k``) take
  precedence over everything except a padding mask; otherwise, with batch 1 and ``position_ids``
  that restart, sequence boundaries are taken where position_ids equals its minimum (as
  transformers' ``prepare_fa_kwargs_from_position_ids``). The restart detection reads the
  tensor, so it is skipped while torch.compile/export traces (pass cu_seq_lens_* instead).
* Host syncs: max_seqlen_q/k are only upper bounds for our kernel, so we pass static shape bounds
  (query/key length, or the packed total length) -- no ``.item()``. User-provided max lengths that
  are Python ints are used as given; tensors are replaced by the static bound (no sync). The only
  remaining syncs are the data-dependent ``nonzero`` of the unpadding (padding mask present) and
  of packed-sequence detection, as in transformers.
* dtype: like transformers' flash path (``get_target_dtype``), fp32 q/k/v are cast to the autocast
  dtype under autocast, to ``config.dtype`` for quantized models, or to the dtype of the module's
  first nn.Linear weight (PEFT's fp32 layer norms). For an fp32 model that is fp32, which our
  kernel supports on CPU and GPU, so nothing is downcast. k/v are cast to q's dtype if different.
* Not supported (raise): dropout > 0 in training (NotImplementedError naming 'dropout'), attention
  sinks (module ``sinks`` attribute or ``s_aux``), ``output_attentions=True``, paged attention
  (``block_table``).
"""
import functools

import torch

NAME = "flash_attn_t"

_registered = False


def _is_tracing():
    try:
        return torch.compiler.is_compiling()
    except Exception:  # pragma: no cover
        return False


def _target_dtype(query, module):
    """transformers.integrations.flash_attention.get_target_dtype, tolerant of odd modules."""
    if query.dtype != torch.float32:
        return None
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "_is_quantized"):
        return getattr(config, "dtype", None)
    if isinstance(module, torch.nn.Module):
        for layer in module.modules():
            if isinstance(layer, torch.nn.Linear):
                return layer.weight.dtype
    return None


def _as_bound(value, bound):
    """max_seqlen for the kernel: a Python int as given, anything else -> the static bound."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return bound


def _unpad_indices(mask2d):
    """mask (B, S) bool -> flat indices of valid tokens, cu_seqlens int32 (B+1)."""
    seqlens = mask2d.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask2d.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu


def _pad_back(x, indices, batch, seqlen):
    out = x.new_zeros((batch * seqlen, *x.shape[1:]))
    out[indices] = x
    return out.view(batch, seqlen, *x.shape[1:])


def _cu_from_position_ids(position_ids):
    """transformers' prepare_fa_kwargs_from_position_ids: starts where position == min."""
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().view(-1).to(torch.int32)
    total = torch.tensor([pos.numel()], dtype=torch.int32, device=pos.device)
    return torch.cat((starts, total))


def _is_packed(position_ids, batch_size):
    """transformers' _is_packed_sequence (reads the tensor: one host sync)."""
    if position_ids is None or batch_size != 1 or position_ids.shape[-1] == 1:
        return False
    inc = torch.arange(position_ids.shape[-1], device=position_ids.device) + position_ids.min()
    return bool((inc - position_ids.reshape(-1)).abs().sum() != 0)


def flash_attn_t_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                   scaling=None, sliding_window=None, softcap=None,
                                   is_causal=None, **kwargs):
    """transformers AttentionInterface function. q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D[v]) ->
    (out (B, Sq, Hq, Dv), None). See the module docstring for the exact semantics."""
    from .interface import attention, attention_varlen

    if kwargs.get("output_attentions", False):
        raise NotImplementedError(
            "flash_attn_t does not compute attention weights (output_attentions=True); "
            "use attn_implementation='eager' for that")
    if dropout is not None and dropout > 0.0 and getattr(module, "training", True):
        raise NotImplementedError(
            f"flash_attn_t does not support attention dropout (dropout={dropout}) in training; "
            "set the config's attention_dropout to 0.0 or call model.eval()")
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise NotImplementedError("flash_attn_t does not support attention sinks (sinks / s_aux)")
    if kwargs.get("block_table") is not None:
        raise NotImplementedError("flash_attn_t does not support paged attention (block_table)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            "flash_attn_t expects a 2D padding mask or None (got a "
            f"{attention_mask.dim()}D mask): was the model's mask built for another attention "
            "implementation? register_hf() registers the flash mask function for 'flash_attn_t'")
    if any(d == 0 for d in query.shape):
        raise ValueError(f"flash_attn_t: query has a zero dimension {tuple(query.shape)}")

    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = bool(is_causal)

    batch, _, q_len, _ = query.shape
    # (B, H, S, D) -> (B, S, H, D)
    q = query.transpose(1, 2)
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)

    target = _target_dtype(q, module)
    if target is not None and target != q.dtype:
        q = q.to(target)
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    if v.dtype != q.dtype:
        v = v.to(q.dtype)

    kv_len = k.shape[1]
    if sliding_window is not None and sliding_window > 0 and kv_len > sliding_window - 1:
        w = int(sliding_window) - 1
        window = (w, 0 if is_causal else w)
    else:
        window = (-1, -1)
    opts = dict(causal=is_causal, softmax_scale=scaling, window_size=window,
                softcap=float(softcap) if softcap else 0.0,
                deterministic=bool(kwargs.get("deterministic") or False))

    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k")
    max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))
    max_k = kwargs.get("max_length_k", kwargs.get("max_seqlen_k"))
    position_ids = kwargs.get("position_ids")

    # 1. padding mask: unpad -> varlen -> pad back
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool)
        if k.shape[1] > mask.shape[-1]:  # static cache larger than the mask: drop the tail
            k, v = k[:, :mask.shape[-1]], v[:, :mask.shape[-1]]
            kv_len = k.shape[1]
        idx_k, cu_seqlens_k = _unpad_indices(mask)
        k_u = k.reshape(-1, *k.shape[2:])[idx_k]
        v_u = v.reshape(-1, *v.shape[2:])[idx_k]
        if q_len == kv_len:
            idx_q, cu_seqlens_q = idx_k, cu_seqlens_k
            q_u = q.reshape(-1, *q.shape[2:])[idx_q]
        elif q_len == 1:
            idx_q = None
            cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
            q_u = q.reshape(batch, *q.shape[2:])
        else:  # assumes left padding, as transformers' _upad_input
            idx_q, cu_seqlens_q = _unpad_indices(mask[:, -q_len:])
            q_u = q.reshape(-1, *q.shape[2:])[idx_q]
        out = attention_varlen(q_u, k_u, v_u, cu_seqlens_q, cu_seqlens_k, q_len, kv_len, **opts)
        if idx_q is None:
            out = out.view(batch, 1, *out.shape[1:])
        else:
            out = _pad_back(out, idx_q, batch, q_len)
        return out, None

    # 2. explicit varlen kwargs (padding-free / DataCollatorWithFlattening)
    if cu_q is not None and cu_k is not None:
        q_f = q.reshape(-1, *q.shape[2:])
        k_f = k.reshape(-1, *k.shape[2:])
        v_f = v.reshape(-1, *v.shape[2:])
        out = attention_varlen(q_f, k_f, v_f, cu_q.to(torch.int32), cu_k.to(torch.int32),
                               _as_bound(max_q, q_f.shape[0]), _as_bound(max_k, k_f.shape[0]),
                               **opts)
        return out.view(batch, -1, *out.shape[1:]), None

    # 3. packed sequences detected from position_ids (batch 1, restarts); not while tracing
    if position_ids is not None and not _is_tracing() and _is_packed(position_ids, batch):
        cu = _cu_from_position_ids(position_ids)
        q_f = q.reshape(-1, *q.shape[2:])
        k_f = k.reshape(-1, *k.shape[2:])
        v_f = v.reshape(-1, *v.shape[2:])
        out = attention_varlen(q_f, k_f, v_f, cu, cu, q_f.shape[0], k_f.shape[0], **opts)
        return out.view(batch, -1, *out.shape[1:]), None

    # 4. dense
    return attention(q, k, v, **opts), None


def _patched_lazy_imports(original):
    @functools.wraps(original)
    def _lazy_imports(implementation, *args, **kwargs):
        if implementation == NAME:
            from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input

            from .interface import flash_attn_func, flash_attn_varlen_func
            return flash_attn_func, flash_attn_varlen_func, None, _pad_input, _unpad_input
        return original(implementation, *args, **kwargs)

    _lazy_imports._flash_attn_t_original = original
    return _lazy_imports


def register_hf():
    """Register "flash_attn_t" with transformers. Idempotent. Returns True when registered (or
    already registered), False when transformers is not installed."""
    global _registered
    if _registered:
        return True
    try:
        import transformers
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return False
    try:
        from transformers.masking_utils import flash_attention_mask as _mask_fn
    except ImportError:  # pragma: no cover - older layouts
        _mask_fn = AttentionMaskInterface._global_mapping["flash_attention_2"]

    AttentionInterface.register(NAME, flash_attn_t_attention_forward)
    AttentionMaskInterface.register(NAME, _mask_fn)

    try:
        from transformers import modeling_flash_attention_utils as mfau
        if hasattr(mfau, "_lazy_imports") and \
                not hasattr(mfau._lazy_imports, "_flash_attn_t_original"):
            mfau._lazy_imports = _patched_lazy_imports(mfau._lazy_imports)
    except ImportError:  # pragma: no cover
        pass
    del transformers
    _registered = True
    return True


__all__ = ["register_hf", "flash_attn_t_attention_forward", "NAME"]
