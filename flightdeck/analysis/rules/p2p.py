"""Point-to-point faults from the send/recv entries NCCL records (gloo records none): a send and its
recv that disagree, a rank that sent to (or received from) the wrong peer, and an op whose peer
never posted the matching one."""

from __future__ import annotations

from flightdeck.analysis import evidence
from flightdeck.analysis.findings import Finding, Options
from flightdeck.analysis.rules.common import NS, _Group, _group_label, _refs, _sizes
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import Entry


def _p2p(
    g: _Group, by_rank: dict[int, RankSummary], now_ns: int, opts: Options, elapsed_known: bool = True
) -> list[Finding]:
    """Point-to-point faults from the send/recv entries NCCL records (gloo records none).

    Between two ranks NCCL delivers in order, so the k-th send src->dst pairs with the k-th recv
    dst<-src (ops of one `batch_isend_irecv` share a `p2p_seq_id`; the reader gives them the
    batch's state). A pair that disagrees on sizes or dtypes is a mismatch; its culprit is the side
    that changed from the transfers between the two that matched before. An unpaired op that is
    stuck waits for a peer: when the rank it names posted nothing for it while another rank waits
    for a message from the same rank (a send src->X unpaired, a recv Y<-src unpaired), src sent to
    the wrong peer (or, mirrored, a receiver named the wrong source); otherwise the peer that
    never posted the matching op is the culprit.

    Under file times only (`elapsed_known` False) an op counts as stuck by position instead: it is
    the newest thing its rank recorded, and another member of the group recorded something later.
    """
    sends: dict[tuple[int, int], list[Entry]] = {}
    recvs: dict[tuple[int, int], list[Entry]] = {}
    for r in g.present:
        s = by_rank.get(r)
        if s is None or s.wrapped:
            continue
        track = s.tracks.get(g.name)
        if track is None:
            continue
        for e in track.p2p:
            if e.peer is None:
                continue
            peer = g.members[e.peer] if e.peer < len(g.members) else e.peer
            if e.op == "send":
                sends.setdefault((r, peer), []).append(e)
            elif e.op == "recv":
                recvs.setdefault((peer, r), []).append(e)
    out: list[Finding] = []
    #: Unpaired ops still in flight, by pair: (the op, its position in the pair's stream).
    lone_sends: dict[tuple[int, int], tuple[Entry, int]] = {}
    lone_recvs: dict[tuple[int, int], tuple[Entry, int]] = {}
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        if src not in by_rank or dst not in by_rank:
            continue
        ss, rr = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(ss), len(rr))):
            se = ss[k] if k < len(ss) else None
            re_ = rr[k] if k < len(rr) else None
            if se is not None and re_ is not None:
                if se.input_sizes != re_.output_sizes or se.input_dtypes != re_.output_dtypes:
                    out.append(_p2p_mismatch(g, src, dst, k, ss[:k], rr[:k], se, re_, by_rank))
                    break
                continue
            lone = se or re_
            assert lone is not None
            owner = src if se is not None else dst
            stuck = (
                (now_ns - lone.time_created_ns) / NS >= opts.stall_after_s
                if elapsed_known
                else _stuck_by_position(lone, owner, g, by_rank)
            )
            if not lone.finished and stuck:
                (lone_sends if se is not None else lone_recvs)[pair] = (lone, k)
            break
    # Wrong peer: src's unpaired send is the first transfer ever seen between src and X, while Y,
    # which src did send to before, waits for the next one. (When src had sent to X before, X not
    # posting its recv is the likelier fault: X is stuck elsewhere, src blocks on it and so has
    # not reached its send to Y yet; that is left to the hang findings below.)
    blamed: set[tuple[int, int]] = set()
    for (src, x), (se, k_s) in sorted(lone_sends.items()):
        other = next(
            ((y, rv) for (s2, y), rv in sorted(lone_recvs.items()) if s2 == src and y != x and rv[1] > 0),
            None,
        )
        if other is None or k_s > 0:
            continue
        y, (re_, k) = other
        blamed.update({(src, x), (src, y)})
        out.append(
            _wrong_peer(
                g, src, se, re_, k, by_rank, now_ns, elapsed_known, sender=True, named=x, expected_by=y
            )
        )
    for (x, dst), (re_, k_r) in sorted(lone_recvs.items()):
        if (x, dst) in blamed or k_r > 0:
            continue
        other = next(
            ((y, sv) for (y, d2), sv in sorted(lone_sends.items()) if d2 == dst and y != x and sv[1] > 0),
            None,
        )
        if other is None or (other[0], dst) in blamed:
            continue
        y, (se, k) = other
        blamed.update({(x, dst), (y, dst)})
        out.append(
            _wrong_peer(
                g, dst, re_, se, k, by_rank, now_ns, elapsed_known, sender=False, named=x, expected_by=y
            )
        )
    lone_ops = [(pair, v, True) for pair, v in lone_sends.items()] + [
        (pair, v, False) for pair, v in lone_recvs.items()
    ]
    for pair, (lone, k), is_send in sorted(lone_ops, key=lambda x: x[0]):
        if pair in blamed:
            continue
        src, dst = pair
        waiting, missing = (src, dst) if is_send else (dst, src)
        elapsed = (now_ns - lone.time_created_ns) / NS
        verb = "recv from" if is_send else "send to"
        out.append(
            Finding(
                kind="hang",
                detail=(
                    f"Point-to-point hang in {_group_label(g)}: rank {waiting} has waited "
                    f"{_waited(elapsed, elapsed_known)} "
                    f"in {lone.op} #{k + 1} with rank {missing} (p2p_seq_id {lone.p2p_seq_id}), which never "
                    f"posted the matching {verb} rank {waiting}."
                ),
                process_group=g.name,
                process_group_desc=g.desc,
                op=lone.op,
                culprit_ranks=[missing],
                waiting_ranks=[waiting],
                elapsed_s=elapsed,
                culprits=_refs([missing], by_rank),
                waiting_frames=lone.frames,
            )
        )
    return out


