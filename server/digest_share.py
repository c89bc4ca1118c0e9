"""Several server processes on one PostgreSQL: the progress digests and rounds they share.

A load balancer spreads the collectors' digests (`POST /api/v1/digest`) over the processes, but
a job's board lives with the one process that owns its diagnosis (`flightdeck.server.cluster`).
So each process keeps the digests it took in memory and writes them every `FLUSH_EVERY_S` as
one row per job (`store.add_digests`: one statement for all the requests of that time, not a
transaction per request); the owner reads its jobs' new rows every `READ_EVERY_S` and folds them
into its boards. The digests the owner takes itself it folds at once, as a single process does
(`owns`), and its reads skip the rows it wrote (`writer`); it still writes them, for a process
that takes the job over. The rounds the owner opens are written to `digest_rounds` (`publish`) and
read by every process every `ROUNDS_EVERY_S` (`round_open`), so a collector is told to ship
its entries whichever process its digest reached.

Why no row needs exactly-once delivery: a board folds by maximum (`flightdeck.analysis.board`),
so a row read twice changes nothing, and every rank sends its whole progress every interval, so
a row missed (a transaction committing after a later id was read) is made good by the next
interval's. For the same reason a process taking a job over needs no checkpoint: it folds the
rows of the last `LOOKBACK_S` and has the whole board. Its own rows among them included: it
folded none of those (it did not own the job when it took them).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from sqlalchemy.exc import OperationalError

from flightdeck.digest import DigestBlock, DigestRequest
from flightdeck.server import store
from flightdeck.server.db import Database
from flightdeck.server.live.boards import Detail

NS = 1_000_000_000
#: How often a process writes the digests it took (one row per job), and how often an owner reads
#: the rows of its jobs: a rank's digest comes every interval (2 s). With a write every 0.25 s
#: and a read every step (10 a second), those took 0.058 core of the two processes of a
#: 16,384-rank job (py-spy, 60 s of each, 2026-12-07), a ninth of their CPU.
FLUSH_EVERY_S = 0.5
READ_EVERY_S = 0.25
#: How often a process reads the open rounds.
ROUNDS_EVERY_S = 0.5
#: A process taking a job over folds the digests of this many seconds back: a few intervals.
LOOKBACK_S = 10.0
#: Rows older than this are deleted.
KEEP_S = 60.0


def encode_blocks(blocks: Iterable[DigestBlock]) -> bytes:
    """Checked digest blocks of one job as a feed row's body."""
    return orjson.dumps(
        [
            {
                "w": b.world_size, "groups": b.groups, "rank": b.rank, "t": b.time_ns, "n": b.n,
                "g": b.g, "e": b.entered, "f": b.finished, "s": b.open_since_ns, "k": b.span,
                "h": b.span_fp,
            }
            for b in blocks
        ]
    )  # fmt: skip


def decode_blocks(job: str, attempt: int, body: bytes) -> list[DigestBlock]:
    """A feed row's blocks (written by a server that checked them: not checked again)."""
    raw: list[dict[str, Any]] = orjson.loads(body)
    return [
        DigestBlock(
            job=job, attempt=attempt, world_size=d["w"], groups=d["groups"], rank=d["rank"],
            time_ns=d["t"], n=d["n"], g=d["g"], entered=d["e"], finished=d["f"], open_since_ns=d["s"],
            span=d["k"], span_fp=d["h"],
        )
        for d in raw
    ]  # fmt: skip


