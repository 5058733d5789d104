"""Forward + backward at S = 32768 must not materialise the S x S scores.

Run in a fresh subprocess so ru_maxrss (peak resident set, KiB on Linux)
measures only this workload: the baseline is taken after torch is imported
and the inputs are allocated; the growth over the fwd+bwd must stay far below
the S*S*4 bytes (4 GiB) one fp32 score matrix would need: < S*S*4/16 (256 MiB).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

S = 32768

SCRIPT = textwrap.dedent(f"""
    import json, resource, time
    import torch
    import flash_attn_t
    S, D = {S}, 64
    torch.manual_seed(0)
    q = torch.randn(1, S, 1, D, requires_grad=True)
    k = torch.randn(1, S, 1, D, requires_grad=True)
    v = torch.randn(1, S, 1, D, requires_grad=True)
    dout = torch.randn(1, S, 1, D)
    # warm-up on a tiny problem so one-off allocations (thread pools, dispatcher
    # caches) are in the baseline rather than in the measured growth
    t = [torch.randn(1, 64, 1, D, requires_grad=True) for _ in range(3)]
    flash_attn_t.attention(*t).sum().backward()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.time()
    out = flash_attn_t.attention(q, k, v)
    out.backward(dout)
    dt = time.time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ok = bool(torch.isfinite(out).all() and torch.isfinite(q.grad).all()
              and torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all())
    print(json.dumps(dict(base=base, peak=peak, seconds=dt, finite=ok)))
""")


@pytest.mark.slow
def test_memory_s32768_fwd_bwd():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=1800, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    growth = res["peak"] - res["base"]
    limit = S * S * 4 // 16
    print(f"peak RSS growth {growth / 2**20:.1f} MiB (limit {limit / 2**20:.0f} MiB), "
          f"fwd+bwd {res['seconds']:.1f} s")
    assert res["finite"], "non-finite values in out or grads"
    assert growth < limit, f"peak RSS grew by {growth / 2**20:.1f} MiB >= {limit / 2**20:.0f} MiB"
