#!/usr/bin/env python3
"""Where a run's GEMM time goes, from its --trace file: per kind of product (batch, m, n, k,
which operands are read transposed, whether it adds to C), the calls, their time and their
rate, largest time first. Standard library only.

    ./t --steps 2 --trace t.json && scripts/trace-gemms.py t.json --last-step

A masked GEMM (a stage program's) skips the entries of bubble stages but counts them in its
batch, so its rate here is an upper bound; the backward's per-stage products have none.
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a trace written by --trace")
    ap.add_argument("--last-step", action="store_true",
                    help="only the last step of each rank (the first touches fresh memory)")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    windows = {}
    if args.last_step:
        for e in spans:
            if e["cat"] == "step" and (e["pid"] not in windows or e["ts"] > windows[e["pid"]][0]):
                windows[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    kinds = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in spans:
        if e["cat"] != "GEMM" or "m" not in e["args"]:
            continue
        w = windows.get(e["pid"])
        if args.last_step and not (w and w[0] <= e["ts"] <= w[1]):
            continue
        a = e["args"]
        key = (e["pid"], a["batch"], a["m"], a["n"], a["k"], a["product"], a["accumulate"])
        kinds[key][0] += 1
        kinds[key][1] += e["dur"] / 1e6
        kinds[key][2] += 2.0 * a["batch"] * a["m"] * a["n"] * a["k"]
    total = sum(v[1] for v in kinds.values())
    print(f"{'rank':>4} {'batch × [m×k]·[k×n]':>28} {'product':>9} {'calls':>7} "
          f"{'s':>9} {'share':>6} {'GFLOP/s':>8}")
    for key, (calls, seconds, flops) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        rank, batch, m, n, k, product, accumulate = key
        shape = f"{batch} × [{m}×{k}]·[{k}×{n}]"
        name = product + (" +=" if accumulate else "")
        rate = flops / seconds / 1e9 if seconds > 0 else float("nan")
        print(f"{rank:>4} {shape:>28} {name:>9} {calls:>7} {seconds:>9.3f} "
              f"{seconds / total:>6.1%} {rate:>8.1f}")
    print(f"GEMM time in all: {total:.3f} s")


if __name__ == "__main__":
    main()
