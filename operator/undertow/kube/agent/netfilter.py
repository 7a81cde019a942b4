"""iptables rules in the pod's network namespace, in chains of the agent's own: DROP rules
(partitions), inserted first, and NFQUEUE rules (delays, ``delays``) after them, so a
partition of a delayed link drops its packets.

Which iptables binary writes them (nf_tables or legacy) is ``iptables_backend``'s choice.

Every call is bounded: the agent runs iptables under its lock, so one that never returns
(the xtables lock held by someone else, a wedged netlink) would stop every request and
every deadline. ``-w LOCK_WAIT_S`` bounds the wait for the xtables lock
(``iptables_backend``), and ``RUN_TIMEOUT_S`` the whole call, after which the process is
killed and the call is an ``AgentError`` naming the command.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from undertow.kube.agent.errors import AgentError

LOCK_WAIT_S = 5
"""``iptables -w SECONDS``: how long iptables waits for the xtables lock."""
RUN_TIMEOUT_S = LOCK_WAIT_S + 5.0
"""How long one iptables call may take in all, the lock wait included."""

DIRECTIONS = {"input": ("INPUT", "UNDERTOW-INPUT", "-s"),
              "output": ("OUTPUT", "UNDERTOW-OUTPUT", "-d")}


class Netfilter:
    """iptables DROP rules in the agent's network namespace, in the agent's own chains.

    ``command`` is how iptables is called; a test prefixes it with ``ip netns exec NS``.
    """

    def __init__(self, command: Sequence[str] = ("iptables", "-w", str(LOCK_WAIT_S)),
                 timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.command = tuple(command)
        self.timeout_s = timeout_s

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [*self.command, *args]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False,
                                    timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise AgentError(f"{' '.join(argv)}: no answer within {self.timeout_s:g}s "
                             "(killed); is the xtables lock held?", 503) from None
        except OSError as exc:
            raise AgentError(f"{' '.join(argv)}: cannot run: {exc}") from None
        if check and result.returncode != 0:
            raise AgentError(f"{' '.join(argv)}: {result.stderr.strip()}")
        return result

    def setup(self) -> None:
        """Create the chains and their jumps (idempotent), then empty them."""
        for parent, chain, _ in DIRECTIONS.values():
            if self._run("-n", "-L", chain, check=False).returncode != 0:
                self._run("-N", chain)
            if self._run("-C", parent, "-j", chain, check=False).returncode != 0:
                self._run("-I", parent, "1", "-j", chain)
        self.flush()

    def flush(self) -> None:
        for _, chain, _ in DIRECTIONS.values():
            self._run("-F", chain)

    def _rule(self, direction: str, peer: str) -> tuple[str, ...]:
        _, chain, flag = DIRECTIONS[direction]
        return (chain, flag, f"{peer}/32", "-j", "DROP")

    def drop(self, direction: str, peer: str) -> None:
        chain, *rule = self._rule(direction, peer)
        if self._run("-C", chain, *rule, check=False).returncode != 0:
            self._run("-I", chain, "1", *rule)

    @staticmethod
    def _queue_rule(direction: str, peer: str, queue: int) -> tuple[str, ...]:
        _, chain, flag = DIRECTIONS[direction]
        return (chain, flag, f"{peer}/32", "-j", "NFQUEUE", "--queue-num", str(queue),
                "--queue-bypass")

    def enqueue(self, direction: str, peer: str, queue: int) -> None:
        """Hand the peer's packets to NFQUEUE ``queue`` (a delayer's), after every DROP."""
        chain, *rule = self._queue_rule(direction, peer, queue)
        if self._run("-C", chain, *rule, check=False).returncode != 0:
            self._run("-A", chain, *rule)

    def dequeue(self, direction: str, peer: str, queue: int) -> None:
        chain, *rule = self._queue_rule(direction, peer, queue)
        while self._run("-C", chain, *rule, check=False).returncode == 0:
            self._run("-D", chain, *rule)

    def undrop(self, direction: str, peer: str) -> None:
        chain, *rule = self._rule(direction, peer)
        while self._run("-C", chain, *rule, check=False).returncode == 0:
            self._run("-D", chain, *rule)

    def rules(self) -> list[str]:
        """``iptables -S`` of the agent's chains."""
        lines: list[str] = []
        for _, chain, _ in DIRECTIONS.values():
            lines += self._run("-S", chain).stdout.splitlines()
        return lines
