"""Keeps `specdec up`'s processes running: a child that exits is started again.

A restarted child binds the port it had, so the coordinator (and clients) find it where
they left it; the coordinator already survives a dead service (K = 0 without a draft,
UNAVAILABLE while the target is away) and re-syncs once it answers. Restarts back off
exponentially per service (1 s, doubling to 30 s), and the wait resets once a child has
stayed up for a minute. A gateway that no longer lists one of the coordinators (a
``DELETE /workers/...``, a worker it gave up on) gets it registered again.
"""

from __future__ import annotations

import logging
import time
import urllib.error
from dataclasses import dataclass

from specdec.gateway import register_worker, registered_workers, worker_url
from specdec.launcher import Stack

logger = logging.getLogger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0  # seconds up after which a child's backoff starts again from FIRST
GATEWAY_CHECK_INTERVAL = 2.0  # seconds between checks of the gateway's worker list


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
        self._gateway_checked = now

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
        if self.stack.gateway_url and now - self._gateway_checked >= GATEWAY_CHECK_INTERVAL:
            self._gateway_checked = now
            lines += self._repair_gateway()
        return lines

    def _repair_gateway(self) -> list[str]:
        """Registers again each coordinator the gateway no longer lists."""
        url, key = self.stack.gateway_url, self.stack.gateway_admin_key
        try:
            listed = {w.get("url") for w in registered_workers(url, key)}
            lost = [a for a in self.stack.addresses if worker_url(a) not in listed]
            for address in lost:
                register_worker(url, key, address)
        except (urllib.error.URLError, OSError, ValueError) as e:
            return [f"gateway worker check failed: {e}"]  # a restarting gateway, say
        return [f"the gateway lost coordinator {a}; registered it again" for a in lost]
