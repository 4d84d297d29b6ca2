"""A hung rank (alive, stuck), named: what :class:`~.faults.FailureGuard` does when a collective
of this rank timed out (``parallel.timeout_s``) and no rank failed or died.

The ranks that waited in a collective until its timeout each say so in the job's store
(``waited/RANK``) and give the others a short while (:func:`window_s`) to do the same: the ranks
that never say it while their heartbeat goes on (the guard's watchdog beats from a thread of its
own, so a rank stuck in Python or asleep still beats) are the hung ones: they never reached the
collective the others waited in. The first is recorded as the job's failure (``"hung": True``),
so that every rank ends with the same error, the hung one too (its watchdog ends it). Where every
rank waited (the network, or a collective one rank reached with other arguments), none is named
and the timeout is reported as it is.
"""

from __future__ import annotations

import time
from typing import Any


def window_s(timeout_s: float) -> float:
    """How long the ranks that timed out wait for each other's word: ranks enter a step's
    collective within about a step of each other, and so time out within about as much."""
    return max(2.0, min(10.0, timeout_s / 4))


def find_hung(guard: Any) -> dict[str, Any] | None:
    """The record of the hung rank that made this rank's collective time out (module docstring),
    claimed as the job's failure; None where no rank stands out (or the store is gone)."""
    store, world, me = guard._store, guard.world_size, guard.rank
    try:
        store.set(guard._key(f"waited/{me}"), "1")
        deadline = time.monotonic() + window_s(guard.timeout_s)
        while True:
            waited = [r for r in range(world) if store.check([guard._key(f"waited/{r}")])]
            if len(waited) == world or time.monotonic() >= deadline:
                break
            store.add(guard._key(f"beat/{me}"), 1)  # this rank's watchdog has stopped: beat for it
            time.sleep(guard.poll_s / 2)
        first = guard._read_first(store)  # another rank's failure meanwhile: that one stands
        if first is not None:
            return first
    except Exception:
        return None
    hung = [r for r in range(world) if r not in waited]
    if not hung:
        return None
    others = f"; rank(s) {', '.join(map(str, hung[1:]))} too" if hung[1:] else ""
    record = {"rank": hung[0], "hung": True,
              "error": f"hung: alive (its heartbeat goes on) but it never reached the collective that rank {me} "
                       f"waited {guard.timeout_s:g} s in (parallel.timeout_s){others}: it is stuck (a deadlock, an "
                       "endless loop, a stalled read or device); its stack (py-spy dump) says where"}
    try:
        guard._claim_first(record)
    except Exception:
        pass
    return record
