"""Reads the event timelines of the sm90a forward (dev/sm90_timeline.cuh,
written by `sm90_tl timeline D S causal variant path`, scripts/gpu_run.sh
SM90_TIMELINE) and prints, per consumer warpgroup, where a tile's cycles go:

  q wait     tile entered -> its Q landed
  turn       Q landed -> its first ping-pong turn (the other warpgroups' GEMMs)
  S0         first turn -> first S complete (the GEMM, queued behind others)
  loop       first S complete -> last P V complete
  epilogue   last P V complete -> fwd_store returned (staging: up to kStaged)
  between    fwd_store returned -> next tile entered

and the tensor-pipe idle estimate: cycles of the CTA's span in which no
warpgroup has a GEMM in flight (from its turn to the wait that saw the GEMM
complete), in total and within tile boundaries (a warpgroup's last P V
complete -> its next tile's first S complete).

  usage: python3 scripts/timeline.py logs/timeline_64x2048x1x16.txt[.gz] [--draw --cta 0 --start 0 --bucket 100]
"""
import argparse
import collections
import gzip

EVENTS = ["ProducerQ", "ProducerK", "ProducerV", "TileBegin", "QReady", "Turn", "SDone", "PVDone",
          "LoopEnd", "Staged", "TileEnd"]


def load(path):
    """{cta: {role: [(event name, clock), ...]}} and the header line."""
    data = collections.defaultdict(lambda: collections.defaultdict(list))
    header = ""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            if line.startswith("#"):
                header = line[1:].strip()
                continue
            cta, role, _, ev, clk = (int(x) for x in line.split())
            data[cta][role].append((EVENTS[ev], clk))
    return header, data


def tiles_of(events):
    """A consumer's events cut into tiles (lists starting at TileBegin)."""
    tiles = []
    for ev, clk in events:
        if ev == "TileBegin":
            tiles.append([])
        if tiles:
            tiles[-1].append((ev, clk))
    return tiles


def first(tile, name):
    return next((c for e, c in tile if e == name), None)


def phases(tile, next_begin):
    begin, q, end, loop_end = first(tile, "TileBegin"), first(tile, "QReady"), first(tile, "TileEnd"), first(tile, "LoopEnd")
    turn, s0 = first(tile, "Turn"), first(tile, "SDone")
    if turn is not None and s0 is not None and s0 < turn:  # carried S (kCarryS): issued in the tile before
        turn = q
    blocks = sum(1 for e, _ in tile if e == "SDone")
    if None in (begin, q, end) or turn is None or s0 is None or loop_end is None:
        return None
    return {"blocks": blocks, "q wait": q - begin, "turn": turn - q, "S0": s0 - turn, "loop": loop_end - s0,
            "epilogue": end - loop_end, "between": (next_begin - end) if next_begin else 0,
            "total": (next_begin or end) - begin}


def gemm_intervals(events):
    """[turn, completion seen] of every GEMM group of one consumer: a tile's
    first turn issues S alone (-> SDone), the others S and P V (-> PVDone)
    or the last P V (-> LoopEnd)."""
    out, open_turn, s_only = [], None, False
    for ev, clk in events:
        if ev == "QReady":
            s_only = True
        elif ev == "Turn":
            open_turn = clk
        elif open_turn is not None and ((s_only and ev == "SDone") or (not s_only and ev in ("PVDone", "LoopEnd"))):
            out.append((open_turn, clk))
            open_turn, s_only = None, False
    return out


