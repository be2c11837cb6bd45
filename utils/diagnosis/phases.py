"""Throughput phases: where a rate series changes level. One rule for triage (the log's step lines)
and diagnose (the TSDB's tokens/s); docs/triage.md "Throughput phases" and docs/diagnose.md step 4.

Binary segmentation with an epidemic step: a segment is cut once where the cut most reduces the sum of
squared deviations from the sides' means; when that cut fails the test below (a short dip in the
middle leaves the median of the longer side unchanged), the best pair of cuts [a, i) [i, j) [j, b) is
tried, the middle against the two outer parts together. A cut is kept only when the medians differ by
at least `rel` (relative) and by at least three standard errors of the medians. Pure standard library:
triage imports it without numpy.
"""

from __future__ import annotations

import math
import statistics

SEARCH_POINTS = 200  # the pair of cuts is searched on about this many positions per segment, then refined


def _spread(v: list[float], m: float) -> float:
    """Standard error of a median, from the median absolute deviation (robust to spikes)."""
    return 1.4826 * 1.2533 * statistics.median(abs(t - m) for t in v) / math.sqrt(len(v))


def differs(a: list[float], b: list[float], rel: float) -> bool:
    """The medians of a and b differ by >= rel (relative) and by >= 3 standard errors."""
    ma, mb = statistics.median(a), statistics.median(b)
    big = abs(ma - mb) / max(abs(ma), abs(mb), 1e-12) >= rel
    return big and abs(ma - mb) >= 3 * (_spread(a, ma) + _spread(b, mb))


def segments(x: list[float], min_len: int, rel: float) -> list[tuple[int, int]]:
    """Split x into segments [a, b) of constant level, each at least min_len long (module docstring);
    neighbours that do not differ are merged."""
    n = len(x)
    pre, pre2 = [0.0], [0.0]
    for v in x:
        pre.append(pre[-1] + v)
        pre2.append(pre2[-1] + v * v)

    def sse(a: int, b: int) -> float:
        s = pre[b] - pre[a]
        return (pre2[b] - pre2[a]) - s * s / (b - a)

    def one_cut(a: int, b: int) -> int | None:
        best = None
        for k in range(a + min_len, b - min_len + 1):
            cost = sse(a, k) + sse(k, b)
            if best is None or cost < best[0]:
                best = (cost, k)
        return best[1] if best else None

    def two_cuts(a: int, b: int) -> tuple[int, int] | None:
        """The pair (i, j) that best fits [a, i) [i, j) [j, b), each part >= min_len: searched every
        `stride` positions, then each cut refined within a stride of where it was found."""
        if b - a < 3 * min_len:
            return None
        stride = max(1, math.ceil((b - a) / SEARCH_POINTS))
        best = None
        for i in range(a + min_len, b - 2 * min_len + 1, stride):
            left = sse(a, i)
            for j in range(i + min_len, b - min_len + 1, stride):
                cost = left + sse(i, j) + sse(j, b)
                if best is None or cost < best[0]:
                    best = (cost, i, j)
        if best is None:
            return None
        _, i, j = best
        for _ in range(2):  # coordinate refinement at full resolution
            i = min(
                range(max(a + min_len, i - stride), min(j - min_len, i + stride) + 1),
                key=lambda k: sse(a, k) + sse(k, j),
            )
            j = min(
                range(max(i + min_len, j - stride), min(b - min_len, j + stride) + 1),
                key=lambda k: sse(i, k) + sse(k, b),
            )
        return i, j

    done, todo = [], [(0, n)]
    while todo:
        a, b = todo.pop()
        k = one_cut(a, b) if b - a >= 2 * min_len else None
        if k is not None and differs(x[a:k], x[k:b], rel):
            todo += [(k, b), (a, k)]
            continue
        pair = two_cuts(a, b)
        if pair and differs(x[pair[0] : pair[1]], x[a : pair[0]] + x[pair[1] : b], rel):
            todo += [(pair[1], b), (pair[0], pair[1]), (a, pair[0])]
            continue
        done.append((a, b))
    done.sort()
    merged = [done[0]] if done else []
    for a, b in done[1:]:
        pa, _ = merged[-1]
        if differs(x[pa:a], x[a:b], rel):
            merged.append((a, b))
        else:
            merged[-1] = (pa, b)
    return merged
