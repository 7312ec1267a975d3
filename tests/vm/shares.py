#!/usr/bin/env python3
"""Shares of GPU time between vGPUs, from samples of `vgpuctl --json stats`.

usage: shares.py SAMPLES NAME=WEIGHT[:LOG] NAME=WEIGHT[:LOG] [...]

SAMPLES has one line per sample: the time in seconds, a space, then the
daemon's stats JSON. Each vGPU's share of a window is its GPU time (what
the scheduler charged) over that of all the named vGPUs. Only the 1 s
windows inside a stretch in which every named vGPU was charged time in
each 0.1 s step, at least 1 s from its ends (where a load starts or
stops), and in which the GPU was busy for at least 90% of the time, are
judged: that is when all of them were saturating it. Passes when every
such window (sliding by one sample) is within 2 points of the weights'
shares and there are at least MIN_WINDOWS (20) of them.

A LOG is a vGPU's guest console: where it has LOAD lines stamped with
the wall clock (`at=SECONDS`, one per second of a load loop), its
windows must also lie inside such a loop, at least 1 s from its ends.
Being charged is not yet saturating: a tenant setting up its load (its
allocations, a graph capture) is charged time but leaves the GPU to the
other, and would be judged as getting less than its share.
"""

import json
import os
import re
import sys

WINDOW_S = 1.0
TOLERANCE_PP = 2.0
MIN_WINDOWS = int(os.environ.get("MIN_WINDOWS", "20"))
MARGIN_S = 1.0


def load(path, names):
    """(time, {name: busy seconds}) for every readable sample."""
    samples = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            t, _, doc = line.partition(" ")
            try:
                stats = json.loads(doc)
                busy = {v["name"]: float(v["busy_seconds"]) for v in stats["vgpus"]}
                samples.append((float(t), {n: busy[n] for n in names}))
            except (ValueError, KeyError, TypeError):
                continue  # the daemon's socket was not up, or a cut line
    return samples


def load_loops(path):
    """The (start, end) wall-clock times of the load loops a guest's
    console reports: runs of LOAD lines at most 3 s apart, each line
    printed one second into the time it counts."""
    stamps = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"\bLOAD\b.*\bat=([0-9.]+)", line)
            if m:
                stamps.append(float(m.group(1)))
    loops = []
    for t in stamps:
        if loops and t - loops[-1][1] <= 3.0:
            loops[-1][1] = t
        else:
            loops.append([t - 1.0, t])
    return [tuple(x) for x in loops]


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    weights = {}
    loops = {}
    for arg in argv[2:]:
        name, _, spec = arg.partition("=")
        w, _, log = spec.partition(":")
        weights[name] = float(w)
        if log:
            found = load_loops(log)
            if found:
                loops[name] = found
    names = list(weights)
    total_w = sum(weights.values())
    target = {n: 100.0 * weights[n] / total_w for n in names}
    samples = load(argv[1], names)
    # Runs of consecutive 0.1 s steps in which every vGPU was charged time:
    # the stretches in which all of them were loading the GPU.
    active = [
        all(samples[k + 1][1][n] > samples[k][1][n] for n in names)
        for k in range(len(samples) - 1)
    ]
    judged = []
    k = 0
    while k < len(active):
        if not active[k]:
            k += 1
            continue
        end = k
        while end < len(active) and active[end]:
            end += 1
        # Samples k..end; the first and last MARGIN_S of a run are the
        # loads starting and stopping (a queue filling or draining).
        first, last = samples[k][0] + MARGIN_S, samples[end][0] - MARGIN_S
        for i in range(k, end + 1):
            t0, b0 = samples[i]
            j = i
            while j < end and samples[j + 1][0] - t0 <= WINDOW_S + 0.05:
                j += 1
            t1, b1 = samples[j]
            if t0 < first or t1 > last or t1 - t0 < WINDOW_S - 0.05:
                continue
            if not all(any(a + MARGIN_S <= t0 and t1 <= b - MARGIN_S for a, b in loops[n])
                       for n in loops):
                continue
            used = {n: b1[n] - b0[n] for n in names}
            total = sum(used.values())
            if total < 0.9 * (t1 - t0):
                continue
            judged.append((t0, {n: 100.0 * used[n] / total for n in names}, total / (t1 - t0)))
        k = end
    for n, found in loops.items():
        print(f"  {n}: load loops " + ", ".join(f"{b - a:.0f} s" for a, b in found))
    print(f"{len(samples)} samples, {len(judged)} windows of {WINDOW_S:.0f} s with every vGPU saturating")
    if not judged:
        print("FAIL shares: no window in which every vGPU kept the GPU busy")
        return 1
    worst = 0.0
    for n in names:
        got = [s[n] for _, s, _ in judged]
        dev = max(abs(g - target[n]) for g in got)
        worst = max(worst, dev)
        print(
            f"  {n}: weight {weights[n]:g}, target {target[n]:.2f}%, "
            f"mean {sum(got) / len(got):.2f}%, min {min(got):.2f}%, max {max(got):.2f}%, "
            f"worst {dev:.2f} pp"
        )
    busy = [b for _, _, b in judged]
    print(f"  GPU busy in those windows: mean {100 * sum(busy) / len(busy):.1f}%, "
          f"over {judged[-1][0] - judged[0][0] + WINDOW_S:.1f} s")
    verdict = "PASS" if worst <= TOLERANCE_PP and len(judged) >= MIN_WINDOWS else "FAIL"
    print(f"{verdict} shares: worst deviation {worst:.2f} pp (target {TOLERANCE_PP:g} pp), "
          f"{len(judged)} windows (at least {MIN_WINDOWS})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
