"""Splits the flash_attn_t segfault (ValueError through the autograd redispatch) into
its factors. Each case runs in a fresh `python3 -X faulthandler` process; rc -11 = SIGSEGV.

    python3 dev/segv_diag/diag.py            # from the repo root, after pip install -e .
Prints one line per case, then a native backtrace (cuda-gdb, or gdb) of the first crash.
"""
import os, re, shutil, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join("/tmp", "segv_diag_build")
PRE = ("import os, sys, torch; sys.path.insert(0, %r); "
       "from torch.utils.cpp_extension import load; "
       "load('segv_diag_ext', [%r], build_directory=%r, verbose=False); "
       % (HERE, os.path.join(HERE, "diag_ext.cpp"), BUILD))
AUTOGRAD = ("torch.library.register_autograd('segv_diag::{op}', lambda ctx, g: g); ")
CALL = ("r = {expr}\n")
Q3 = "torch.randn(8, 4, 16)"
K4 = "torch.randn(1, 8, 2, 16)"


def argv(code):
    return ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/test_errors.py"] \
        if code is None else ["-c", code]


def case(name, code, env=None):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, "-X", "faulthandler", *argv(code)], env=e,
                       capture_output=True, text=True, timeout=600)
    lines = [l for l in (p.stderr + p.stdout).splitlines()
             if re.search(r"Error|Fatal|passed|failed", l)] or [""]
    last = lines[-1][:110]
    print(f"{name:58s} rc={p.returncode:4d}  {last}", flush=True)
    return p.returncode


def probe(op, autograd, extra=""):
    reg = AUTOGRAD.format(op=op) if autograd else ""
    return (PRE + extra + reg +
            f"\ntry:\n    torch.ops.segv_diag.{op}({Q3})\nexcept Exception as e:\n"
            f"    print(type(e).__name__, e, file=sys.stderr)\n")


def fat(expr, extra=""):
    return ("import sys, torch, flash_attn_t; from flash_attn_t import _ops; " + extra +
            f"\ntry:\n    {expr}\nexcept Exception as e:\n"
            f"    print(type(e).__name__, e, file=sys.stderr)\n")


os.makedirs(BUILD, exist_ok=True)
subprocess.run([sys.executable, "-c", PRE], check=True)  # build once
print(sys.version.split()[0], "torch", __import__("torch").__version__, flush=True)
cases = []
for op in ("value_sizes", "value_plain", "type_sizes", "runtime_sizes", "notimpl_plain"):
    for ag in (True, False):
        cases.append((f"probe {op} {'autograd' if ag else 'direct'}", probe(op, ag), None))
cases.append(("probe value_sizes autograd, flash_attn_t imported",
              probe("value_sizes", True, "import flash_attn_t; "), None))
att = f"flash_attn_t.attention({Q3}, {K4}, {K4})"
direct = (f"_ops.fwd({Q3}, {K4}, {K4}, None, None, 0, 8, 0.25, False, -1, -1, 0.0, False)")
cases += [
    ("fat attention rank-3 q (the failing test)", fat(att), None),
    ("fat attention rank-3 q, CUDA hidden", fat(att), {"CUDA_VISIBLE_DEVICES": ""}),
    ("fat attention rank-3 q, OMP_NUM_THREADS=1", fat(att), {"OMP_NUM_THREADS": "1"}),
    ("fat attention rank-3 q, LD_BIND_NOW=1", fat(att), {"LD_BIND_NOW": "1"}),
    ("fat attention rank-3 q after a float64 run", fat(
        att, "x = torch.randn(1, 8, 4, 16, dtype=torch.float64); "
             "y = torch.randn(1, 8, 2, 16, dtype=torch.float64); flash_attn_t.attention(x, y, y); "),
     None),
    ("fat fwd op below autograd (no Python redispatch)", fat(
        direct, "g = torch._C._AutoDispatchBelowAutograd(); g.__enter__(); "), None),
    ("fat fwd op through autograd", fat(direct), None),
    ("pytest -x tests/test_errors.py", None, None),
]
crashed = None
for name, code, env in cases:
    if case(name, code, env) < 0 and crashed is None:
        crashed = (name, code, env)
if crashed:
    dbg = shutil.which("cuda-gdb") or shutil.which("gdb")
    print(f"\n== native backtrace of: {crashed[0]} ({dbg})", flush=True)
    if dbg:
        subprocess.run([dbg, "-q", "-batch", "-ex", "set pagination off", "-ex", "run",
                        "-ex", "bt 40", "-ex", "info registers rip rsp",
                        "-ex", "x/6i $pc", "--args", sys.executable, *argv(crashed[1])],
                       env=dict(os.environ, **(crashed[2] or {})), timeout=600)
