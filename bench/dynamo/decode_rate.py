"""Modeled decode rate of the benchmark's runs on the shared-prompt scenarios:
how well a router's placements suit the mocker's decode timing, free of the
machine's stalls.

Usage: python decode_rate.py DIR   (DIR: the -dir of a run with -keep)

For every DIR/<scenario>-<arm>-<rep>/requests.jsonl of prompts-1.6k and
prompts-6k it replays the requests' start and end times and workers, and
over the time with the scenario's 8 requests in flight sums, per worker,

    k / step(u),  step(u) = 5.74 + 54.01·u − 25.74·u²  ms

with k the worker's requests in flight and u its active KV blocks over its
capacity: each distinct system prompt in flight on it counts its blocks
once (the mocker shares a prefix's blocks among the requests that hold it),
each request 10 blocks of its own (question and output). It prints the
time average, in request-steps per second, per run and the median per arm,
and the idle share: the part of that time during which a worker had no
request in flight.
"""

import collections
import glob
import json
import os
import statistics
import sys

# scenario: (blocks of a system prompt, blocks of a request's own, KV blocks
# per worker, requests in flight)
SCENARIOS = {
    "prompts-1.6k": (94, 10, 800, 8),
    "prompts-6k": (369, 10, 2000, 8),
}


def step_ms(u):
    return 5.74 + 54.01 * u - 25.74 * u * u


def rate(path, prefix_blocks, own_blocks, capacity, in_flight):
    changes = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("Err"):
                continue
            changes.append((r["StartMS"], 1, r["Worker"], r["Prefix"]))
            changes.append((r["StartMS"] + r["LatencyMS"], -1, r["Worker"], r["Prefix"]))
    # Ends before starts at the same instant.
    changes.sort(key=lambda c: (c[0], c[1]))
    workers = {c[2] for c in changes}
    active = collections.defaultdict(collections.Counter)
    total, prev, busy, acc, idle = 0, None, 0.0, 0.0, 0.0
    for at, delta, worker, prefix in changes:
        if prev is not None and total == in_flight:
            dt = at - prev
            busy += dt
            if any(sum(active[w].values()) == 0 for w in workers):
                idle += dt
            for held in active.values():
                k = sum(held.values())
                if k == 0:
                    continue
                prompts = sum(1 for n in held.values() if n > 0)
                u = (prefix_blocks * prompts + own_blocks * k) / capacity
                acc += dt * k / step_ms(u)
        active[worker][prefix] += delta
        total += delta
        prev = at
    if not busy:
        return 0.0, 0.0
    return 1000 * acc / busy, idle / busy


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    by_arm = collections.defaultdict(list)
    idle_by_arm = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "requests.jsonl"))):
        run = os.path.basename(os.path.dirname(path))
        for name, params in SCENARIOS.items():
            if run.startswith(name + "-"):
                arm = run[len(name) + 1 :].rsplit("-", 1)[0]
                r, idle = rate(path, *params)
                by_arm[(name, arm)].append(r)
                idle_by_arm[(name, arm)].append(100 * idle)
                print(f"{run}: {r:.0f} request-steps/s, a worker idle {100 * idle:.0f}% of the time")
    for (name, arm), rates in sorted(by_arm.items()):
        idle = idle_by_arm[(name, arm)]
        print(
            f"{name} {arm}: median {statistics.median(rates):.0f} ({min(rates):.0f}–{max(rates):.0f}),"
            f" idle {min(idle):.0f}–{max(idle):.0f}%"
        )


if __name__ == "__main__":
    main()
