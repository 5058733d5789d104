#!/usr/bin/env python
"""Benchmark suite for flash_attn_t against torch SDPA backends and FlexAttention.

    python benchmarks/bench.py [--suite fa3|gqa|varlen|long|all] [--quick]
                               [--device cpu|cuda] [--impl ...] [--out benchmarks/results]
    python benchmarks/bench.py --suite fa3 --merge a/fa3.json b/fa3.json   # partial runs -> one
    (--time-limit S: no new point after S seconds; the results are still written)

See benchmarks/README.md.  Results: <out>/<gpu-slug|cpu>/<suite>.{json,md,png}.
"""
import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.append(REPO)  # an in-place build of flash_attn_t; an installed one wins

try:
    import flash_attn_t as fat  # noqa: E402
    FAT_ERROR = None
except Exception as e:  # ImportError, missing .so, anything: the suite still runs
    fat = None
    FAT_ERROR = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")

try:
    import triton.testing as _tt  # noqa: E402
except Exception:
    _tt = None

OPS = ("fwd", "bwd", "fwdbwd")
OP_FLOP_MULT = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FAT_IMPLS = ("fat-sm90a", "fat-sm80", "fat-cpu", "fat-auto")
SDPA_CUDA = ("sdpa-flash2", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
ALL_IMPLS = FAT_IMPLS + SDPA_CUDA + ("flex", "sdpa-cpu")


# --------------------------------------------------------------------------- FLOPs / masks
def visible_bounds(sq, sk, causal, window, device="cpu"):
    """Per query row i: [lo_i, hi_i] of visible keys (bottom-right aligned, as flash_attn_t.h)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, dtype=torch.int64, device=device)
    shift = sk - sq
    hi = (i + shift + right).clamp(max=sk - 1) if right >= 0 else torch.full_like(i, sk - 1)
    lo = (i + shift - left).clamp(min=0) if left >= 0 else torch.zeros_like(i)
    return lo, hi


def visible_pairs(sq, sk, causal, window):
    lo, hi = visible_bounds(sq, sk, causal, window)
    return int((hi - lo + 1).clamp(min=0).sum().item())


def fwd_flops(p):
    """4 * H * D * (#visible (i, j) pairs), summed over sequences (FA3 convention)."""
    if p["kind"] == "varlen":
        pairs = sum(visible_pairs(L, L, p["causal"], p["window"]) for L in p["lens"])
    else:
        pairs = p["batch"] * visible_pairs(p["seqlen_q"], p["seqlen_k"], p["causal"], p["window"])
    return 4.0 * p["heads_q"] * p["head_dim"] * pairs


# --------------------------------------------------------------------------- reference
def ref_attention(q, k, v, causal, window, scale, budget=1 << 30):
    """float64 exact attention, (B, S, H, D) layout, chunked over query blocks."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    q64 = q.detach().double().transpose(1, 2)
    k64 = k.detach().double().transpose(1, 2)
    v64 = v.detach().double().transpose(1, 2)
    if Hkv != Hq:
        k64 = k64.repeat_interleave(Hq // Hkv, dim=1)
        v64 = v64.repeat_interleave(Hq // Hkv, dim=1)
    lo, hi = visible_bounds(Sq, Sk, causal, window, device=q.device)
    cols = torch.arange(Sk, device=q.device)
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=torch.float64, device=q.device)
    bq = max(1, min(Sq, budget // max(1, B * Hq * Sk * 8 * 3)))
    for s in range(0, Sq, bq):
        e = min(Sq, s + bq)
        sc = torch.matmul(q64[:, :, s:e], k64.transpose(-1, -2)) * scale
        allowed = (cols[None, :] >= lo[s:e, None]) & (cols[None, :] <= hi[s:e, None])
        sc.masked_fill_(~allowed, float("-inf"))
        m = sc.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        pexp = torch.exp(sc - m)
        del sc
        l = pexp.sum(dim=-1, keepdim=True)
        o = torch.matmul(pexp, v64) / torch.where(l > 0, l, torch.ones_like(l))
        out[:, :, s:e] = o
        del pexp, o
    return out.transpose(1, 2)


def rel_error(out, ref):
    if out is None or ref is None:
        return None
    o = out.detach().double()
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(o - ref).item()
    return num / den if den > 0 else num


# --------------------------------------------------------------------------- timing
_FLUSH = {}


def _flush_l2(device):
    buf = _FLUSH.get(device)
    if buf is None:
        buf = _FLUSH[device] = torch.empty(256 << 20, dtype=torch.int8, device=device)
    buf.zero_()


def _cuda_once(fn):
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def bench_ms(fn, device, warmup_ms, rep_ms):
    """Median milliseconds of fn() (already called once: compiled/warm)."""
    if device.type == "cuda":
        _flush_l2(device)
        first = _cuda_once(fn)
        if first > 500.0:  # long calls (e.g. 1M tokens): median of 3 plain runs
            ts = [first]
            for _ in range(2):
                _flush_l2(device)
                ts.append(_cuda_once(fn))
            return sorted(ts)[1]
        if _tt is not None:
            # do_bench zeroes a 256 MB buffer before each timed call (L2 flushed), CUDA events.
            return float(_tt.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        n_warm = max(1, int(warmup_ms / max(first, 1e-3)))
        for _ in range(min(n_warm, 100)):
            fn()
        n = max(3, min(1000, int(rep_ms / max(first, 1e-3))))
        ts = []
        for _ in range(n):
            _flush_l2(device)
            ts.append(_cuda_once(fn))
        ts.sort()
        return ts[len(ts) // 2]
    # CPU: perf_counter loop, median over repeats
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    ts = [first]
    n = 2 if first > 500.0 else max(3, min(200, int(rep_ms / max(first, 1e-3))))
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def is_oom(e):
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def free_mem(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def short(msg, n=500):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


# --------------------------------------------------------------------------- implementations
def fat_backends():
    if fat is None:
        return None
    try:
        return list(fat.built_backends())
    except Exception:
        return None


def impl_unavailable(name, device):
    """None when the implementation can run on this device, else the reason."""
    if name.startswith("fat-"):
        if fat is None:
            return "flash_attn_t unavailable (%s)" % FAT_ERROR
        path = name[4:]
        if path == "auto":
            return None
        bk = fat_backends()
        if bk is not None and path not in bk:
            return "backend %s not built (built_backends()=%s)" % (path, bk)
        if path == "cpu":
            return None if device.type == "cpu" else "cpu path needs --device cpu"
        if device.type != "cuda":
            return "%s needs a CUDA device" % path
        cap = torch.cuda.get_device_capability(device)
        if path == "sm80" and cap < (8, 0):
            return "sm80 path needs compute capability >= 8.0, have %d.%d" % cap
        if path == "sm90a" and cap != (9, 0):
            return "sm90a path needs compute capability 9.0, have %d.%d" % cap
        return None
    if name == "sdpa-cpu":
        return None if device.type == "cpu" else "sdpa-cpu is the CPU SDPA (use --device cpu)"
    if name in SDPA_CUDA:
        return None if device.type == "cuda" else "%s needs CUDA" % name
    if name == "flex":
        if device.type != "cuda":
            return "flex benchmarked on CUDA only"
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except Exception as e:
            return "flex_attention unavailable: %s" % short(e)
        return None
    return "unknown implementation"


@contextlib.contextmanager
def fat_env(name):
    """Force the flash_attn_t kernel path for the whole measurement (fwd and bwd)."""
    if not name.startswith("fat-"):
        yield
        return
    old = os.environ.get("FLASH_ATTN_T_BACKEND")
    os.environ["FLASH_ATTN_T_BACKEND"] = name[4:]
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FLASH_ATTN_T_BACKEND", None)
        else:
            os.environ["FLASH_ATTN_T_BACKEND"] = old


def _sdpa_ctx(name):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    be = {"sdpa-flash2": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
          "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa-math": SDPBackend.MATH}.get(name)
    # a fresh context manager per call: sdpa_kernel's is single-use
    return (lambda: sdpa_kernel(be)) if be is not None else contextlib.nullcontext


_FLEX = {}


def _flex_fn():
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        cfg = torch._dynamo.config
        for attr in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(cfg, attr):
                setattr(cfg, attr, max(getattr(cfg, attr), 4096))
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def _flex_block_mask(key, mask_mod, q_len, kv_len, device):
    from torch.nn.attention.flex_attention import create_block_mask
    bm = _FLEX.get(key)
    if bm is None:
        if len([k for k in _FLEX if isinstance(k, tuple)]) > 8:  # bound the cache
            for k in [k for k in _FLEX if isinstance(k, tuple)]:
                del _FLEX[k]
        bm = _FLEX[key] = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)
    return bm


def _window_mask_mod(sq, sk, causal, window):
    left, right = window
    if causal:
        right = 0
    shift = sk - sq
    if left < 0 and right < 0:
        return None

    def mask_mod(b, h, qi, kvi):
        ok = qi >= 0
        if right >= 0:
            ok = ok & (kvi <= qi + shift + right)
        if left >= 0:
            ok = ok & (kvi >= qi + shift - left)
        return ok
    return mask_mod


class Built:
    """fwd() -> native output; leaves: tensors to differentiate; dout: native cotangent;
    common(out) -> output in the reference layout."""

    def __init__(self, fwd, leaves, dout, common):
        self.fwd, self.leaves, self.dout, self.common = fwd, leaves, dout, common


def build_dense(name, p, d):
    q, k, v, dout = d["q"], d["k"], d["v"], d["dout"]
    causal, window, scale = p["causal"], p["window"], p["scale"]
    gqa = p["heads_q"] != p["heads_kv"]
    if name.startswith("fat-"):
        def fwd():
            return fat.attention(q, k, v, causal=causal, softmax_scale=scale, window_size=window)
        return Built(fwd, (q, k, v), dout, lambda o: o)
    if name.startswith("sdpa-"):
        if tuple(window) != (-1, -1):
            raise NotImplementedError("SDPA has no sliding window (without a dense mask)")
        if causal and p["seqlen_q"] != p["seqlen_k"]:
            raise NotImplementedError("SDPA is_causal is top-left aligned for Sq != Sk")
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        kw = {"enable_gqa": True} if gqa else {}
        ctx = _sdpa_ctx(name)

        def fwd():
            with ctx():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, **kw)
        return Built(fwd, (q, k, v), None if dout is None else dout.transpose(1, 2),
                     lambda o: o.transpose(1, 2))
    if name == "flex":
        flex = _flex_fn()
        mm = _window_mask_mod(p["seqlen_q"], p["seqlen_k"], causal, window)
        bm = None
        if mm is not None:
            bm = _flex_block_mask(("dense", p["seqlen_q"], p["seqlen_k"], causal, tuple(window)),
                                  mm, p["seqlen_q"], p["seqlen_k"], q.device)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def fwd():
            return flex(qt, kt, vt, block_mask=bm, scale=scale, enable_gqa=gqa)
        return Built(fwd, (q, k, v), None if dout is None else dout.transpose(1, 2),
                     lambda o: o.transpose(1, 2))
    raise NotImplementedError(name)


def build_varlen(name, p, d):
    q, k, v, dout = d["q"], d["k"], d["v"], d["dout"]  # (total, H, D)
    causal, window, scale = p["causal"], p["window"], p["scale"]
    gqa = p["heads_q"] != p["heads_kv"]
    if name.startswith("fat-"):
        cu, mx = d["cu"], p["seqlen_q"]

        def fwd():
            return fat.attention_varlen(q, k, v, cu, cu, mx, mx, causal=causal,
                                        softmax_scale=scale, window_size=window)
        return Built(fwd, (q, k, v), dout, lambda o: o)
    if name.startswith("sdpa-"):
        if tuple(window) != (-1, -1):
            raise NotImplementedError("SDPA has no sliding window (without a dense mask)")
        if "pad" not in d:  # padded copies (B, Smax, H, D), shared by the SDPA backends
            valid = d["valid"]
            B, Smax = valid.shape

            def pad(x, grad):
                y = x.new_zeros((B, Smax) + tuple(x.shape[1:]))
                y[valid] = x.detach()
                return y.requires_grad_(grad)
            g = q.requires_grad
            d["pad"] = (pad(q, g), pad(k, g), pad(v, g), None if dout is None else pad(dout, False))
        qp, kp, vp, dp = d["pad"]
        valid = d["valid"]
        qt, kt, vt = qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2)
        kw = {"enable_gqa": True} if gqa else {}
        mask = None
        if not causal:  # keys past a sequence's end must not be seen: boolean key-padding mask
            mask = valid[:, None, None, :]
        # causal: padding sits after the real tokens, so real rows never see it.
        ctx = _sdpa_ctx(name)

        def fwd():
            with ctx():
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal,
                                                      scale=scale, **kw)
        return Built(fwd, (qp, kp, vp), None if dp is None else dp.transpose(1, 2),
                     lambda o: o.transpose(1, 2)[valid])
    if name == "flex":
        flex = _flex_fn()
        doc = d["doc"]
        left, right = window
        if causal:
            right = 0

        def mask_mod(b, h, qi, kvi):
            ok = doc[qi] == doc[kvi]
            if right >= 0:
                ok = ok & (kvi <= qi + right)
            if left >= 0:
                ok = ok & (kvi >= qi - left)
            return ok
        T = q.shape[0]
        bm = _flex_block_mask(("varlen", tuple(p["lens"]), causal, tuple(window)), mask_mod, T, T,
                              q.device)
        qt, kt, vt = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))

        def fwd():
            return flex(qt, kt, vt, block_mask=bm, scale=scale, enable_gqa=gqa)
        return Built(fwd, (q, k, v), None if dout is None else dout.unsqueeze(0).transpose(1, 2),
                     lambda o: o.transpose(1, 2)[0])
    raise NotImplementedError(name)


# --------------------------------------------------------------------------- data
def make_data(p, device, dtype, need_grad, ref_max_seqlen, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape):
        x = torch.randn(*shape, generator=g, dtype=torch.float32) if device.type == "cpu" else \
            torch.randn(*shape, device=device, dtype=torch.float32)
        return x.to(device=device, dtype=dtype).requires_grad_(need_grad)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    Hq, Hkv, D = p["heads_q"], p["heads_kv"], p["head_dim"]
    d = {}
    if p["kind"] == "varlen":
        T = sum(p["lens"])
        d["q"], d["k"], d["v"] = rnd(T, Hq, D), rnd(T, Hkv, D), rnd(T, Hkv, D)
        d["dout"] = rnd(T, Hq, D).detach() if need_grad else None
        lens = torch.tensor(p["lens"], dtype=torch.int64)
        cu = torch.zeros(len(p["lens"]) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
        d["cu"] = cu.to(device)
        d["doc"] = torch.repeat_interleave(torch.arange(len(p["lens"])), lens).to(device)
        Smax = max(p["lens"])
        d["valid"] = (torch.arange(Smax)[None, :] < lens[:, None]).to(device)
        ref = None
        if Smax <= ref_max_seqlen:
            parts = []
            for i, L in enumerate(p["lens"]):
                s, e = int(cu[i]), int(cu[i + 1])
                parts.append(ref_attention(d["q"][None, s:e], d["k"][None, s:e], d["v"][None, s:e],
                                           p["causal"], p["window"], p["scale"])[0])
            ref = torch.cat(parts, 0)
        d["ref"] = ref
    else:
        B, Sq, Sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
        d["q"], d["k"], d["v"] = rnd(B, Sq, Hq, D), rnd(B, Sk, Hkv, D), rnd(B, Sk, Hkv, D)
        d["dout"] = rnd(B, Sq, Hq, D).detach() if need_grad else None
        d["ref"] = (ref_attention(d["q"], d["k"], d["v"], p["causal"], p["window"], p["scale"])
                    if max(Sq, Sk) <= ref_max_seqlen else None)
    return d


# --------------------------------------------------------------------------- one point
def measure(name, p, d, ops, device, args):
    """Rows for implementation `name` at point p: one per op."""
    rows = []
    flops = fwd_flops(p)
    base = {k: p[k] for k in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim",
                              "causal")}
    base["window"] = list(p["window"])
    base["dtype"] = args.dtype
    base["input_bytes"] = sum(d[x].numel() * d[x].element_size() for x in ("q", "k", "v"))
    if p["kind"] == "varlen":
        base["total_tokens"] = sum(p["lens"])
        base["avg_seqlen"] = p["avg_seqlen"]

    def row(op, status, ms=None, peak=None, err=None):
        r = dict(impl=name, op=op, **base)
        r.update(tflops=(OP_FLOP_MULT[op] * flops / (ms * 1e-3) / 1e12) if ms else None,
                 ms=ms, peak_bytes=peak, rel_error=err, status=status)
        return r

    why = impl_unavailable(name, device)
    if why:
        return [row(op, "skipped: " + why) for op in ops]
    builder = build_varlen if p["kind"] == "varlen" else build_dense
    err_cache = {}
    failed = None
    oom_hit = False
    with fat_env(name):
        try:
            b = builder(name, p, d)
        except Exception as e:
            return [row(op, "skipped: " + short("%s: %s" % (type(e).__name__, e))) for op in ops]
        for op in ops:
            if failed:
                rows.append(row(op, "skipped: " + failed))
                continue
            out = None
            try:
                if op == "fwd":
                    def fn():
                        with torch.no_grad():
                            return b.fwd()
                elif op == "bwd":
                    out = b.fwd()
                    dout, leaves = b.dout, b.leaves

                    def fn():
                        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
                else:
                    dout, leaves = b.dout, b.leaves

                    def fn():
                        return torch.autograd.grad(b.fwd(), leaves, dout)
                with warnings.catch_warnings(record=True) as wl:
                    warnings.simplefilter("always")
                    try:
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                            base_mem = torch.cuda.memory_allocated(device)
                            torch.cuda.reset_peak_memory_stats(device)
                        res = fn()  # first call: compile / warm, peak memory, accuracy
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                            peak = torch.cuda.max_memory_allocated(device) - base_mem
                        else:
                            peak = None
                    except Exception as e:
                        msgs = [re.sub(r"\(Triggered internally at [^)]*\)\.?", "", str(w.message))
                                for w in wl if issubclass(w.category, UserWarning)]
                        msgs = [short(m, 160) for m in msgs if m.strip()][:5]
                        raise RuntimeError(short("%s: %s" % (type(e).__name__, e), 200)
                                           + ("" if not msgs else " | " + " | ".join(msgs))) from e
                if op == "fwd":
                    err_cache["fwd"] = rel_error(b.common(res), d["ref"])
                    if args.check_finite and not torch.isfinite(res).all():
                        raise RuntimeError("non-finite output")
                del res
                ms = bench_ms(fn, device, args.warmup_ms, args.rep_ms)
                rows.append(row(op, "ok", ms, peak, err_cache.get("fwd")))
            except Exception as e:
                reason = short(e)
                if is_oom(e) or is_oom(getattr(e, "__cause__", "") or ""):
                    reason = "OOM: " + reason
                    failed = reason
                    oom_hit = True
                elif op == "fwd":
                    failed = reason  # forward broken: do not try bwd with it
                rows.append(row(op, "skipped: " + reason))
            finally:
                out = None  # noqa: F841
                fn = None
                if oom_hit:
                    free_mem(device)
    return rows


# --------------------------------------------------------------------------- suites
def _tokens_batch(tokens, s):
    return max(1, tokens // s)


def suite_points(suite, args):
    q = args.quick
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    pts = []

    def dense(b, s, hq, hkv, dd, c, ops):
        return dict(kind="dense", batch=b, seqlen_q=s, seqlen_k=s, heads_q=hq, heads_kv=hkv,
                    head_dim=dd, causal=c, window=(-1, -1), scale=1.0 / math.sqrt(dd), ops=ops)
    tokens = args.tokens or (512 if q else 16384)
    if suite in ("fa3", "gqa"):
        seqlens = args.seqlens or ((128, 256) if q else (512, 1024, 2048, 4096, 8192, 16384))
        if suite == "fa3":
            hds = args.head_dims or ((64,) if q else (64, 128, 256))
            hidden = 128 if q else 2048
            for dd in hds:
                for c in causals:
                    for s in seqlens:
                        h = max(1, hidden // dd)
                        pts.append(dense(_tokens_batch(tokens, s), s, h, h, dd, c, OPS))
        else:
            hq, hkv = (4, 2) if q else (32, 8)
            for dd in (args.head_dims or ((64,) if q else (128,))):
                for c in causals:
                    for s in seqlens:
                        pts.append(dense(_tokens_batch(tokens, s), s, hq, hkv, dd, c, OPS))
    elif suite == "varlen":
        avgs = args.seqlens or ((64, 128) if q else (512, 1024, 2048, 4096, 8192))
        hds = args.head_dims or ((64,) if q else (128,))
        hidden = 128 if q else 2048
        for dd in hds:
            for c in causals:
                for a in avgs:
                    g = torch.Generator().manual_seed(1000 + a)
                    lens, tot = [], 0
                    while tot < tokens:
                        L = int(torch.randint(max(1, a // 4), max(2, (7 * a) // 4) + 1, (1,),
                                              generator=g))
                        L = min(L, tokens - tot)
                        lens.append(L)
                        tot += L
                    h = max(1, hidden // dd)
                    pts.append(dict(kind="varlen", batch=len(lens), seqlen_q=max(lens),
                                    seqlen_k=max(lens), heads_q=h, heads_kv=h, head_dim=dd,
                                    causal=c, window=(-1, -1), scale=1.0 / math.sqrt(dd),
                                    lens=lens, avg_seqlen=a, ops=OPS))
    elif suite == "long":
        cs = causals if args.causal != "both" else (True,)  # causal by default: 1M is long
        start, cap = (256, 1024) if q else (16384, args.max_seqlen)
        h, dd = (2, 64) if q else (16, 128)
        seqlens = args.seqlens or tuple(start << i for i in range(40) if (start << i) <= cap)
        for c in cs:
            for s in seqlens:
                pts.append(dense(1, s, h, h, args.head_dims[0] if args.head_dims else dd, c, ("fwd",)))
    return pts


def default_impls(suite, device):
    if device.type == "cpu":
        return ["fat-cpu", "sdpa-cpu"]
    fats = ["fat-sm90a", "fat-sm80"]
    if suite == "long":
        return fats + ["sdpa-flash2", "sdpa-cudnn"]
    return fats + list(SDPA_CUDA) + ["flex"]


# --------------------------------------------------------------------------- reporting
def fmt_t(r):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return "skip"
    t = r["tflops"]
    return "%.1f" % t if t >= 100 else "%.2f" % t if t >= 1 else "%.3g" % t


def ratio_info(rows, op):
    ok = [r for r in rows if r["op"] == op and r["status"] == "ok" and r["tflops"]]
    f = [r for r in ok if r["impl"].startswith("fat-")]
    a = [r for r in ok if not r["impl"].startswith("fat-")]
    if not f or not a:
        return None, None, None
    bf = max(f, key=lambda r: r["tflops"])
    ba = max(a, key=lambda r: r["tflops"])
    return bf["tflops"] / ba["tflops"], bf["impl"], ba["impl"]


def print_point(suite, p, rows, ops, impls, seen_notes):
    desc = ("%s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d causal=%s" %
            (suite, p["batch"], p["seqlen_q"], p["seqlen_k"], p["heads_q"], p["heads_kv"],
             p["head_dim"], p["causal"]))
    if p["kind"] == "varlen":
        desc += " varlen(avg=%d, n=%d, total=%d)" % (p["avg_seqlen"], len(p["lens"]), sum(p["lens"]))
    print("\n== " + desc + "  fwd GFLOP=%.2f" % (fwd_flops(p) / 1e9))
    hdr = "  %-15s" % "impl" + "".join("%13s" % (o + " TF/s") for o in ops) + \
        "".join("%11s" % (o + " ms") for o in ops) + "%10s %9s" % ("rel_err", "peak MiB")
    print(hdr)
    notes = []
    for name in impls:
        rs = {r["op"]: r for r in rows if r["impl"] == name}
        line = "  %-15s" % name + "".join("%13s" % fmt_t(rs.get(o)) for o in ops)
        line += "".join("%11s" % ("%.3f" % rs[o]["ms"] if rs.get(o) and rs[o]["ms"] else "-")
                        for o in ops)
        err = next((r["rel_error"] for r in rs.values() if r["rel_error"] is not None), None)
        pk = [r["peak_bytes"] for r in rs.values() if r["peak_bytes"] is not None]
        line += "%10s %9s" % ("%.2e" % err if err is not None else "-",
                               "%.0f" % (max(pk) / 2**20) if pk else "-")
        print(line)
        reasons = sorted({r["status"][9:] for r in rs.values() if r["status"] != "ok"})
        for rs_ in reasons:
            if (name, rs_) not in seen_notes:  # each skip reason printed once per suite
                seen_notes.add((name, rs_))
                notes.append("    skipped %s: %s" % (name, rs_))
    parts = []
    for o in ops:
        x, bf, ba = ratio_info(rows, o)
        parts.append("%s %s" % (o, "n/a" if x is None else "%.2fx (%s vs %s)" % (x, bf, ba)))
    print("  flash_attn_t / best alternative: " + "; ".join(parts))
    for n in notes:
        print(n)
    sys.stdout.flush()


def write_md(path, suite, meta, rows):
    impls = []
    for r in rows:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    keyf = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "causal")
    lines = ["# flash_attn_t benchmark: %s" % suite, "",
             "gpu: %s | torch %s | cuda %s | driver %s | commit %s | %s" %
             (meta["gpu"], meta["torch"], meta["cuda"], meta["driver"], meta["git_commit"],
              meta["date"]), "", *command_lines(meta), "",
             *(["**Incomplete:** %s." % meta["incomplete"], ""] if meta.get("incomplete") else []),
             "TFLOPS (fwd = 4·H·D·visible pairs; bwd = 2.5x, fwdbwd = 3.5x). "
             "ratio = best flash_attn_t path / best alternative.", ""]
    for op in OPS:
        ops_rows = [r for r in rows if r["op"] == op]
        if not ops_rows:
            continue
        lines += ["## %s" % op, "",
                  "| B | Sq | Sk | Hq | Hkv | D | causal | " + " | ".join(impls) +
                  " | ratio | fat rel_err |",
                  "|" + "---|" * (7 + len(impls) + 2)]
        pts = []
        for r in ops_rows:
            k = tuple(r[f] for f in keyf) + (r.get("avg_seqlen"),)
            if k not in pts:
                pts.append(k)
        for k in pts:
            prs = [r for r in ops_rows if tuple(r[f] for f in keyf) + (r.get("avg_seqlen"),) == k]
            cells = []
            for name in impls:
                r = next((x for x in prs if x["impl"] == name), None)
                cells.append(fmt_t(r))
            x, bf, _ = ratio_info(prs, op)
            fe = next((r["rel_error"] for r in prs if r["impl"] == bf), None) if bf else None
            sq = "%d" % k[1] if k[7] is None else "avg %d (max %d)" % (k[7], k[1])
            lines.append("| %d | %s | %d | %d | %d | %d | %s | " % (k[0], sq, k[2], k[3], k[4], k[5],
                                                                     k[6]) +
                         " | ".join(cells) + " | %s | %s |" %
                         ("-" if x is None else "%.2fx" % x, "-" if fe is None else "%.1e" % fe))
        lines.append("")
    reasons = {}
    for r in rows:
        if r["status"] != "ok":
            reasons.setdefault((r["impl"], r["status"]), 0)
            reasons[(r["impl"], r["status"])] += 1
    if reasons:
        lines += ["## skipped", ""]
        for (name, st), n in sorted(reasons.items()):
            lines.append("- %s (%d points): %s" % (name, n, st[9:]))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def command_lines(meta):
    """The command that made a result; a merge's (merge() writes the three lists) each with
    its commit and date."""
    if "commands" not in meta:
        return ["`%s`" % meta["command"]]
    return ["`%s` (commit %s, %s)" % (c, (g or "?")[:7], (d or "?")[:16])
            for c, g, d in zip(meta["commands"], meta["git_commits"], meta["dates"])]


def git_commit():
    """HEAD of this checkout; FLASH_ATTN_T_COMMIT where the copy has no git history (the lent
    GPU machine's copy of the working tree)."""
    if os.environ.get("FLASH_ATTN_T_COMMIT"):
        return os.environ["FLASH_ATTN_T_COMMIT"]
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip() or None
    except Exception:
        return None


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except Exception:
        return None


def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "gpu"


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", choices=("fa3", "gqa", "varlen", "long", "all"), default=None,
                    help="default: fa3 (all with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny fp32 grid for CI smoke tests")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    ap.add_argument("--impl", nargs="+", default=None,
                    help="implementations (space/comma separated) from: " + ", ".join(ALL_IMPLS))
    ap.add_argument("--skip-impl", nargs="+", default=[], help="implementations to leave out")
    ap.add_argument("--ops", nargs="+", default=None, choices=OPS)
    ap.add_argument("--seqlens", type=int, nargs="+", default=None,
                    help="override seqlens (varlen: average lengths)")
    ap.add_argument("--head-dims", type=int, nargs="+", default=None)
    ap.add_argument("--causal", choices=("both", "true", "false"), default="both",
                    help="long suite: causal only unless true/false is given")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                    help="default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--tokens", type=int, default=None, help="batch*seqlen (default 16384)")
    ap.add_argument("--max-seqlen", type=int, default=1 << 20, help="long suite cap")
    ap.add_argument("--warmup-ms", type=float, default=10.0)
    ap.add_argument("--rep-ms", type=float, default=50.0)
    ap.add_argument("--ref-max-seqlen", type=int, default=None,
                    help="float64 reference up to this seqlen (default 16384 cuda, 2048 cpu)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads for CPU runs (default: torch's; 1 with --quick)")
    ap.add_argument("--check-finite", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--plot", action="store_true", help="plots even with --quick (off there)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="start no new point after this many seconds; what was measured is "
                         "written (json, md, plots) and marked incomplete")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="no measuring: merge these result files of one suite (--suite, or "
                         "their common name <suite>.json; partial runs; "
                         "a later file's row replaces an earlier one's for the same impl, op "
                         "and point) and write its json, md and plots under --out")
    a = ap.parse_args(argv)
    if a.suite is None and not a.merge:
        a.suite = "all" if a.quick else "fa3"
    if a.impl:
        a.impl = [x for s in a.impl for x in s.split(",") if x]
    a.skip_impl = [x for s in a.skip_impl for x in s.split(",") if x]
    return a


