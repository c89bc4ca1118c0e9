"""`SharedStacks`: the reader's processes share one stack table across the files they read, so
the summaries they send hold one object per distinct stack; the summaries are the same either way."""

from __future__ import annotations

import pickle
from pathlib import Path

from flightdeck.analysis import RankSummary, summarize
from flightdeck.analyze_cmd import _load_rank, _RankFiles
from flightdeck.readers.fr.files import load_dump_file, read_meta
from flightdeck.readers.fr.normalize import SharedStacks, _Ctx

HEALTHY = Path(__file__).parent / "data" / "fr" / "healthy_4"


def _item(rank: int) -> _RankFiles:
    path = HEALTHY / f"rank_{rank}.final.pkl"
    return _RankFiles(None, 0, rank, (str(path),), (read_meta(path),))


def _summary_alone(rank: int) -> RankSummary:
    loaded = load_dump_file(HEALTHY / f"rank_{rank}.final.pkl")
    got = loaded.parse_signatures()
    assert got is not None
    return summarize(got[0], signatures=got[1])


def test_ranks_read_in_one_process_share_their_stacks() -> None:
    a, _ = _load_rank(_item(0))
    b, _ = _load_rank(_item(1))
    assert a is not None and b is not None
    alike = [fp for fp in set(a.sig_frames) & set(b.sig_frames) if a.sig_frames[fp] == b.sig_frames[fp]]
    assert alike  # the ranks of the fixture call their collectives from the same code
    assert all(a.sig_frames[fp] is b.sig_frames[fp] for fp in alike)


def test_the_summaries_are_those_of_each_file_read_alone() -> None:
    for rank in range(4):
        got, errors = _load_rank(_item(rank))
        assert errors == [] and got is not None
        alone = _summary_alone(rank)
        assert got == alone
        assert pickle.loads(pickle.dumps(got)) == alone  # and so after the trip to the parent


def test_outside_it_each_file_has_its_own_table() -> None:
    assert _Ctx().stacks is not _Ctx().stacks
    stacks = SharedStacks()
    with stacks:
        assert _Ctx().stacks is stacks.table
    assert _Ctx().stacks is not stacks.table


def test_a_table_over_its_bound_is_emptied_when_the_next_file_starts() -> None:
    stacks = SharedStacks(max_stacks=1)
    with stacks:
        ctx = _Ctx()
        ctx.stacks[(("f", "a.py", 1),)] = ()
        ctx.stacks[(("g", "a.py", 2),)] = ()
    assert len(stacks.table) == 2
    with stacks:
        assert stacks.table == {}
