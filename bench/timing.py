"""Side-by-side timing in alternating rounds, for the benchmarks whose sides are plain calls
(bench/tokenizer_speed.py, bench/generation.py; the training benchmarks' loops also count the
steps fp16's scaler skipped, so they keep their own).

The machine is shared: timed one side after the other, whatever slows it during one side's
calls falls on that side alone. So every round calls each side once, the order reversed every
other round, which also gives the first and last sides alike a call right after one of their
own (often the faster one: bench/HISTORY.md, forty-fifth session).
"""

from __future__ import annotations

import time


def alternating_rounds(
    fns: dict, rounds: int, extra: dict | None = None, clock=time.perf_counter
) -> tuple[dict, list]:
    """Calls `fns` ({side: no-argument function}) once each, untimed by the rounds (their
    tracing, compiling, caches), then `rounds` rounds calling every side once, in `fns`' order
    in even rounds and reversed in odd ones; `extra` sides run after them in the first two
    rounds only. Returns ({side of fns: (its first call's result, that call's seconds)},
    [{side: seconds} per round])."""
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, found {rounds}")
    every = {**fns, **(extra or {})}
    first = {}
    for side, fn in fns.items():
        start = clock()
        result = fn()
        first[side] = (result, clock() - start)
    timed = []
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        seconds = {}
        for side in order + (list(extra or {}) if r < 2 else []):
            start = clock()
            every[side]()
            seconds[side] = clock() - start
        timed.append(seconds)
    return first, timed


def best_seconds(timed: list) -> dict:
    """{side: its fastest call} over alternating_rounds' rounds."""
    sides = dict.fromkeys(side for seconds in timed for side in seconds)
    return {side: min(s[side] for s in timed if side in s) for side in sides}
