"""iptables DROP rules in the pod's network namespace, in chains of the agent's own.

iptables has two kernel back ends, nf_tables and the legacy x_tables, and rules written
through one are invisible to the other's tools: a rule must go where the rules already in
the namespace live, and to a back end the node's kernel has. ``iptables_command`` picks as
Kubernetes' own ``iptables-wrapper`` (kubernetes-sigs/iptables-wrappers) does: the back end
that holds more rules, nf_tables on a tie; one whose tools fail (no kernel support) is never
picked. ``$UNDERTOW_IPTABLES`` (``nft`` or ``legacy``) overrides the choice.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence

from undertow.kube.agent.errors import AgentError

DIRECTIONS = {"input": ("INPUT", "UNDERTOW-INPUT", "-s"),
              "output": ("OUTPUT", "UNDERTOW-OUTPUT", "-d")}


class Netfilter:
    """iptables DROP rules in the agent's network namespace, in the agent's own chains.

    ``command`` is how iptables is called; a test prefixes it with ``ip netns exec NS``.
    """

    def __init__(self, command: Sequence[str] = ("iptables", "-w")) -> None:
        self.command = tuple(command)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.command, *args], capture_output=True, text=True,
                                check=False)
        if check and result.returncode != 0:
            raise AgentError(f"{' '.join([*self.command, *args])}: {result.stderr.strip()}")
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
            self._run("-A", chain, *rule)

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


BACKENDS = {"nft": "iptables-nft", "legacy": "iptables-legacy"}
BACKEND_ENV = "UNDERTOW_IPTABLES"


def count_rules(binary: str) -> int | None:
    """Rules (``-A`` lines of ``BINARY-save``) in this network namespace; None when that
    back end's tools are missing or the kernel refuses them."""
    try:
        result = subprocess.run([f"{binary}-save"], capture_output=True, text=True,
                                check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return sum(1 for line in result.stdout.splitlines() if line.startswith("-A "))


def choose_backend(counts: Mapping[str, int | None], override: str | None = None) -> str:
    """``nft`` or ``legacy`` from each back end's rule count (None: unusable)."""
    if override:
        if override not in BACKENDS:
            raise AgentError(f"${BACKEND_ENV}={override!r}: expected nft or legacy")
        return override
    usable = {name: count for name, count in counts.items() if count is not None}
    if not usable:
        raise AgentError("neither iptables-nft nor iptables-legacy works here (the fault "
                         "agent needs NET_ADMIN and one of the kernel's iptables back ends)")
    return max(usable, key=lambda name: (usable[name], name == "nft"))


def iptables_command(env: Mapping[str, str] = os.environ,
                     counter: Callable[[str], int | None] = count_rules) -> tuple[str, ...]:
    """The iptables command (with ``-w``, waiting for the xtables lock) to use here."""
    backend = choose_backend({name: counter(binary) for name, binary in BACKENDS.items()},
                             env.get(BACKEND_ENV))
    return (BACKENDS[backend], "-w")