def union_length(intervals, lo, hi):
    total, cur_lo, cur_hi = 0, None, None
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi):
        if cur_hi is None or a > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def report(header, data):
    print(header)
    sums = collections.defaultdict(float)
    n_tiles, blocks, span_sum, idle_sum, boundary_sum, boundary_idle = 0, 0, 0, 0, 0, 0
    for cta, roles in sorted(data.items()):
        consumers = [r for r in roles if r > 0]
        intervals = [iv for r in consumers for iv in gemm_intervals(roles[r])]
        lo = min(c for r in consumers for _, c in roles[r])
        hi = max(c for r in consumers for _, c in roles[r])
        span_sum += hi - lo
        idle_sum += (hi - lo) - union_length(intervals, lo, hi)
        for r in consumers:
            tiles = tiles_of(roles[r])
            for i, tile in enumerate(tiles):
                nb = first(tiles[i + 1], "TileBegin") if i + 1 < len(tiles) else None
                ph = phases(tile, nb)
                if ph is None:
                    continue
                n_tiles += 1
                blocks += ph["blocks"]
                for k, v in ph.items():
                    if k != "blocks":
                        sums[k] += v
                if i + 1 < len(tiles):  # boundary: last P V of this tile -> first S of the next
                    b_lo, b_hi = first(tile, "LoopEnd"), first(tiles[i + 1], "SDone")
                    if b_lo is not None and b_hi is not None and b_hi > b_lo:
                        boundary_sum += b_hi - b_lo
                        boundary_idle += (b_hi - b_lo) - union_length(intervals, b_lo, b_hi)
    if not n_tiles:
        print("  no tiles")
        return
    print(f"  {len(data)} CTAs, {n_tiles} warpgroup tiles, {blocks / n_tiles:.2f} key blocks per tile")
    print("  mean cycles per warpgroup tile: " + ", ".join(
        f"{k} {sums[k] / n_tiles:.0f}" for k in ["q wait", "turn", "S0", "loop", "epilogue", "between", "total"]))
    per_block = sums["loop"] / max(1, blocks - n_tiles)
    print(f"  loop cycles per key block after the first: {per_block:.0f}")
    print(f"  tensor idle (no GEMM in flight): {idle_sum / span_sum:.1%} of the CTAs' span; "
          f"boundaries {boundary_sum / n_tiles:.0f} cycles per warpgroup tile, of which idle "
          f"{boundary_idle / n_tiles:.0f}")


def draw(data, cta, t_from, width, bucket):
    """CTA cta from t_from cycles after its first event, width columns of
    bucket cycles: G = a GEMM in flight, e = epilogue, | = tile entered,
    producer q / k / v = loads issued, . = none of these."""
    roles = data[cta]
    t0 = min(c for r in roles for _, c in roles[r]) + t_from
    col = lambda c: (c - t0) // bucket
    print(f"  CTA {cta}, from cycle {t_from}, {bucket} cycles per column")
    for r in sorted(roles):
        row = ["."] * width
        put = lambda a, b, ch: [row.__setitem__(i, ch) for i in range(max(0, col(a)), min(width, col(b) + 1))]
        evs = roles[r]
        if r == 0:
            for e, c in evs:
                if 0 <= col(c) < width:
                    row[col(c)] = {"ProducerQ": "q", "ProducerK": "k", "ProducerV": "v"}[e]
        else:
            for a, b in gemm_intervals(evs):
                put(a, b, "G")
            for i, (e, c) in enumerate(evs):
                if e == "LoopEnd":
                    end = next((c2 for e2, c2 in evs[i:] if e2 == "TileEnd"), None)
                    if end:
                        put(c, end, "e")
            for e, c in evs:
                if e == "TileBegin" and 0 <= col(c) < width:
                    row[col(c)] = "|"
        print(f"  {'prod' if r == 0 else 'wg' + str(r - 1):>4} " + "".join(row))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--draw", action="store_true", help="an ASCII timeline of one CTA")
    ap.add_argument("--cta", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="cycles after the CTA's first event")
    ap.add_argument("--width", type=int, default=160)
    ap.add_argument("--bucket", type=int, default=100, help="cycles per column")
    args = ap.parse_args()
    for path in args.paths:
        header, data = load(path)
        report(header, data)
        if args.draw:
            draw(data, args.cta, args.start, args.width, args.bucket)


if __name__ == "__main__":
    main()
