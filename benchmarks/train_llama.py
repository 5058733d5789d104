#!/usr/bin/env python
"""End-to-end training step of a ~134M-parameter Llama (forward + backward + AdamW step) with
attn_implementation = flash_attn_t / sdpa / eager: tokens/s and peak memory.

    python benchmarks/train_llama.py [--device cuda|cpu] [--seqlens 2048 8192] [--tokens 16384]
                                     [--impls flash_attn_t sdpa eager] [--warmup 3] [--steps 10]
                                     [--precision bf16|autocast] [--kv-heads 12] [--out DIR]
                                     [--watchdog SECONDS]
    python benchmarks/train_llama.py --quick --device cpu --out /tmp/tl    # smoke test (seconds)

Model (built from a LlamaConfig, randomly initialised, nothing downloaded): vocab 32000,
hidden 768, 12 layers, 12 attention heads of dim 64 (--kv-heads < 12 for GQA), SwiGLU MLP 2048,
untied embeddings, RoPE: 134.1M parameters. Every configuration starts from the same weights.

Precision (--precision): bf16 (default): parameters, activations, gradients and AdamW states in
bfloat16 (torch.optim.AdamW, fused on CUDA); every attention implementation gets bf16 q/k/v.
autocast: fp32 parameters and optimizer, forward under torch.autocast(bfloat16).

A step is zero_grad + forward with labels (the model's cross-entropy loss) + backward + AdamW
step, on one fixed batch of random tokens; batch = tokens // seqlen, so every seqlen processes the
same number of tokens per step. Timing: CUDA synchronize around each step, time.perf_counter,
median over --steps steps after --warmup steps. Peak memory: torch.cuda.max_memory_allocated
over the whole configuration (model, optimizer states, activations), the peak statistics reset
after the previous configuration was freed. A configuration that runs out of memory is recorded
as "OOM"; one that fails otherwise as "error: ...", and the run goes on.

Writes <out>/<gpu-name-slug or cpu>/train_llama.{json,md} (default out: benchmarks/results) and
prints the table; the JSON is rewritten after every configuration.
"""
import argparse
import datetime
import faulthandler
import json
import math
import os
import shlex
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import bench  # noqa: E402  (benchmarks/bench.py: environment metadata and helpers)

IMPLS = ("flash_attn_t", "sdpa", "eager")

FULL = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12)
QUICK = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda when available, else cpu")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: tiny model, seqlen 64, 128 tokens/step, 1 warm-up + 2 steps")
    ap.add_argument("--seqlens", type=int, nargs="+", default=None, help="default 2048 8192")
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens per step = batch * seqlen (default 16384)")
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10)")
    ap.add_argument("--precision", choices=("bf16", "autocast"), default="bf16")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="key/value heads (default: = attention heads, i.e. no GQA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--watchdog", type=float, default=0.0,
                    help="print every thread's Python stack each this many seconds that one "
                         "configuration runs (0: off)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    q = a.quick
    a.seqlens = a.seqlens or ([64] if q else [2048, 8192])
    a.tokens = a.tokens or (128 if q else 16384)
    a.warmup = (1 if q else 3) if a.warmup is None else a.warmup
    a.steps = (2 if q else 10) if a.steps is None else a.steps
    return a


def model_config(args, seqlen_max):
    import transformers
    shape = dict(QUICK if args.quick else FULL)
    heads = shape["num_attention_heads"]
    kv = args.kv_heads or heads
    if heads % kv:
        raise SystemExit("--kv-heads must divide %d" % heads)
    return transformers.LlamaConfig(
        **shape, num_key_value_heads=kv, max_position_embeddings=max(seqlen_max, 2048),
        tie_word_embeddings=False, attention_dropout=0.0, use_cache=False)


def count_params(cfg):
    """(total, non-embedding) parameter counts of LlamaForCausalLM(cfg), built on the meta device
    (no memory, no initialisation)."""
    import transformers
    with torch.device("meta"):
        m = transformers.LlamaForCausalLM(cfg)
    total = sum(p.numel() for p in m.parameters())
    return total, total - 2 * cfg.vocab_size * cfg.hidden_size  # untied embedding and lm_head


def train_flops_per_step(cfg, batch, seqlen):
    """6 * (non-embedding params + lm_head) per token (matmuls, fwd + bwd) + causal attention:
    QK^T and PV, 2 * 2 * seqlen * d FLOPs per token and layer forward, halved for causality, x3
    for fwd + bwd: 6 * L * d * seqlen per token."""
    _, body = count_params(cfg)
    dense = 6 * (body + cfg.vocab_size * cfg.hidden_size)
    attn = 6 * cfg.num_hidden_layers * cfg.hidden_size * seqlen
    return (dense + attn) * batch * seqlen


