"""CUDA-only checks beyond the device-parametrised suite: long and odd sequence
lengths, every compiled head dim, very uneven varlen batches, which kernel
family ran, and what the CUDA path refuses.  Skipped without a CUDA build and
a GPU.  FLASH_ATTN_T_BACKEND=sm80 forces the mma.sync kernels (the suite
is run that way too, see README "Tests on a GPU")."""
import os

import pytest
import torch

import flash_attn_t
from conftest import CUDA_BUILT
from test_forward_backward import check_case, make, make_varlen

pytestmark = pytest.mark.skipif(not (CUDA_BUILT and torch.cuda.is_available()),
                                reason="needs a CUDA build and a GPU")
LOWP = [torch.float16, torch.bfloat16]
FORCED = os.environ.get("FLASH_ATTN_T_BACKEND", "auto")


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(4097, 4097), (1, 4097), (4097, 1), (1025, 4097), (4097, 97)])
def test_long_odd_seqlens(dtype, causal, Sq, Sk):
    check_case(*make(1, Sq, Sk, 2, 1, 64, dtype=dtype, device="cuda"), causal=causal)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [32, 64, 96, 128, 192, 256, 59, 111, 200, 8])
def test_every_head_dim(dtype, causal, D):
    check_case(*make(2, 157, 211, 4, 2, D, dtype=dtype, device="cuda"), causal=causal)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_every_feature_together(dtype, causal):
    q, k, v, dout = make(2, 333, 517, 8, 2, 128, dtype=dtype, device="cuda")
    check_case(q, k, v, dout, causal=causal, window_size=(77, 13), softcap=7.0,
               softmax_scale=0.07)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_very_uneven(dtype, causal):
    lens_q = [1, 2049, 0, 3, 700, 129]
    lens_k = [1500, 2049, 5, 0, 1, 130]
    check_case(*make_varlen(lens_q, lens_k, 4, 2, 64, dtype=dtype, device="cuda"), causal=causal)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_row_maxima_rising_along_the_keys(dtype, causal, D):
    # keys scaled up 1x to 4x along the sequence: each row's max grows by
    # about 2^45 from the first key block to the last, so kernels that
    # rescale O only when a max moved by more than 2^8 (the sm80 and sm90a
    # forwards) rebase several times; with fp16, a kernel that never
    # rebased would overflow p
    q, k, v, dout = make(1, 900, 1000, 2, 1, D, dtype=dtype, device="cuda")
    ramp = torch.linspace(1.0, 4.0, k.shape[1], device="cuda").view(1, -1, 1, 1)
    k = (k.float() * ramp).to(dtype)
    check_case(q, k, v, dout, causal=causal, softmax_scale=4.0 / D ** 0.5)


def test_many_heads_and_batches():
    # grid decoding of (query block, head, sequence) over many CTAs
    check_case(*make(9, 130, 70, 24, 3, 64, dtype=torch.bfloat16, device="cuda"), causal=True)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_deterministic_long(dtype):
    q, k, v, dout = make(1, 2048, 2048, 8, 2, 128, dtype=dtype, device="cuda")
    from test_forward_backward import _ours
    runs = [_ours(q, k, v, dout, causal=False, deterministic=True) for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


def test_reports_the_kernel_that_ran():
    q, k, v, _ = make(1, 256, 256, 2, 2, 128, dtype=torch.bfloat16, device="cuda")
    flash_attn_t.attention(q, k, v)
    ran = flash_attn_t.last_cuda_backend()
    if FORCED != "auto":
        assert ran == FORCED
    elif (torch.cuda.get_device_capability() == (9, 0)
          and "sm90a" in flash_attn_t.built_backends()):
        assert ran == "sm90a"
    else:
        assert ran == "sm80"


def test_float32_is_refused_naming_q():
    q, k, v, _ = make(1, 16, 16, 1, 1, 32, dtype=torch.float32, device="cuda")
    with pytest.raises(TypeError, match="q"):
        flash_attn_t.attention(q, k, v)


def test_runs_on_the_current_stream():
    q, k, v, dout = make(2, 300, 300, 4, 2, 64, dtype=torch.float16, device="cuda")
    expected = flash_attn_t.attention(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flash_attn_t.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out, expected)
