"""flash_attn_t: exact FlashAttention-style attention for PyTorch.

    import flash_attn_t
    out = flash_attn_t.attention(q, k, v, causal=True)   # (B, S, H, D)
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from .hf import register_hf
from .interface import (attention, attention_varlen, flash_attn_func,
                        flash_attn_varlen_func)

register_hf()  # a no-op returning False when transformers is not installed

__version__ = "0.1.0"


def built_backends():
    """Kernel paths compiled into this build, e.g. ['cpu'] or ['cpu', 'sm80', 'sm90a']."""
    return list(_C.built_backends())


def last_cuda_backend():
    """The CUDA kernel family ('sm80' or 'sm90a') of this thread's last CUDA call,
    '' if none ran.  FLASH_ATTN_T_BACKEND=auto|sm80|sm90a chooses it."""
    return _C.last_cuda_backend()


__all__ = ["attention", "attention_varlen", "flash_attn_func", "flash_attn_varlen_func",
           "built_backends", "last_cuda_backend", "register_hf", "__version__"]
