import os
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so tests can `import reference`


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (large sequence on the CPU)")


import flash_attn_t  # noqa: E402

# CUDA runs only where a CUDA kernel path was built, so a GPU machine with a
# CPU-only build tests the CPU path instead of failing on missing kernels.
CUDA_BUILT = any(b.startswith("sm") for b in flash_attn_t.built_backends())
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and CUDA_BUILT else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed(request):
    # fresh but reproducible random inputs per test
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    yield


def skip_if_unsupported(device, dtype):
    if dtype == torch.float64 and device != "cpu":
        pytest.skip("float64 is CPU only")


def default_dtype(device):
    """The dtype of tests that do not choose one: the CUDA kernels take 16-bit
    floats only (float32 on CUDA is refused with a TypeError, tested)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


@pytest.fixture(autouse=True)
def _cuda_takes_16_bit(request):
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if params.get("device") == "cuda" and params.get("dtype") in (torch.float32, torch.float64):
        pytest.skip("CUDA kernels take float16/bfloat16")