ROW_KEY = ("impl", "op", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim",
           "causal", "window", "avg_seqlen", "dtype")


def write_suite(suite, meta, rows, outdir, plots):
    """<outdir>/<suite>.json and .md, and the plots; returns the paths written."""
    jpath, mpath = os.path.join(outdir, suite + ".json"), os.path.join(outdir, suite + ".md")
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    write_md(mpath, suite, meta, rows)
    written = [jpath, mpath]
    if plots:
        try:
            import plot  # benchmarks/plot.py (benchmarks/ is sys.path[0])
            written += plot.plot_suite(suite, rows, outdir, meta)
        except ImportError as e:
            print("plots skipped (%s)" % short(e, 100))
        except Exception as e:
            print("plots failed: %s" % short(e))
    return written


def merge(args):
    """--merge: one suite's result files -> one result (rows in first-seen point order)."""
    if args.suite is None:  # from the file names, as bench.py writes them (<suite>.json)
        names = {os.path.splitext(os.path.basename(p))[0] for p in args.merge}
        args.suite = names.pop() if len(names) == 1 else None
    if args.suite not in ("fa3", "gqa", "varlen", "long"):
        print("error: --merge needs --suite fa3|gqa|varlen|long (or files named <suite>.json)",
              file=sys.stderr)
        return 2
    metas, rows, index = [], [], {}
    for path in args.merge:
        with open(path) as f:
            d = json.load(f)
        metas.append(d["meta"])
        for r in d["rows"]:
            k = tuple(json.dumps(r.get(f)) for f in ROW_KEY)
            if k in index:
                rows[index[k]] = r
            else:
                index[k] = len(rows)
                rows.append(r)
    # the suites' own point order: head dim, mask, length (stable: impls keep their order)
    rows.sort(key=lambda r: (r["head_dim"], r["causal"], r.get("avg_seqlen") or r["seqlen_q"]))
    meta = dict(metas[0])
    meta.pop("incomplete", None)
    # one entry per bench.py run; a file that is itself a merge brings its own lists
    def runs(many, one):
        return [x for m in metas for x in (m[many] if many in m else [m.get(one)])]
    parts = runs("incomplete_parts", "incomplete")
    meta.pop("incomplete_parts", None)
    if any(parts):
        meta["incomplete_parts"] = parts
    meta["commands"] = runs("commands", "command")
    meta["git_commits"] = runs("git_commits", "git_commit")
    meta["dates"] = runs("dates", "date")
    outdir = os.path.join(args.out, slug(meta["gpu"]) if meta.get("gpu") else "cpu")
    os.makedirs(outdir, exist_ok=True)
    print("merged %d rows from %d files: wrote %s" % (
        len(rows), len(args.merge),
        ", ".join(write_suite(args.suite, meta, rows, outdir, not args.no_plot))))
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    if args.device is None:
        args.device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" \
        else torch.device("cpu")
    if args.dtype is None:
        args.dtype = "fp32" if (args.quick or device.type == "cpu") else "bf16"
    dtype = DTYPES[args.dtype]
    if args.ref_max_seqlen is None:
        args.ref_max_seqlen = 16384 if device.type == "cuda" else 2048
    if args.threads is None and args.quick and device.type == "cpu":
        args.threads = 1  # smoke test: robust against a loaded CI machine
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick and args.rep_ms == 50.0:
        args.rep_ms = 10.0
    for n in (args.impl or []):
        if n not in ALL_IMPLS:
            print("error: unknown impl %r (choose from %s)" % (n, ", ".join(ALL_IMPLS)),
                  file=sys.stderr)
            return 2

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    meta = dict(torch=torch.__version__, cuda=torch.version.cuda,
                driver=driver_version() if device.type == "cuda" else None, gpu=gpu,
                git_commit=git_commit(), date=datetime.datetime.now().astimezone().isoformat(),
                command="python " + " ".join(shlex.quote(x) for x in sys.argv),
                device=str(device), threads=torch.get_num_threads(), quick=args.quick, triton=_tt is not None,
                flash_attn_t=None if fat is None else getattr(fat, "__version__", "present"),
                flash_attn_t_error=FAT_ERROR, flash_attn_t_backends=fat_backends(),
                timing=("triton.testing.do_bench median (L2 flushed per call)"
                        if device.type == "cuda" and _tt is not None else
                        "CUDA events median, 256 MB L2 flush per call" if device.type == "cuda"
                        else "time.perf_counter median"),
                notes="fwd timed under no_grad; bwd = autograd.grad on a retained forward; "
                      "inputs >= 64 MB/tensor at 16k tokens x 2048 hidden bf16 (> L2) and L2 "
                      "flushed before each timed call; varlen SDPA runs on a padded batch "
                      "(key-padding mask when non-causal), FLOPs on real tokens.")
    outdir = os.path.join(args.out, slug(gpu) if gpu else "cpu")
    os.makedirs(outdir, exist_ok=True)

    print("flash_attn_t: %s" % ("available, backends=%s" % fat_backends() if fat is not None
                                else "UNAVAILABLE (%s) - benchmarking the others only" % FAT_ERROR))
    print("device=%s gpu=%s torch=%s cuda=%s triton=%s dtype=%s out=%s" %
          (device, gpu, torch.__version__, torch.version.cuda, _tt is not None, args.dtype, outdir))

    suites = ("fa3", "gqa", "varlen", "long") if args.suite == "all" else (args.suite,)
    t_start = time.time()
    for suite in suites:
        impls = args.impl or default_impls(suite, device)
        impls = [i for i in impls if i not in args.skip_impl]
        rows = []
        seen_notes = set()
        jpath = os.path.join(outdir, suite + ".json")
        points = suite_points(suite, args)
        print("\n#### suite %s: %d points, impls %s" % (suite, len(points), impls))
        meta.pop("incomplete", None)
        for n_done, p in enumerate(points):
            if args.time_limit is not None and time.time() - t_start > args.time_limit:
                meta["incomplete"] = ("time limit of %g s reached: %d of %d points measured" %
                                      (args.time_limit, n_done, len(points)))
                print("\n== %s" % meta["incomplete"])
                break
            ops = tuple(o for o in p["ops"] if not args.ops or o in args.ops)
            if not ops:
                continue
            need_grad = any(o != "fwd" for o in ops)
            try:
                d = make_data(p, device, dtype, need_grad, args.ref_max_seqlen)
            except Exception as e:
                if is_oom(e):
                    print("\n== %s S=%d: inputs do not fit (%s); stopping this suite" %
                          (suite, p["seqlen_q"], short(e, 120)))
                    free_mem(device)
                    break
                raise
            prows = []
            for name in impls:
                prows += measure(name, p, d, ops, device, args)
            del d
            free_mem(device)
            rows += prows
            print_point(suite, p, prows, ops, impls, seen_notes)
            with open(jpath, "w") as f:  # written after every point: partial runs keep results
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
            if suite == "long":
                ok = [r for r in prows if r["status"] == "ok"]
                oom = [r for r in prows if "OOM" in r["status"]]
                if not ok and oom:
                    print("  nothing fits at S=%d: stopping the long suite" % p["seqlen_q"])
                    break
        written = write_suite(suite, meta, rows, outdir,
                              not args.no_plot and (args.plot or not args.quick))
        print("\nwrote " + ", ".join(written))
    print("\ndone in %.1f s" % (time.time() - t_start))
    if fat is None:
        print("NOTE: flash_attn_t was not importable (%s); its rows are marked skipped." % FAT_ERROR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