class DigestShare:
    """One process's side of the digests and rounds the cluster shares (see the module's doc)."""

    def __init__(
        self,
        *,
        db: Database,
        clock: Callable[[], int],
        monotonic: Callable[[], float],
        on_db_error: Callable[[], None],
        first_round_s: float,
    ) -> None:
        """`first_round_s`: how long a job first heard of by this process is asked for its
        entries (its job row and owner may not exist yet: nobody else would ask)."""
        self._db = db
        self._clock = clock
        self._mono = monotonic
        self._on_db_error = on_db_error
        self._first_round_s = first_round_s
        #: This process's id in the rows it writes (random: another process's differs).
        self.writer = random.getrandbits(62) or 1
        self._lock = threading.Lock()
        #: The jobs this process owned at the last step: it folds their digests at once (`owns`).
        self._owned: frozenset[tuple[str, int]] = frozenset()
        self._out: dict[tuple[str, int], list[DigestBlock]] = {}
        #: (job, attempt) -> until when (server clock) its round is open and what it asks, as
        #: last read.
        self._rounds: dict[tuple[str, int], tuple[int, Detail]] = {}
        #: (job, attempt) -> monotonic time this process first heard of it, and last.
        self._first: dict[tuple[str, int], float] = {}
        #: (job, attempt) -> the id of the first round this process gave it (`_first_id`).
        self._first_ids: dict[tuple[str, int], int] = {}
        self._heard: dict[tuple[str, int], float] = {}
        #: Per owned job, the id of the newest feed row folded.
        self._after: dict[tuple[str, int], int] = {}
        self._flushed = float("-inf")
        self._read_at = float("-inf")
        self._rounds_read = float("-inf")
        self._pruned = float("-inf")

    def add(self, request: DigestRequest) -> list[Detail]:
        """Keep a request's digests for the next write; returns its jobs whose round is open."""
        now, now_ns = self._mono(), self._clock()
        detail: dict[tuple[str, int], Detail] = {}
        with self._lock:
            for b in request.blocks:
                key = (b.job, b.attempt)
                self._out.setdefault(key, []).append(b)
                first = self._first.setdefault(key, now)
                self._heard[key] = now
                until, asked = self._rounds.get(key, (0, None))
                if asked is not None and until > now_ns:
                    detail[key] = asked
                elif now - first < self._first_round_s:
                    # One id per process and job: its collectors answer this first round once.
                    detail.setdefault(key, Detail(b.job, b.attempt, round=self._first_id(key)))
        return list(detail.values())

    def owns(self, job: str, attempt: int) -> bool:
        """Whether this process owned the job at the last step: the digests it takes of it are
        folded into its board at once, not read back from the feed (two processes of a
        16,384-rank job: 0.39–0.40 core in 30 s windows without a round, 0.38–0.40 in two runs of
        a variant, 0.40–0.44 when the owner read back and decoded its own rows too; 2026-12-07)."""
        return (job, attempt) in self._owned

    def _first_id(self, key: tuple[str, int]) -> int:
        """The id of the round this process opens for a job it first hears of (random, as
        `Boards`' round ids: another process's differ)."""
        rid = self._first_ids.get(key)
        if rid is None:
            rid = self._first_ids[key] = random.getrandbits(52) or 1
        return rid

    def step(self, owned: set[tuple[str, int]]) -> list[DigestBlock]:
        """Write what was taken, read the open rounds and the owned jobs' new digests (each at
        its pace); returns those digests, oldest first."""
        now = self._mono()
        self._owned = frozenset(owned)
        if now - self._flushed >= FLUSH_EVERY_S:
            self._flushed = now
            self._flush()
        if now - self._rounds_read >= ROUNDS_EVERY_S:
            self._rounds_read = now
            self._read_rounds()
        if now - self._pruned >= KEEP_S / 4:
            self._pruned = now
            self._prune()
        for key in list(self._after):
            if key not in owned:
                del self._after[key]
        # A job newly owned is read at once: its board starts from the last LOOKBACK_S.
        if not owned or (now - self._read_at < READ_EVERY_S and owned <= self._after.keys()):
            return []
        self._read_at = now
        return self._read(owned)

    def publish(self, rounds: Iterable[tuple[Detail, int]]) -> None:
        """Write the rounds this process (a job's owner) opened, each with its end (server clock)."""
        rounds = list(rounds)
        if not rounds:
            return
        try:
            with self._db.write() as session, session.begin():
                for d, until_ns in rounds:
                    store.open_round(
                        session=session, job=d.job, attempt=d.attempt, until_ns=until_ns, asks=d.asks()
                    )
        except OperationalError:
            self._on_db_error()
            return
        with self._lock:
            for d, until_ns in rounds:
                self._rounds[(d.job, d.attempt)] = (until_ns, d)

    def _flush(self) -> None:
        with self._lock:
            out, self._out = self._out, {}
        if not out:
            return
        rows = [(job, attempt, encode_blocks(blocks)) for (job, attempt), blocks in out.items()]
        try:
            with self._db.write() as session, session.begin():
                store.add_digests(session=session, rows=rows, received_ns=self._clock(), writer=self.writer)
        except OperationalError:
            # Lost, not retried: the ranks send their whole progress again next interval.
            self._on_db_error()

    def _read_rounds(self) -> None:
        try:
            with self._db.read() as session:
                rounds = store.open_rounds(session=session, now_ns=self._clock())
        except OperationalError:
            self._on_db_error()
            return
        with self._lock:
            self._rounds = {(j, a): (u, Detail.of(j, a, asks)) for j, a, u, asks in rounds}

    def _read(self, owned: set[tuple[str, int]]) -> list[DigestBlock]:
        since = self._clock() - int(LOOKBACK_S * NS)
        after = min(self._after.get(k, 0) for k in owned)
        # A job newly owned reads its own rows too: they were taken before it was owned.
        fresh = [j for j, a in owned if (j, a) not in self._after]
        try:
            with self._db.read() as session:
                rows = store.digests_after(
                    session=session,
                    after_id=after,
                    since_ns=since,
                    jobs=[j for j, _ in owned],
                    not_writer=self.writer,
                    all_of=fresh,
                )
        except OperationalError:
            self._on_db_error()
            return []
        out: list[DigestBlock] = []
        for row_id, job, attempt, body in rows:
            key = (job, attempt)
            if key in owned and row_id > self._after.get(key, 0):
                self._after[key] = row_id
                out.extend(decode_blocks(job, attempt, body))
        for key in owned:
            self._after.setdefault(key, after)
        return out

    def _prune(self) -> None:
        now = self._mono()
        with self._lock:
            # A job not heard of for KEEP_S is forgotten: if it comes back, it is first heard of again.
            self._heard = {k: t for k, t in self._heard.items() if now - t < KEEP_S}
            self._first = {k: t for k, t in self._first.items() if k in self._heard}
            self._first_ids = {k: i for k, i in self._first_ids.items() if k in self._heard}
        try:
            with self._db.write() as session, session.begin():
                store.prune_digests(session=session, before_ns=self._clock() - int(KEEP_S * NS))
        except OperationalError:
            self._on_db_error()
