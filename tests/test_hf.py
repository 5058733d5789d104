"""HuggingFace transformers integration (flash_attn_t/hf.py) against attn_implementation="eager".

Tiny random models built from configs (no downloads). Two settings:

* cpu-float32 (always): tight fixed bounds (relative error 1e-4, greedy tokens identical).
* cuda-bfloat16 (only with a CUDA build of flash_attn_t and a GPU, else not collected): the
  bounds come from the same inputs run through attn_implementation="sdpa". Eager attention in
  bf16 rounds the scores and probabilities to bf16; SDPA's fused kernels and ours keep them in
  fp32, so rel_err(sdpa, eager) measures how far a correct fused bf16 attention lands from
  eager on exactly these inputs. We allow LOWP_FACTOR (3) times that plus LOWP_FLOOR (2e-3, about
  bf16's unit roundoff 2^-9: two correct bf16 results differ by at least their output rounding).
  Gemma 2 (attention softcap, which sdpa cannot apply) uses its eager attention computed in fp32
  instead of sdpa (_eager_fp32_attention). Greedy generation in bf16 is checked by teacher
  forcing rather than token identity (see test_greedy_generate_identical).

FLASH_ATTN_T_TEST_CPU_BF16=1 adds a cpu-bfloat16 setting with the GPU's bounds (a way to check
the low-precision tolerance logic without a GPU; not run by CI).
"""
import contextlib
import copy
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flash_attn_t  # noqa: E402,F401
from conftest import CUDA_BUILT  # noqa: E402
from flash_attn_t import hf  # noqa: E402

NAME = "flash_attn_t"

SETTINGS = [("cpu", torch.float32)]
if CUDA_BUILT and torch.cuda.is_available():
    SETTINGS.append(("cuda", torch.bfloat16))
if os.environ.get("FLASH_ATTN_T_TEST_CPU_BF16", "") not in ("", "0"):
    SETTINGS.append(("cpu", torch.bfloat16))
SETTING_IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in SETTINGS]

FP32_BOUND = 1e-4
LOWP_FACTOR = 3.0
LOWP_FLOOR = 2e-3
EAGER_FP32 = "fat_test_eager_fp32"  # see _eager_fp32_attention (no "flash" in the name:
# transformers treats any name containing it as a flash-attention kernel to load)


@pytest.fixture(autouse=True, scope="module")
def _registered():
    assert hf.register_hf() is True
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionInterface.register(EAGER_FP32, _eager_fp32_attention)
    AttentionMaskInterface.register(EAGER_FP32, eager_mask)
    yield


# ----------------------------------------------------------------------------- models

def _llama_cfg():
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attention_dropout=0.0, pad_token_id=0)


def _mistral_cfg():
    return transformers.MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        sliding_window=7, attention_dropout=0.0, pad_token_id=0)


def _gemma2_cfg():
    # initializer_range 0.2 (default 0.02): attention scores of std ~2, so the softcap of 5
    # changes them visibly; at the default scale they are ~0.03, tanh is the identity there and
    # dropping the softcap passed every test
    return transformers.Gemma2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, sliding_window=6, attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=16, attention_dropout=0.0,
        initializer_range=0.2, pad_token_id=0)


def _bert_cfg():
    return transformers.BertConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0)


CAUSAL = {"llama": _llama_cfg, "mistral": _mistral_cfg, "gemma2": _gemma2_cfg}