def run_config(args, cfg, impl, seqlen, device):
    """One (impl, seqlen) configuration: build, warm up, time. Returns the measured fields."""
    import transformers
    batch = max(1, args.tokens // seqlen)
    torch.manual_seed(args.seed)  # the same weights and batch for every configuration
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl,
                                                          dtype=dtype)
    model.to(device).train()
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seqlen), generator=gen).to(device)
    cast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "autocast"
            else None)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        opt.zero_grad(set_to_none=True)
        if cast is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with cast:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.detach()

    times, losses = [], []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if i >= args.warmup:
            times.append(dt)
        if not math.isfinite(losses[-1]):
            raise RuntimeError("non-finite loss %r at step %d" % (losses[-1], i))
    med = statistics.median(times)
    res = dict(batch=batch, step_ms=med * 1e3, step_ms_min=min(times) * 1e3,
               tokens_per_s=batch * seqlen / med,
               model_tflops=train_flops_per_step(cfg, batch, seqlen) / med / 1e12,
               loss_first=losses[0], loss_last=losses[-1])
    if device.type == "cuda":
        res["static_bytes"] = torch.cuda.memory_allocated(device)  # params + optimizer states
        res["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return res


def gib(b):
    return "-" if b is None else "%.2f" % (b / 2**30)


def _ok(rows, impl, seqlen):
    return next((r for r in rows if r["impl"] == impl and r["seqlen"] == seqlen
                 and r["status"] == "ok"), None)


def ratio(a, b, key):
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


def table_lines(rows, seqlens, impls):
    """Markdown table: one row per (seqlen, impl), with the flash_attn_t ratios per seqlen."""
    lines = ["| seqlen | batch | impl | tokens/s | step ms | model TFLOPS | peak GiB | status |",
             "|---|---|---|---|---|---|---|---|"]
    for s in seqlens:
        for impl in impls:
            r = next((x for x in rows if x["impl"] == impl and x["seqlen"] == s), None)
            if r is None:
                continue
            ok = r["status"] == "ok"
            lines.append("| %d | %d | %s | %s | %s | %s | %s | %s |" % (
                s, r["batch"], impl, "%.0f" % r["tokens_per_s"] if ok else "-",
                "%.1f" % r["step_ms"] if ok else "-", "%.3g" % r["model_tflops"] if ok else "-",
                gib(r.get("peak_bytes")) if ok else "-", r["status"]))
    lines += ["", "| seqlen | flash_attn_t/sdpa tokens/s | flash_attn_t/eager tokens/s | "
              "flash_attn_t/sdpa peak memory | flash_attn_t/eager peak memory |",
              "|---|---|---|---|---|"]
    for s in seqlens:
        f = _ok(rows, "flash_attn_t", s)
        cells = []
        for key in ("tokens_per_s", "peak_bytes"):
            for other in ("sdpa", "eager"):
                o = next((x for x in rows if x["impl"] == other and x["seqlen"] == s), None)
                x = ratio(f, _ok(rows, other, s), key)
                if x is not None:
                    cells.append("%.2fx" % x)
                elif f is not None and o is not None and o["status"] == "OOM":
                    cells.append("%s OOM" % other)
                else:
                    cells.append("-")
        lines.append("| %d | %s |" % (s, " | ".join(cells)))
    return lines


def write_md(path, meta, rows, seqlens, impls):
    m = meta
    lines = ["# Llama training step: flash_attn_t vs sdpa vs eager", "",
             "gpu: %s | torch %s | cuda %s | driver %s | transformers %s | commit %s | %s" %
             (m["gpu"] or m["device"], m["torch"], m["cuda"], m["driver"], m["transformers"],
              m["git_commit"], m["date"]), "", "`%s`" % m["command"], "",
             "Model: %s (%.1fM parameters), %s. Step: zero_grad + forward + backward + AdamW, "
             "%d tokens per step (batch x seqlen); median of %d steps after %d warm-up steps. "
             "Peak: torch.cuda.max_memory_allocated over the configuration (model, optimizer "
             "states and activations). model TFLOPS: %s." %
             (m["model"], m["params"] / 1e6, m["precision"], m["tokens_per_step"], m["steps"],
              m["warmup"], m["flops_formula"]), "",
             "Ratios: tokens/s ratio > 1 means flash_attn_t is faster; peak-memory ratio < 1 "
             "means flash_attn_t needs less.", ""]
    lines += table_lines(rows, seqlens, impls)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    try:
        import transformers
    except ImportError as e:
        print("error: transformers is needed (%s)" % e, file=sys.stderr)
        return 2
    device = (torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda"
              else torch.device("cpu"))
    cfg = model_config(args, max(args.seqlens))
    params, _ = count_params(cfg)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    outdir = os.path.join(args.out, bench.slug(gpu) if gpu else "cpu")
    os.makedirs(outdir, exist_ok=True)
    jpath, mpath = os.path.join(outdir, "train_llama.json"), os.path.join(outdir, "train_llama.md")
    meta = dict(
        torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
        driver=bench.driver_version() if device.type == "cuda" else None, gpu=gpu,
        device=str(device), git_commit=bench.git_commit(),
        date=datetime.datetime.now().astimezone().isoformat(),
        command="python " + " ".join(shlex.quote(x) for x in sys.argv),
        flash_attn_t=None if bench.fat is None else getattr(bench.fat, "__version__", "present"),
        flash_attn_t_error=bench.FAT_ERROR, flash_attn_t_backends=bench.fat_backends(),
        quick=args.quick, threads=torch.get_num_threads(),
        model="LlamaForCausalLM vocab %d, hidden %d, %d layers, %d heads (head dim %d), "
              "%d kv heads, MLP %d, untied embeddings" % (
                  cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers,
                  cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads,
                  cfg.num_key_value_heads, cfg.intermediate_size, ),
        params=params,
        precision=("bf16 parameters, activations, gradients and AdamW states"
                   if args.precision == "bf16" else
                   "fp32 parameters and AdamW, forward under torch.autocast(bfloat16)"),
        optimizer="torch.optim.AdamW(lr=1e-4, weight_decay=0.1%s)" % (
            ", fused=True" if device.type == "cuda" else ""),
        tokens_per_step=args.tokens, warmup=args.warmup, steps=args.steps,
        flops_formula="(6 * (non-embedding params + lm_head) + 6 * layers * hidden * seqlen) "
                      "* tokens / step time (causal attention counted once, half of 12 L d S)",
        timing="torch.cuda.synchronize + time.perf_counter per step, median"
        if device.type == "cuda" else "time.perf_counter per step, median")
    print("train_llama: device=%s gpu=%s torch=%s transformers=%s flash_attn_t=%s" %
          (device, gpu, torch.__version__, transformers.__version__,
           bench.fat_backends() if bench.fat is not None else "UNAVAILABLE (%s)" % bench.FAT_ERROR))
    print("model: %s, %.1fM parameters; %s; %d tokens/step; %d warm-up + %d timed steps" %
          (meta["model"], params / 1e6, meta["precision"], args.tokens, args.warmup, args.steps))

    rows = []
    t_start = time.time()
    for seqlen in args.seqlens:
        for impl in args.impls:
            row = dict(impl=impl, seqlen=seqlen, batch=max(1, args.tokens // seqlen))
            bench.free_mem(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.time()
            if args.watchdog > 0:
                faulthandler.dump_traceback_later(args.watchdog, repeat=True)
            if impl == "flash_attn_t" and bench.fat is None:
                row["status"] = "skipped: flash_attn_t unavailable (%s)" % bench.FAT_ERROR
            else:
                try:
                    row.update(run_config(args, cfg, impl, seqlen, device))
                    row["status"] = "ok"
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    if bench.is_oom(e):
                        row["status"] = "OOM"
                    else:
                        row["status"] = "error: " + bench.short("%s: %s" % (type(e).__name__, e),
                                                                300)
                    if device.type == "cuda":
                        row["peak_bytes_before_failure"] = torch.cuda.max_memory_allocated(device)
            faulthandler.cancel_dump_traceback_later()
            bench.free_mem(device)  # the failed configuration's tensors die with the frame
            row["wall_s"] = time.time() - t0
            rows.append(row)
            ok = row["status"] == "ok"
            print("  seqlen %5d batch %3d %-12s %s  (%.1f s)" % (
                seqlen, row["batch"], impl,
                ("%9.0f tokens/s  %8.1f ms/step  peak %s GiB  loss %.4f -> %.4f" % (
                    row["tokens_per_s"], row["step_ms"], gib(row.get("peak_bytes")),
                    row["loss_first"], row["loss_last"])) if ok else row["status"], row["wall_s"]))
            sys.stdout.flush()
            with open(jpath, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    write_md(mpath, meta, rows, args.seqlens, args.impls)
    print()
    print("\n".join(table_lines(rows, args.seqlens, args.impls)))
    print("\nwrote %s, %s in %.1f s" % (jpath, mpath, time.time() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