def _p2p_mismatch(
    g: _Group,
    src: int,
    dst: int,
    k: int,
    before_s: list[Entry],
    before_r: list[Entry],
    se: Entry,
    re_: Entry,
    by_rank: dict[int, RankSummary],
) -> Finding:
    """A send and its recv that disagree; the culprit is the side that changed since the pair last
    matched (both sides when there is no earlier transfer to tell, or both changed)."""

    def shape(sizes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> tuple[object, ...]:
        return (sizes, dtypes)

    sent, wanted = shape(se.input_sizes, se.input_dtypes), shape(re_.output_sizes, re_.output_dtypes)
    before = [shape(b.input_sizes, b.input_dtypes) for b in before_s[-3:]]
    before += [shape(b.output_sizes, b.output_dtypes) for b in before_r[-3:]]
    culprits = [src, dst]
    if before and all(b == wanted for b in before):
        culprits = [src]
    elif before and all(b == sent for b in before):
        culprits = [dst]
    what = "size" if se.input_sizes != re_.output_sizes else "dtype"
    blame = ""
    if len(culprits) == 1:
        side = "sender" if culprits[0] == src else "receiver"
        blame = (
            f" The {min(k, 3)} transfer(s) before between the two carried "
            f"{_sizes(re_.output_sizes if side == 'sender' else se.input_sizes)}: the {side}, rank "
            f"{culprits[0]}, changed."
        )
    return Finding(
        kind="p2p_mismatch",
        detail=(
            f"Point-to-point {what} mismatch in {_group_label(g)}: send #{k + 1} from rank {src} to rank "
            f"{dst} (p2p_seq_id {se.p2p_seq_id} on rank {src}) carries {_sizes(se.input_sizes)} "
            f"{','.join(se.input_dtypes)} but the matching recv (p2p_seq_id {re_.p2p_seq_id} on rank {dst}) "
            f"expects {_sizes(re_.output_sizes)} {','.join(re_.output_dtypes)}.{blame}"
        ),
        process_group=g.name,
        process_group_desc=g.desc,
        op="send" if culprits == [src] else "recv" if culprits == [dst] else "send/recv",
        culprit_ranks=culprits,
        waiting_ranks=[r for r in (src, dst) if r not in culprits],
        culprits=_refs(culprits, by_rank),
        culprit_frames=se.frames if culprits[0] == src else re_.frames,
        waiting_frames=re_.frames if culprits[0] == src else se.frames,
        expected=_p2p_view(re_ if culprits[0] == src else se, recv=culprits[0] == src),
        actual=_p2p_view(se if culprits[0] == src else re_, recv=culprits[0] != src),
    )


def _p2p_view(e: Entry, *, recv: bool) -> dict[str, object]:
    sizes, dtypes = (e.output_sizes, e.output_dtypes) if recv else (e.input_sizes, e.input_dtypes)
    return {"op": e.op, "sizes": [list(x) for x in sizes], "dtypes": list(dtypes), "p2p_seq_id": e.p2p_seq_id}


def _waited(elapsed: float, known: bool) -> str:
    """How long an op has waited, in words (unknown under file times only)."""
    return f"{elapsed:.1f} s" if known else "an unknown time (only file times date the dumps)"


def _stuck_by_position(op: Entry, owner: int, g: _Group, by_rank: dict[int, RankSummary]) -> bool:
    """Whether `op` is stuck as the dumps alone show it: its rank recorded nothing after it, while
    another member of the group went on: it reached a later collective of the group, or recorded
    something later."""
    s = by_rank.get(owner)
    if s is None or evidence.went_on_after(s, op):
        return False
    mine = s.tracks.get(g.name)
    my_last = mine.last_seq if mine is not None and mine.seqs else 0
    for r in g.present:
        o = by_rank.get(r)
        if r == owner or o is None:
            continue
        theirs = o.tracks.get(g.name)
        if theirs is not None and theirs.seqs and theirs.last_seq > my_last:
            return True
        if evidence.recorded_ns(o) > op.time_created_ns:
            return True
    return False


def _wrong_peer(
    g: _Group,
    culprit: int,
    mine: Entry,
    theirs: Entry,
    k: int,
    by_rank: dict[int, RankSummary],
    now_ns: int,
    elapsed_known: bool,
    *,
    sender: bool,
    named: int,
    expected_by: int,
) -> Finding:
    """`culprit`'s unpaired op names rank `named`, which posted nothing for it, while rank
    `expected_by` waits in an unpaired op with `culprit`: the culprit picked the wrong peer."""
    elapsed = (now_ns - min(mine.time_created_ns, theirs.time_created_ns)) / NS
    if sender:
        detail = (
            f"Point-to-point mismatch in {_group_label(g)}: rank {culprit} sent to rank {named} (p2p_seq_id "
            f"{mine.p2p_seq_id}), which posted no recv from it, while rank {expected_by} waits in recv #{k + 1} "
            f"from rank {culprit}: rank {culprit} sent to the wrong peer. Both have waited "
            f"{_waited(elapsed, elapsed_known)}."
        )
    else:
        detail = (
            f"Point-to-point mismatch in {_group_label(g)}: rank {culprit} waits to receive from rank {named} "
            f"(p2p_seq_id {mine.p2p_seq_id}), which sent it nothing, while rank {expected_by} waits in send "
            f"#{k + 1} to rank {culprit}: rank {culprit} receives from the wrong peer. Both have waited "
            f"{_waited(elapsed, elapsed_known)}."
        )
    return Finding(
        kind="p2p_mismatch",
        detail=detail,
        process_group=g.name,
        process_group_desc=g.desc,
        op=mine.op,
        culprit_ranks=[culprit],
        waiting_ranks=[expected_by],
        elapsed_s=elapsed,
        culprits=_refs([culprit], by_rank),
        culprit_frames=mine.frames,
        waiting_frames=theirs.frames,
        expected=_p2p_view(theirs, recv=sender),
        actual=_p2p_view(mine, recv=not sender),
    )
