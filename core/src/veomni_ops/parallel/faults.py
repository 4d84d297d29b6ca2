"""One rank fails, every rank stops, with the same error, in bounded time.

A rank that raises would otherwise leave the others waiting in their next collective until
its timeout (NCCL: 10 minutes by default), or fail them with a backend message that does not
say why. :class:`FailureGuard` wraps one rank's work:

* the rank that raises first writes ``rank, error`` into the job's TCP store (the one
  ``torchrun`` or rank 0 hosts: ``MASTER_ADDR:MASTER_PORT``), waits a few seconds for the
  others to acknowledge it, then raises as usual;
* every rank runs a watchdog thread polling that key; when another rank's failure appears,
  it prints ``rank R of W failed: <error>`` on stderr, acknowledges, and ends its process
  (``os._exit(1)``: the main thread may be blocked inside a collective that only a timeout
  would end);
* a rank whose own collective fails first (gloo reports a peer that went away) looks the
  failure up and raises :class:`ParallelFailure` naming the rank that failed.

A rank that dies without a Python exception (killed, out of memory, a crash in native code)
writes no record. Under torchrun its agent sees the worker die and says which; a cluster launcher
that starts the ranks itself (setting ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)
says nothing. So every rank's watchdog also counts a heartbeat in the store, and a rank whose
collective fails with no record to read (gloo: the peer's sockets closed) names the rank whose
heartbeat stopped; where the store itself is gone and no torchrun agent hosts it, rank 0 hosted it
and is the one that ended. Collective timeouts (``parallel.timeout_s``, given to
``init_process_group``) remain the bound where a collective waits instead of failing (NCCL);
a rank whose collective timed out while every rank beats names the rank that never reached it,
hung (:mod:`.hangs`), whose own watchdog then ends it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Literal

from .hangs import find_hung

PREFIX = "veomni_ops/failure"
#: torchrun's agent sets this where it hosts the job's store (then the store outlives rank 0)
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: what a rank that ended without an error report is said to have failed with
SILENT_DEATH = "its process ended without an error report (killed, out of memory, or a crash outside Python)"


class ParallelFailure(RuntimeError):
    """Another rank of this job failed; ``failed_rank`` and ``error`` say which and how."""

    def __init__(self, failed_rank: int, world_size: int, error: str, rank: int):
        self.failed_rank, self.world_size, self.error, self.rank = failed_rank, world_size, error, rank
        super().__init__(f"rank {failed_rank} of {world_size} failed: {error} (every rank was stopped; this is rank "
                         f"{rank})")


def _is_comm_error(exc: BaseException) -> bool:
    try:
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistError", ())):
            return True
    except ImportError:
        pass
    text = str(exc).lower()
    return any(w in text for w in ("connection closed", "connection reset", "timed out", "timeout", "broken pipe",
                                   "by peer", "watchdog"))


class FailureGuard:
    """Context manager around one rank's work (see the module docstring).

    ``host``/``port``: the job's TCP store (None: only timeouts protect the job).
    ``exit_on_peer_failure``: end this process when another rank fails (the default; off, this
    rank relies on its own collectives failing or timing out).
    """

    def __init__(self, rank: int, world_size: int, host: str | None, port: int | None, *, timeout_s: float = 600.0,
                 poll_s: float = 0.2, ack_wait_s: float = 10.0, exit_on_peer_failure: bool = True,
                 attempt: str | None = None):
        self.rank, self.world_size = rank, world_size
        self.host, self.port = host, port
        self.timeout_s, self.poll_s, self.ack_wait_s = timeout_s, poll_s, ack_wait_s
        self.exit_on_peer_failure = exit_on_peer_failure
        attempt = attempt if attempt is not None else os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"{PREFIX}/{attempt}"
        #: rank 0 hosts the store (init_process_group's env:// without torchrun's agent): its end is the store's
        self.store_on_rank0 = os.environ.get(AGENT_STORE_ENV, "").lower() not in ("1", "true")
        # torch.distributed.TCPStore once connected (typed Any: torch's Store methods are untyped).
        self._store: Any = None
        self._watch_store: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reported = False
        self._thread: threading.Thread | None = None

    # -- the store ----------------------------------------------------------------------------
    def _connect(self):
        import torch.distributed as dist

        return dist.TCPStore(self.host, int(self.port), is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=max(5.0, min(self.timeout_s, 60.0))))

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _read_first(self, store) -> dict[str, Any] | None:
        if not store.check([self._key("first")]):
            return None
        return json.loads(store.get(self._key("first")).decode())

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> FailureGuard:
        if self.host and self.port and self.world_size > 1:
            self._store = self._connect()
            self._watch_store = self._connect()
            self._thread = threading.Thread(target=self._watch, name="veomni-ops-failure-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the job's orderly end: rank 0, which may host the store, exits first)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.poll_s + 1)

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.stop()
        if exc is None or self._store is None or isinstance(exc, (ParallelFailure, GeneratorExit)):
            return False
        # A collective that failed because a peer went away: that peer wrote its record before it
        # exited. Wait a moment for it anyway (a timeout may beat the record by a little).
        # (Any other error is this rank's own, and reported as such even if another rank failed too.)
        if _is_comm_error(exc):
            peer = self._peer_failure(min(self.ack_wait_s, 2.0))
            if peer is None:  # no record: a rank that died without a word (killed, OOM), if one stopped beating
                peer = self._silent_failure()
            if peer is None and "timed out" in str(exc).lower():  # every rank beats: one that is stuck (.hangs)
                peer = find_hung(self)
            if peer is not None and peer["rank"] != self.rank:
                with self._lock:
                    self._reported = True
                self._ack()
                raise ParallelFailure(peer["rank"], self.world_size, peer["error"], self.rank) from exc
        self._record(exc)
        return False

    # -- failing ------------------------------------------------------------------------------
    def _record(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if len(text) > 4000:
            text = text[:4000] + " ..."
        record = {"rank": self.rank, "error": text, "host": socket.gethostname(), "pid": os.getpid()}
        store = self._store
        try:
            if not self._claim_first(record):
                self._ack()  # another rank failed first: its record stands; it waits for our word
                return
            deadline = time.monotonic() + self.ack_wait_s
            while time.monotonic() < deadline:  # give the others time to report it before we exit
                if store.add(self._key("acks"), 0) >= self.world_size - 1:
                    break
                time.sleep(self.poll_s / 2)
        except Exception:  # the store is gone: nothing more to tell anyone
            pass

    def _claim_first(self, record: dict[str, Any]) -> bool:
        """Write ``record`` as the job's failure unless another was first (store errors propagate)."""
        if self._store.add(self._key("count"), 1) != 1:
            return False
        self._store.set(self._key("first"), json.dumps(record))
        return True

    def _silent_failure(self) -> dict[str, Any] | None:
        """The rank that ended without a record, as this rank's collective failed: the one whose
        heartbeat stopped (read twice, a few beats apart; this rank beats meanwhile, as its watchdog
        has stopped), or rank 0 where the store it hosted is gone. Recorded as the job's failure, so
        that the other ranks' watchdogs stop them with the same error. ``None``: every rank beats."""
        where = f"the job's store at {self.host}:{self.port}"
        try:
            before = self._beats()
            deadline = time.monotonic() + max(1.0, 5 * self.poll_s)
            while time.monotonic() < deadline:
                self._store.add(self._key(f"beat/{self.rank}"), 1)
                time.sleep(self.poll_s / 2)
            after = self._beats()
        except Exception:
            if not self.store_on_rank0 or self.rank == 0:
                return None
            return {"rank": 0, "error": f"{SILENT_DEATH}; {where}, which rank 0 hosted, is gone"}
        stopped = [r for r in range(self.world_size) if r != self.rank and after[r] == before[r]]
        if not stopped:
            return None
        others = f"; rank(s) {', '.join(map(str, stopped[1:]))} stopped too" if stopped[1:] else ""
        record = {"rank": stopped[0], "error": f"{SILENT_DEATH}: its heartbeat in {where} stopped{others} "
                                               f"(seen by rank {self.rank})"}
        try:
            self._claim_first(record)
        except Exception:
            pass
        return record

    def _beats(self) -> list[int]:
        return [self._store.add(self._key(f"beat/{r}"), 0) for r in range(self.world_size)]

    def _peer_failure(self, wait: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + wait
        while True:
            try:
                got = self._read_first(self._store)
            except Exception:
                return None
            if got is not None or time.monotonic() >= deadline:
                return got
            time.sleep(self.poll_s / 2)

    def _ack(self) -> None:
        try:
            self._store.add(self._key("acks"), 1)
        except Exception:
            pass

    # -- watching -----------------------------------------------------------------------------
    def _watch(self) -> None:
        lost = 0
        beat = self._key(f"beat/{self.rank}")
        while not self._stop.wait(self.poll_s):
            try:
                self._watch_store.add(beat, 1)  # this rank is alive (see _silent_failure)
                got = self._read_first(self._watch_store)
                lost = 0
            except Exception as e:
                lost += 1
                if lost * self.poll_s < min(self.timeout_s, 10.0) or self._stop.is_set():
                    continue
                gone = f"the job's store at {self.host}:{self.port} is gone ({e})"
                got = ({"rank": 0, "error": f"{SILENT_DEATH}; {gone}, which rank 0 hosted"} if self.store_on_rank0
                       else {"rank": "?", "error": f"{gone}; the launcher ended"})
            if got is None or (got["rank"] == self.rank and not got.get("hung")):  # hung: this rank is stuck
                continue
            with self._lock:
                if self._reported or self._stop.is_set():
                    return
                self._reported = True
            print(f"veomni-ops: rank {got['rank']} of {self.world_size} failed: {got['error']} (stopping rank "
                  f"{self.rank})", file=sys.stderr, flush=True)
            try:
                self._watch_store.add(self._key("acks"), 1)
            except Exception:
                pass
            if self.exit_on_peer_failure:
                sys.stdout.flush()
                # let the failing rank see the acknowledgement (it may host the store); named hung, let the
                # rank that named it say so before a launcher (torchrun) stops it for this rank's end
                time.sleep(2.0 if got.get("hung") else 2 * self.poll_s)
                os._exit(1)
            return
