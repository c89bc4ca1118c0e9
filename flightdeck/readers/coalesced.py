"""NCCL's coalesced groups, folded into what the ranks agreed to run.

ProcessGroupNCCL records a coalesced group as one entry per op followed by an end entry
(`nccl:coalesced`, no sizes). The per-op entries keep the state they were recorded with
(`scheduled`) for ever; only the end entry follows the group's kernel (`started`, `completed`,
times, `duration_ms`). So:

- a group of collectives (one `collective_seq_id` for all of them) becomes one entry at that seq:
  the ops' sizes and dtypes one after the other (what every member must agree on), the op's name
  when they share one, the end entry's state and times, and the first op's creation time and
  frames (when the rank entered the group, from where);
- a `batch_isend_irecv` (one `p2p_seq_id`) keeps its sends and recvs, each of which has a peer to
  be matched with, with the end entry's state and times; the end entry itself goes.

An end entry read without its ops (an incremental read that only picked up the entries that
changed) is kept as it is (no sizes); `flightdeck.analysis.summary` then updates what it already
holds of the group.
"""

from __future__ import annotations

from dataclasses import replace

from flightdeck.records import COALESCED_END_OPS, Entry, with_progress_of


def fold_coalesced(entries: list[Entry]) -> list[Entry]:
    """`entries` (in record order) with NCCL's coalesced groups folded; the list itself when it
    has none."""
    if not any(e.op in COALESCED_END_OPS for e in entries):
        return entries
    out: list[Entry] = []
    for e in entries:
        if e.op not in COALESCED_END_OPS:
            out.append(e)
            continue
        members = _members(out, e)
        if not members:
            out.append(e)  # its ops are not in this read: kept for the summary to apply
            continue
        if e.is_p2p:
            for i in members:
                out[i] = with_progress_of(out[i], e)
            continue
        ops = [out[i] for i in members]
        first = ops[0]
        names = {o.op for o in ops}
        merged = replace(
            with_progress_of(first, e),
            record_id=e.record_id,
            # One op name: the group is that op, several times over (and stays so over the wire,
            # which derives the op from `raw_op`); mixed ops keep the end entry's name.
            op=next(iter(names)) if len(names) == 1 else e.op,
            raw_op=first.raw_op if len(names) == 1 else e.raw_op,
            input_sizes=tuple(s for o in ops for s in o.input_sizes),
            output_sizes=tuple(s for o in ops for s in o.output_sizes),
            input_dtypes=tuple(d for o in ops for d in o.input_dtypes),
            output_dtypes=tuple(d for o in ops for d in o.output_dtypes),
            op_id=e.op_id,
        )
        for i in reversed(members):
            del out[i]  # near the end of the list: cheap
        out.append(merged)
    return out


def _members(out: list[Entry], end: Entry) -> list[int]:
    """Positions of the entries just before `end` (same group, same kind) that belong to it."""
    found: list[int] = []
    for i in range(len(out) - 1, -1, -1):
        e = out[i]
        if e.group != end.group:
            continue  # another group's op recorded in between
        if e.is_p2p != end.is_p2p or e.op in COALESCED_END_OPS:
            break
        same = e.p2p_seq_id == end.p2p_seq_id if end.is_p2p else e.collective_seq_id == end.collective_seq_id
        if not same:
            break
        found.append(i)
    found.reverse()
    return found