def _pair(cfg_fn, device, dtype, cls=transformers.AutoModelForCausalLM, impl=NAME):
    """(eager model, flash_attn_t model) with identical weights."""
    torch.manual_seed(0)
    ref = cls.from_config(cfg_fn(), attn_implementation="eager", dtype=dtype)
    ours = cls.from_config(cfg_fn(), attn_implementation=impl, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    ref.to(device).eval()
    ours.to(device).eval()
    return ref, ours


def _rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _grad_errs(go, gr):
    """Per-parameter relative errors, normalised by max(||ref||, 1e-3 * largest ||ref||): some
    gradients are mathematically zero (e.g. a key bias under softmax) and only hold noise."""
    floor = 1e-3 * max(g.double().norm().item() for g in gr.values())
    return {n: ((go[n].double() - gr[n].double()).norm().item()
                / max(gr[n].double().norm().item(), floor)) for n in gr}


def _lowp(dtype):
    return dtype != torch.float32


def _bound(dtype, sdpa_err=None):
    """fp32: FP32_BOUND. bf16: LOWP_FACTOR * rel_err(sdpa, eager) + LOWP_FLOOR (module doc)."""
    if not _lowp(dtype):
        return FP32_BOUND
    assert sdpa_err is not None, "a low-precision bound needs the sdpa-vs-eager error"
    return LOWP_FACTOR * sdpa_err + LOWP_FLOOR


def _eager_fp32_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention computed in fp32 from the low-precision inputs, the output
    rounded once: exact attention, which a fused kernel approximates. The low-precision yardstick
    for models with an attention softcap (Gemma 2), which sdpa cannot apply."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    mask = None if attention_mask is None else attention_mask.float()
    out, _ = eager(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), None


def _sdpa_twin(ref):
    """ref's weights and mode with attn_implementation="sdpa", or EAGER_FP32 for models with an
    attention softcap, which sdpa cannot apply: transformers 5.24 refuses sdpa for Gemma 2, while
    e.g. 5.17 accepts it and silently drops the softcap."""
    twin = copy.deepcopy(ref)
    softcap = getattr(ref.config, "attn_logit_softcapping", None)
    twin.set_attn_implementation("sdpa" if ref._supports_sdpa and not softcap else EAGER_FP32)
    return twin


def _bound_vs_eager(ref, dtype, fn):
    """Bound for rel_err(fn(ours), fn(ref)), fn(model) -> tensor on this test's inputs."""
    if not _lowp(dtype):
        return FP32_BOUND
    with torch.no_grad():
        return _bound(dtype, _rel_err(fn(_sdpa_twin(ref)), fn(ref)))


def _check_grads(ref, ours, dtype, grads_fn, fp32_loss_bound=1e-5):
    """grads_fn(model) -> (loss or None, {name: grad}); ours against eager, per parameter."""
    lr, gr = grads_fn(ref)
    lo, go = grads_fn(ours)
    if _lowp(dtype):
        ls, gs = grads_fn(_sdpa_twin(ref))
        bounds = {n: _bound(dtype, e) for n, e in _grad_errs(gs, gr).items()}
        lbound = None if lr is None else _bound(dtype, _rel_err(ls, lr))
    else:
        bounds = {n: FP32_BOUND for n in gr}
        lbound = fp32_loss_bound
    if lr is not None:
        assert _rel_err(lo, lr) < lbound, (_rel_err(lo, lr), lbound)
    assert gr.keys() == go.keys()
    bad = {n: (e, bounds[n]) for n, e in _grad_errs(go, gr).items() if e >= bounds[n]}
    assert not bad, bad


def _assert_mask_matters(no_mask, ref, keep, bound, dtype):
    """The run that ignored the padding mask must fail the bound, over the real tokens (keep):
    fp32: by 10x over the whole batch. bf16: in these tiny random models the mask's effect is only
    a few times the bf16 noise and sits in the padded rows, so there the worst row must be outside
    the bound (the check that catches a dropped mask is then the per-row version of ours)."""
    if not _lowp(dtype):
        assert _rel_err(no_mask[keep], ref[keep]) > 10 * bound
        return
    worst = max(_rel_err(no_mask[b][keep[b]], ref[b][keep[b]]) for b in range(keep.shape[0]))
    assert worst > bound, (worst, bound)


def _ids(batch, seq, device, low=3):
    return torch.randint(low, 128, (batch, seq), device=device)


def _padding_mask(lengths, seq, side, device):
    m = torch.zeros(len(lengths), seq, dtype=torch.long, device=device)
    for b, n in enumerate(lengths):
        if side == "right":
            m[b, :n] = 1
        else:
            m[b, seq - n:] = 1
    return m


# ----------------------------------------------------------------------------- registration

def test_register_idempotent_and_visible():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    assert hf.register_hf() is True and hf.register_hf() is True
    assert NAME in AttentionInterface._global_mapping
    assert AttentionInterface._global_mapping[NAME] is hf.flash_attn_t_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[NAME] is flash_attention_mask


def test_register_without_transformers(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("no transformers")
        return real_import(name, *a, **k)

    monkeypatch.setattr(hf, "_registered", False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert hf.register_hf() is False
    monkeypatch.undo()
    assert hf.register_hf() is True


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
def test_from_config_and_set_attn_implementation(device, dtype):
    ref, ours = _pair(_llama_cfg, device, dtype)
    assert ours.config._attn_implementation == NAME
    other = copy.deepcopy(ref)
    other.set_attn_implementation(NAME)
    assert other.config._attn_implementation == NAME
    ids = _ids(2, 20, device)
    with torch.no_grad():
        r = ref(ids).logits
        a = ours(ids).logits
        b = other(ids).logits
    bound = _bound_vs_eager(ref, dtype, lambda m: m(ids).logits)
    assert _rel_err(a, r) < bound
    assert _rel_err(b, r) < bound


# ----------------------------------------------------------------------------- logits

@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_causal_lm_padding(family, side, device, dtype):
    ref, ours = _pair(CAUSAL[family], device, dtype)
    seq = 20  # > sliding windows (7, 6)
    ids = _ids(3, seq, device)
    mask = _padding_mask([20, 13, 5], seq, side, device)
    ids = ids.masked_fill(mask == 0, 0)
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask).logits
        a = ours(ids, attention_mask=mask).logits[keep]
        no_mask = ours(ids).logits
    assert torch.isfinite(a).all()
    bound = _bound_vs_eager(ref, dtype, lambda m: m(ids, attention_mask=mask).logits[keep])
    assert _rel_err(a, r[keep]) < bound
    if side == "left":  # causal + right padding: real tokens never see the pads anyway
        # the 2D mask really reaches the attention: ignoring it changes the results
        _assert_mask_matters(no_mask, r, keep, bound, dtype)


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
def test_sliding_window_is_active(device, dtype):
    """Mistral with window 7 < seq 20: must match eager, and differ from a full-attention run."""
    ref, ours = _pair(_mistral_cfg, device, dtype)
    ids = _ids(2, 20, device)
    with torch.no_grad():
        r = ref(ids).logits
        a = ours(ids).logits
        ours.config.sliding_window = None
        for layer in ours.model.layers:
            layer.self_attn.config.sliding_window = None
        full = ours(ids).logits
    bound = _bound_vs_eager(ref, dtype, lambda m: m(ids).logits)
    assert _rel_err(a, r) < bound
    assert _rel_err(full, r) > 10 * bound


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_bert_encoder_padding(side, device, dtype):
    ref, ours = _pair(_bert_cfg, device, dtype, cls=transformers.AutoModel)
    seq = 16
    ids = _ids(3, seq, device)
    mask = _padding_mask([16, 9, 4], seq, side, device)
    keep = mask.bool()
    with torch.no_grad():
        r = ref(ids, attention_mask=mask).last_hidden_state
        a = ours(ids, attention_mask=mask).last_hidden_state[keep]
        no_mask = ours(ids).last_hidden_state
    bound = _bound_vs_eager(ref, dtype,
                            lambda m: m(ids, attention_mask=mask).last_hidden_state[keep])
    assert _rel_err(a, r[keep]) < bound
    _assert_mask_matters(no_mask, r, keep, bound, dtype)


# ----------------------------------------------------------------------------- packing

def _packed_inputs(lengths, device):
    ids = [_ids(1, n, device) for n in lengths]
    packed = torch.cat(ids, dim=1)
    pos = torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=device)
    return ids, packed, pos, cu


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("how", ["position_ids", "cu_seq_lens", "max_seqlen_names"])
@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_packed_sequences(family, how, device, dtype):
    ref, ours = _pair(CAUSAL[family], device, dtype)
    lengths = [9, 14, 5]
    ids, packed, pos, cu = _packed_inputs(lengths, device)
    kw = {}
    if how == "cu_seq_lens":
        kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths),
                  max_length_k=max(lengths))
    elif how == "max_seqlen_names":
        kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_seqlen_q=max(lengths),
                  max_seqlen_k=max(lengths))
    with torch.no_grad():
        separate = torch.cat([ref(x).logits for x in ids], dim=1)
        a = ours(packed, position_ids=pos, **kw).logits
        unpacked_attention = ours(packed).logits  # one long sequence: must differ
    # the reference runs each sequence alone; so does sdpa for the low-precision bound
    bound = _bound_vs_eager(ref, dtype, lambda m: torch.cat([m(x).logits for x in ids], dim=1))
    assert _rel_err(a, separate) < bound
    assert _rel_err(unpacked_attention, separate) > 10 * bound


