"""Keeps `specdec up`'s processes running: a child that exits is started again.

A restarted child binds the port it had, so the coordinator (and clients) find it where
they left it; the coordinator already survives a dead service (K = 0 without a draft,
UNAVAILABLE while the target is away) and re-syncs once it answers. Restarts back off
exponentially per service (1 s, doubling to 30 s), and the wait resets once a child has
stayed up for a minute.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from coordinator.launcher import Stack

logger = logging.getLogger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0  # seconds up after which a child's backoff starts again from FIRST


@dataclass
class _Restarts:
    backoff: float = FIRST_BACKOFF
    due: float = 0.0  # when the exited child may start again
    started: float = 0.0


class Supervisor:
    def __init__(self, stack: Stack, ready_timeout: float = 300.0) -> None:
        self.stack = stack
        self.ready_timeout = ready_timeout
        now = time.monotonic()
        self._restarts = {p.name: _Restarts(started=now) for p in stack.processes}

    def poll(self) -> list[str]:
        """Restarts the children that exited and whose backoff has passed; returns one log
        line per exit seen or restart made."""
        lines, now = [], time.monotonic()
        for i, process in enumerate(self.stack.processes):
            code = process.proc.poll()
            if code is None:
                continue
            state = self._restarts[process.name]
            if state.due == 0.0:
                if now - state.started >= STABLE_AFTER:
                    state.backoff = FIRST_BACKOFF
                state.due = now + state.backoff
                lines.append(
                    f"{process.name} exited with status {code}; restarting in {state.backoff:g}s"
                )
                continue
            if now < state.due:
                continue
            fresh = process.respawned()
            self.stack.processes[i] = fresh
            state.backoff = min(2 * state.backoff, MAX_BACKOFF)
            state.due, state.started = 0.0, now
            try:
                fresh.wait_ready(self.ready_timeout)
            except RuntimeError as e:  # it died again before serving: the next poll sees it
                lines.append(f"{process.name} failed to restart: {e}")
                continue
            lines.append(f"{process.name} restarted on {fresh.address}")
        return lines
