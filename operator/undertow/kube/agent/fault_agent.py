"""The faults the agent applies through its mechanisms, and how each one is healed.

``netfilter`` drops a peer's packets or queues them for ``delays``' delayer, ``processes``
stops or kills the target, ``hold`` keeps a killed target down; ``deadlines`` heals each
fault when its time is up.
"""

from __future__ import annotations

import logging
from typing import Any

from undertow.kube.agent.deadlines import Deadlines, Fault
from undertow.kube.agent.delays import Delays
from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.hold import Hold
from undertow.kube.agent.netfilter import Netfilter
from undertow.kube.agent.processes import Processes
from undertow.platform.link_delay import LinkDelay

log = logging.getLogger("undertow.agent")


class FaultAgent:
    """Applies faults and heals them, on request or (``deadlines``) when their time is up."""

    def __init__(self, netfilter: Netfilter, processes: Processes,
                 hold: Hold | None = None, delays: Delays | None = None) -> None:
        self.netfilter = netfilter
        self.processes = processes
        self.hold = hold or Hold(None)
        self.delays = delays or Delays()
        self.deadlines = Deadlines(self._heal_expired)

    def start(self) -> None:
        """Heal what a previous agent may have left (its deadlines died with it), then run."""
        self.netfilter.setup()
        self.processes.resume()
        self.hold.clear()
        self.deadlines.start()

    def close(self) -> None:
        self.deadlines.close()
        with self.deadlines.lock:
            self.delays.stop_all()

    # ---- faults ---------------------------------------------------------------------------

    def pause(self, deadline_s: float) -> list[int]:
        with self.deadlines.lock:
            pids = self.processes.stop()
            self.deadlines.add("pause", "pause", deadline_s)
            log.info("paused %s for at most %.1fs", pids, deadline_s)
            return pids

    def resume(self) -> list[int]:
        with self.deadlines.lock:
            self.deadlines.discard("pause")
            return self.processes.resume()

    def kill(self, deadline_s: float, grace_s: float = 0.0) -> list[int]:
        """SIGKILL the target in place (with ``grace_s`` above 0, SIGTERM first and SIGKILL
        after that long: a clean shutdown); its restart waits (``Hold``) until ``release``
        or the deadline, whichever comes first."""
        with self.deadlines.lock:
            self.hold.set(deadline_s)
            try:
                pids = self.processes.kill(grace_s)
            except AgentError:
                self.hold.clear()
                raise
            self.deadlines.add("kill", "kill", deadline_s)
            log.info("killed %s%s; held down for at most %.1fs", pids,
                     f" (SIGTERM, grace {grace_s:g}s)" if grace_s > 0 else "", deadline_s)
            return pids

    def hold_restart(self, deadline_s: float) -> None:
        """Hold the target's next start (``Hold``) until ``release`` or the deadline,
        without killing it: for a fault after which the broker halts itself (a failed
        log directory), so that it stays down for the fault's duration, as locally."""
        with self.deadlines.lock:
            self.hold.set(deadline_s)
            self.deadlines.add("hold", "hold", deadline_s)
            log.info("restart held for at most %.1fs", deadline_s)

    def release(self) -> None:
        """Let a killed (or held) target start again."""
        with self.deadlines.lock:
            self.deadlines.discard("kill")
            self.deadlines.discard("hold")
            self.hold.clear()

    def drop(self, direction: str, peer: str, deadline_s: float) -> None:
        with self.deadlines.lock:
            self.netfilter.drop(direction, peer)
            self.deadlines.add("drop", f"{direction}/{peer}", deadline_s)
            log.info("dropping %s %s for at most %.1fs", direction, peer, deadline_s)

    def undrop(self, direction: str, peer: str) -> None:
        with self.deadlines.lock:
            self.netfilter.undrop(direction, peer)
            self.deadlines.discard(f"{direction}/{peer}")

    def delay(self, direction: str, peer: str, delay: LinkDelay, deadline_s: float) -> None:
        """Delay the peer's packets (``input``: from it, ``output``: to it) until
        ``undelay`` or the deadline."""
        with self.deadlines.lock:
            self._undelay(direction, peer)
            queue = self.delays.start(direction, peer, delay)
            try:
                self.netfilter.enqueue(direction, peer, queue)
            except AgentError:
                self.delays.stop(direction, peer)
                raise
            self.deadlines.add("delay", f"delay/{direction}/{peer}", deadline_s)
            log.info("delaying %s %s by %s for at most %.1fs", direction, peer, delay,
                     deadline_s)

    def undelay(self, direction: str, peer: str) -> None:
        with self.deadlines.lock:
            self._undelay(direction, peer)
            self.deadlines.discard(f"delay/{direction}/{peer}")

    def undelay_all(self) -> None:
        """Take every delay off, whoever asked for it."""
        with self.deadlines.lock:
            for direction, peer in self.delays.links():
                self._undelay(direction, peer)
            self.deadlines.discard_kind("delay")

    def _undelay(self, direction: str, peer: str) -> None:
        queue = self.delays.queue(direction, peer)
        if queue is not None:
            self.netfilter.dequeue(direction, peer, queue)
            self.delays.stop(direction, peer)

    def undrop_all(self) -> None:
        """Remove every rule, drops and delays, those of an agent before this one included."""
        with self.deadlines.lock:
            self.netfilter.flush()
            self.delays.stop_all()
            self.deadlines.discard_kind("drop")
            self.deadlines.discard_kind("delay")

    def heal(self) -> None:
        """Remove every rule and resume every target, whatever the agent remembers."""
        with self.deadlines.lock:
            self.netfilter.flush()
            self.delays.stop_all()
            self.processes.resume()
            self.hold.clear()
            self.deadlines.clear()

    def faults(self) -> dict[str, Any]:
        with self.deadlines.lock:
            return {"faults": self.deadlines.to_json(),
                    "paused": self.processes.paused(),
                    "running": bool(self.processes.pids())}

    def _heal_expired(self, fault: Fault) -> None:
        """Undo ``fault`` at its deadline (``deadlines`` holds the lock and retries on
        ``AgentError``)."""
        if fault.kind == "pause":
            self.processes.resume()
        elif fault.kind in ("kill", "hold"):
            self.hold.clear()
        elif fault.kind == "delay":
            _, direction, peer = fault.key.split("/", 2)
            self._undelay(direction, peer)
        else:
            direction, peer = fault.key.split("/", 1)
            self.netfilter.undrop(direction, peer)