# ----------------------------------------------------------------------------- generation

@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_greedy_generate_identical(family, padded, device, dtype):
    ref, ours = _pair(CAUSAL[family], device, dtype)
    seq, new = 10, 8  # 10 + 8 new tokens > sliding windows: exercises sliding-window decoding
    ids = _ids(2, seq, device)
    mask = _padding_mask([10, 6] if padded else [10, 10], seq, "left", device)
    ids = ids.masked_fill(mask == 0, 0)
    gen = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(1)
    r = ref.generate(ids, attention_mask=mask, **gen)
    a = ours.generate(ids, attention_mask=mask, **gen)
    assert r.shape == a.shape == (2, seq + new)
    assert torch.equal(a[:, :seq], ids)
    if not _lowp(dtype):
        assert torch.equal(a, r), (a, r)
        return
    # bf16: greedy tokens may legitimately differ from eager's. Two correct bf16 attentions give
    # logits that differ by about the bf16 noise, so where eager's top two logits are closer than
    # that (tiny random models have many near-ties), argmax may flip, and every later token then
    # continues a different prefix. So instead of token identity, check every token that ours
    # chose on its own prefix (teacher forcing): eager, run on ours' sequence, must rank it within
    # `tol` of its best logit, tol = LOWP_FACTOR * the largest |sdpa - eager| logit difference on
    # the same sequence + LOWP_FLOOR relative to the logit scale. A token chosen by a wrong decode
    # (wrong cache, window or mask) is typically a full logit spread below eager's best and fails.
    full_mask = torch.cat([mask, torch.ones(2, new, dtype=mask.dtype, device=device)], dim=1)

    def next_token_logits(m):  # logits that predicted a[:, seq:], each on a's own prefix
        return m(a, attention_mask=full_mask).logits[:, seq - 1:-1].float()

    with torch.no_grad():
        le = next_token_logits(ref)
        ls = next_token_logits(_sdpa_twin(ref))
    tol = LOWP_FACTOR * (ls - le).abs().amax().item() + LOWP_FLOOR * le.abs().amax().item()
    gap = le.amax(-1) - le.gather(-1, a[:, seq:, None]).squeeze(-1)  # 0: eager's argmax
    same = int((a == r).all(-1).sum())
    # the check can fail: tol is well below the spread of eager's logits over the vocabulary
    assert tol < 0.5 * le.std(-1).min().item(), (tol, le.std(-1).min().item())
    assert (gap <= tol).all(), (f"tokens eager ranks more than tol={tol:.3g} below its best: "
                                f"gaps {gap.tolist()}; {same}/2 rows identical to eager", a, r)


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
def test_kv_cache_decode_logits(device, dtype):
    """Prefill then single-token steps with a DynamicCache (q len 1 vs longer keys)."""
    ref, ours = _pair(_llama_cfg, device, dtype)
    ids = _ids(2, 12, device)
    nxt = _ids(2, 3, device)

    def decode(m):
        with torch.no_grad():
            o = m(ids, use_cache=True)
            pkv, logits = o.past_key_values, []
            for t in range(3):
                o = m(nxt[:, t:t + 1], past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                logits.append(o.logits)
        return torch.cat(logits, 1)

    assert _rel_err(decode(ours), decode(ref)) < _bound_vs_eager(ref, dtype, decode)


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_training_gradients(family, device, dtype):
    ref, ours = _pair(CAUSAL[family], device, dtype)
    seq = 20
    ids = _ids(3, seq, device)
    mask = _padding_mask([20, 15, 8], seq, "right", device)
    labels = ids.masked_fill(mask == 0, -100)

    def grads(m):
        m.train()
        m.zero_grad(set_to_none=True)
        loss = m(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()
                               if p.grad is not None}

    _check_grads(ref, ours, dtype, grads)


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
def test_bert_training_gradients(device, dtype):
    ref, ours = _pair(_bert_cfg, device, dtype, cls=transformers.AutoModel)
    ids = _ids(2, 12, device)
    mask = _padding_mask([12, 7], 12, "right", device)
    # a LayerNorm output's mean square is ~constant
    w = torch.randn(19, 64, device=device, dtype=dtype)

    def grads(m):
        m.train()
        m.zero_grad(set_to_none=True)
        out = m(ids, attention_mask=mask).last_hidden_state
        (out[mask.bool()] * w).sum().backward()
        return None, {n: p.grad.detach().clone() for n, p in m.named_parameters()
                      if p.grad is not None}

    _check_grads(ref, ours, dtype, grads)


# ----------------------------------------------------------------------------- errors

class _Mod(torch.nn.Module):
    def __init__(self, **attrs):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.is_causal = True
        for k, v in attrs.items():
            setattr(self, k, v)


def _qkv(b=1, hq=4, hkv=2, sq=5, sk=5, d=16):
    return torch.randn(b, hq, sq, d), torch.randn(b, hkv, sk, d), torch.randn(b, hkv, sk, d)


def test_dropout_in_training_raises():
    cfg = _llama_cfg()
    cfg.attention_dropout = 0.1
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=NAME)
    m.train()
    with pytest.raises(NotImplementedError, match="dropout"):
        m(_ids(1, 8, "cpu"))
    m.eval()  # eval: the model passes dropout=0.0
    m(_ids(1, 8, "cpu"))


