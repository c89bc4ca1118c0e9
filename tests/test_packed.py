"""The packed summary columns read back exactly what an `array('q')` given the same writes holds."""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left

import pytest

from flightdeck.analysis.packed import Coded, Column, Split, Steps, nbytes, pack_track
from flightdeck.analysis.summary import GroupTrack

INT64 = 1 << 63


def _values(kind: str, rng: random.Random, n: int) -> list[int]:
    if kind == "seqs":  # counting up, with gaps (a ring that dropped some)
        out, v = [], rng.randrange(0, 1000)
        for _ in range(n):
            v += 1 if rng.random() < 0.95 else rng.randrange(2, 50)
            out.append(v)
        return out
    if kind == "fps":
        table = [rng.randrange(0, INT64) for _ in range(rng.choice([1, 3, 300]))]
        return [rng.choice(table) for _ in range(n)]
    if kind == "times":  # nanoseconds, milliseconds to seconds apart, some negative, some huge
        t = rng.choice([0, -(1 << 40), 1_700_000_000_000_000_000, INT64 - (1 << 45)])
        out = []
        for _ in range(n):
            t += rng.choice([1_000_000, 300_000_000, 5_000_000_000])
            out.append(min(t, INT64 - 1))
        return out
    return [rng.randrange(-INT64, INT64) for _ in range(n)]


def _check(col: Column, ref: array[int], rng: random.Random) -> None:
    assert len(col) == len(ref)
    assert col.tolist() == ref.tolist()
    assert col == ref and list(col) == list(ref)
    n = len(ref)
    for _ in range(20):
        i, j = sorted(rng.randrange(-2, n + 3) for _ in range(2))
        got = col[i:j]
        assert isinstance(got, array) and got.typecode == "q" and got == ref[i:j]
    if n:
        for i in (0, -1, n - 1, rng.randrange(n), -rng.randrange(1, n + 1)):
            assert col[i] == ref[i]
    with pytest.raises(IndexError):
        col[n]
    assert col[::2] == ref[::2]


@pytest.mark.parametrize("make", [Steps, Coded, Split, lambda v: Steps(v, step=0)])
@pytest.mark.parametrize("kind", ["seqs", "fps", "times", "random"])
def test_columns_match_an_int64_array_under_the_summary_writes(make: object, kind: str) -> None:
    rng = random.Random(f"{kind}-{make}")
    for trial in range(15):
        start = _values(kind, rng, rng.choice([0, 1, 2, 40, 700]))
        ref = array("q", start)
        col = make(start)  # type: ignore[operator]
        _check(col, ref, rng)
        more = _values(kind, rng, 200)
        for step in range(300):
            op = rng.random()
            if op < 0.6 and more:
                x = more.pop()
                col.append(x)
                ref.append(x)
                if rng.random() < 0.1:
                    col.flush()  # what `pack_track` does after each snapshot folded in
            elif op < 0.75 and ref:
                i = rng.randrange(-len(ref), len(ref))
                x = ref[i] if rng.random() < 0.5 else rng.choice(_values(kind, rng, 1))
                col[i] = x
                ref[i] = x
            elif op < 0.85:
                i = rng.randrange(0, len(ref) + 1)
                x = rng.choice(_values(kind, rng, 1))
                col.insert(i, x)
                ref.insert(i, x)
            elif op < 0.95:
                cut = rng.randrange(0, len(ref) + 2)
                del col[:cut]
                del ref[:cut]
            else:
                i, j = sorted(rng.randrange(0, len(ref) + 1) for _ in range(2))
                del col[i:j]
                del ref[i:j]
            if step % 50 == 0:
                _check(col, ref, rng)
        _check(col, ref, rng)
        assert trial >= 0


def test_out_of_range_values_raise_as_in_an_int64_array() -> None:
    for col in (Steps([1, 2]), Coded([5])):
        with pytest.raises(OverflowError):
            col.append(INT64)
    with pytest.raises(OverflowError):
        Split([INT64])


def test_a_packed_track_takes_a_few_bytes_a_collective_and_reads_the_same() -> None:
    n = 2000
    base = 1_764_000_000_000_000_000
    t = GroupTrack(
        seqs=array("q", range(1, n + 1)),
        fps=array("q", [(i % 7) * 0x1234567890ABCDE for i in range(n)]),
        created_ns=array("q", [base + i * 1_000_000 + (i % 13) for i in range(n)]),
        op_ids=array("q", range(1, n + 1)),
    )
    plain = (t.seqs, t.fps, t.created_ns, t.op_ids)
    pack_track(t)
    assert (t.seqs, t.fps, t.created_ns, t.op_ids) == plain
    assert t.index_of(1234) == 1233 and t.last_seq == n
    assert bisect_left(t.seqs, 500) == 499
    packed = sum(nbytes(c) for c in (t.seqs, t.fps, t.created_ns, t.op_ids))
    # 4 bytes of enqueue time, 1 of fingerprint code, the runs: against 32 bytes unpacked.
    assert packed < 7 * n < sum(nbytes(c) for c in plain) / 4
