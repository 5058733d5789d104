"""benchmarks/bench.py: --merge (partial runs of one suite joined into one result) and
--time-limit (a suite cut short still writes its results, marked incomplete)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
bench = pytest.importorskip("bench")


def _row(impl, seqlen, tflops, causal=False, head_dim=64):
    return dict(impl=impl, op="fwd", batch=16384 // seqlen, seqlen_q=seqlen, seqlen_k=seqlen,
                heads_q=32, heads_kv=32, head_dim=head_dim, causal=causal, window=[-1, -1],
                dtype="bf16", tflops=tflops, ms=1.0, peak_bytes=1, rel_error=1e-3, status="ok")


def _write(path, command, rows, commit="abc"):
    meta = dict(gpu="NVIDIA H200", torch="t", cuda="c", driver="d", git_commit=commit,
                date="2026-12-02", command=command)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f)


def test_merge_replaces_orders_and_keeps_commands(tmp_path):
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    _write(a, "run a", [_row("fat-sm90a", 2048, 1.0, head_dim=128), _row("fat-sm90a", 512, 2.0),
                        _row("sdpa-cudnn", 512, 3.0)])
    _write(b, "run b", [_row("fat-sm90a", 512, 5.0), _row("fat-sm90a", 1024, 6.0, causal=True)])
    out = tmp_path / "out"
    assert bench.main(["--suite", "fa3", "--merge", a, b, "--out", str(out), "--no-plot"]) == 0
    with open(out / "nvidia-h200" / "fa3.json") as f:
        merged = json.load(f)
    got = [(r["impl"], r["head_dim"], r["causal"], r["seqlen_q"], r["tflops"])
           for r in merged["rows"]]
    assert got == [("fat-sm90a", 64, False, 512, 5.0),   # b's row replaced a's
                   ("sdpa-cudnn", 64, False, 512, 3.0),
                   ("fat-sm90a", 64, True, 1024, 6.0),
                   ("fat-sm90a", 128, False, 2048, 1.0)]  # the suite's order: D, mask, length
    assert merged["meta"]["commands"] == ["run a", "run b"]
    md = (out / "nvidia-h200" / "fa3.md").read_text()
    assert "`run a`" in md and "`run b`" in md and "1.67x" in md  # 5.0 / 3.0 at 512


def test_merge_of_a_merge_keeps_every_command_and_commit(tmp_path):
    a, b, c = (str(tmp_path / n) for n in ("a.json", "b.json", "c.json"))
    _write(a, "run a", [_row("fat-sm90a", 512, 1.0)], commit="aaaaaaa1")
    _write(b, "run b", [_row("fat-sm90a", 1024, 1.0)], commit="bbbbbbb2")
    _write(c, "run c", [_row("fat-sm90a", 2048, 1.0)], commit="ccccccc3")
    first, second = tmp_path / "first", tmp_path / "second"
    assert bench.main(["--suite", "fa3", "--merge", a, b, "--out", str(first), "--no-plot"]) == 0
    merged_ab = str(first / "nvidia-h200" / "fa3.json")
    assert bench.main(["--suite", "fa3", "--merge", merged_ab, c, "--out", str(second),
                       "--no-plot"]) == 0
    with open(second / "nvidia-h200" / "fa3.json") as f:
        meta = json.load(f)["meta"]
    assert meta["commands"] == ["run a", "run b", "run c"]
    assert meta["git_commits"] == ["aaaaaaa1", "bbbbbbb2", "ccccccc3"]
    md = (second / "nvidia-h200" / "fa3.md").read_text()
    assert "`run b` (commit bbbbbbb, 2026-12-02)" in md


def test_merge_suite_from_file_names_or_refused(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    a, b = str(tmp_path / "gqa.json"), str(tmp_path / "x" / "gqa.json")
    _write(a, "run a", [_row("fat-sm90a", 512, 1.0)])
    _write(b, "run b", [_row("fat-sm90a", 1024, 1.0)])
    out = tmp_path / "out"
    assert bench.main(["--merge", a, b, "--out", str(out), "--no-plot"]) == 0
    assert (out / "nvidia-h200" / "gqa.md").exists()
    c = str(tmp_path / "other.json")
    _write(c, "run c", [_row("fat-sm90a", 512, 1.0)])
    assert bench.main(["--merge", a, c, "--out", str(out), "--no-plot"]) == 2
    assert "--suite" in capsys.readouterr().err


def test_time_limit_writes_what_it_has(tmp_path):
    out = tmp_path / "out"
    args = ["--quick", "--device", "cpu", "--suite", "gqa", "--impl", "fat-cpu", "--ops", "fwd",
            "--no-plot", "--out", str(out)]
    assert bench.main(args + ["--time-limit", "0"]) == 0
    with open(out / "cpu" / "gqa.json") as f:
        cut = json.load(f)
    assert cut["rows"] == [] and "0 of" in cut["meta"]["incomplete"]
    assert "**Incomplete:**" in (out / "cpu" / "gqa.md").read_text()
    assert bench.main(args) == 0
    with open(out / "cpu" / "gqa.json") as f:
        full = json.load(f)
    assert full["rows"] and "incomplete" not in full["meta"]