def test_sinks_and_output_attentions_raise():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="sink"):
        hf.flash_attn_t_attention_forward(_Mod(sinks=torch.nn.Parameter(torch.zeros(4))),
                                          q, k, v, None)
    with pytest.raises(NotImplementedError, match="sink"):
        hf.flash_attn_t_attention_forward(_Mod(), q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="output_attentions"):
        hf.flash_attn_t_attention_forward(_Mod(), q, k, v, None, output_attentions=True)


def test_4d_mask_rejected():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="2D"):
        hf.flash_attn_t_attention_forward(_Mod(), q, k, v, torch.zeros(1, 1, 5, 5))


# ----------------------------------------------------------------------------- direct function

def _eager(q, k, v, causal, window=None, softcap=None, scale=None, pad=None):
    """Straightforward (B, H, S, D) reference in float64, transformers' conventions."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1).double()
    v = v.repeat_interleave(g, 1).double()
    q = q.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sq).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk).unsqueeze(0)
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= (j > i - window) if causal else ((j - i).abs() < window)
    vis = vis.expand(q.shape[0], 1, sq, sk)
    if pad is not None:
        vis = vis & pad.bool()[:, None, None, :]
    s = s.masked_fill(~vis, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_direct_against_reference(causal, window, softcap):
    q, k, v = _qkv(b=2, sq=9, sk=9)
    out, w = hf.flash_attn_t_attention_forward(_Mod(), q, k, v, None, scaling=0.3,
                                               sliding_window=window, softcap=softcap,
                                               is_causal=causal)
    assert w is None and out.shape == (2, 9, 4, 16)
    ref = _eager(q, k, v, causal, window, softcap, 0.3)
    assert _rel_err(out, ref) < 1e-5


def test_direct_decode_with_padding_and_gqa():
    """q len 1 against 7 keys, left padding: bottom-right causal + per-row key lengths."""
    q, k, v = _qkv(b=3, hq=4, hkv=1, sq=1, sk=7)
    pad = _padding_mask([7, 4, 1], 7, "left", "cpu")
    out, _ = hf.flash_attn_t_attention_forward(_Mod(), q, k, v, pad.bool())
    ref = _eager(q, k, v, True, pad=pad)
    assert _rel_err(out, ref) < 1e-5


def test_direct_chunked_prefill_with_left_padding():
    """q len 3 against 8 keys (cache + new), left padding."""
    q, k, v = _qkv(b=2, sq=3, sk=8)
    pad = _padding_mask([8, 5], 8, "left", "cpu")
    out, _ = hf.flash_attn_t_attention_forward(_Mod(), q, k, v, pad.bool(), sliding_window=4)
    ref = _eager(q, k, v, True, window=4, pad=pad)
    assert _rel_err(out, ref) < 1e-5


def test_direct_no_repeat_kv_and_noncontiguous():
    q, k, v = _qkv(b=2, hq=6, hkv=2, sq=5, sk=5)
    out, _ = hf.flash_attn_t_attention_forward(_Mod(is_causal=False), q, k, v, None)
    assert _rel_err(out, _eager(q, k, v, False)) < 1e-5


# ----------------------------------------------------------------------------- torch.compile

@pytest.fixture
def _fresh_dynamo():
    import torch._dynamo
    torch._dynamo.reset()
    old = torch._dynamo.config.error_on_recompile
    yield
    torch._dynamo.config.error_on_recompile = old
    torch._dynamo.reset()


def _inductor_eager_rounding():
    """inductor keeps fused bf16 intermediates in fp32 unless told to round them as eager does;
    with the rounding, compiled-vs-eager differences are of the kind the sdpa bound measures."""
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "emulate_precision_casts"):
        return inductor_config.patch(emulate_precision_casts=True)
    return contextlib.nullcontext()


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_torch_compile_fullgraph_no_recompile(family, device, dtype, _fresh_dynamo):
    """Whole-model forward + backward under torch.compile(fullgraph=True, dynamic=True): no
    graph break, no recompile when only the sequence length changes. CPU: aot_eager (fast);
    CUDA: inductor (see _inductor_eager_rounding)."""
    import torch._dynamo
    ref, ours = _pair(CAUSAL[family], device, dtype)
    ours.train()
    ref.train()
    sdpa = _sdpa_twin(ref) if _lowp(dtype) else None

    def step(model, ids):
        out = model(ids, labels=ids)
        return out.loss, out.logits

    def grads(model):
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def eager_step(model, ids):
        model.zero_grad(set_to_none=True)
        loss, logits = step(model, ids)
        loss.backward()
        return logits.detach(), grads(model)

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    with _inductor_eager_rounding() if backend == "inductor" else contextlib.nullcontext():
        for i, seq in enumerate((16, 24, 11)):
            if i == 1:
                torch._dynamo.config.error_on_recompile = True
            ids = _ids(2, seq, device)
            ours.zero_grad(set_to_none=True)
            loss, logits = compiled(ours, ids)
            loss.backward()
            g_ours = grads(ours)
            rlogits, g_ref = eager_step(ref, ids)
            if sdpa is None:
                bound, gbounds = FP32_BOUND, {n: FP32_BOUND for n in g_ref}
            else:
                slogits, g_sdpa = eager_step(sdpa, ids)
                bound = _bound(dtype, _rel_err(slogits, rlogits))
                gbounds = {n: _bound(dtype, e) for n, e in _grad_errs(g_sdpa, g_ref).items()}
            assert _rel_err(logits, rlogits) < bound
            assert g_ours.keys() == g_ref.keys()
            bad = {n: (e, gbounds[n]) for n, e in _grad_errs(g_ours, g_ref).items()
                   if e >= gbounds[n]}
            assert not bad, bad


@pytest.mark.parametrize("device,dtype", SETTINGS, ids=SETTING_IDS)
def test_torch_compile_inductor_forward(device, dtype, _fresh_dynamo):
    ref, ours = _pair(_llama_cfg, device, dtype)
    compiled = torch.compile(ours, fullgraph=True)
    ids = _ids(2, 16, device)
    with torch.no_grad(), _inductor_eager_rounding() if _lowp(dtype) else contextlib.nullcontext():
        out = compiled(ids).logits
        assert _rel_err(out, ref(ids).logits) < _bound_vs_eager(ref, dtype,
                                                                lambda m: m(ids).logits)
