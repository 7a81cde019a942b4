"""Which iptables back end the agent's rules go to: nf_tables or the legacy x_tables.

iptables has two kernel back ends, and rules written through one are invisible to the
other's tools: a rule must go where the rules already in the namespace live, and to a back
end the node's kernel has. ``iptables_command`` picks as Kubernetes' own
``iptables-wrapper`` (kubernetes-sigs/iptables-wrappers) does: the back end that holds more
rules, nf_tables on a tie; one whose tools fail (no kernel support) is never picked.
``$UNDERTOW_IPTABLES`` (``nft`` or ``legacy``) overrides the choice.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping

from undertow.kube.agent.errors import AgentError
from undertow.kube.agent.netfilter import LOCK_WAIT_S

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
    """The iptables command to use here, with ``-w LOCK_WAIT_S``: it waits for the xtables
    lock, but not for ever."""
    backend = choose_backend({name: counter(binary) for name, binary in BACKENDS.items()},
                             env.get(BACKEND_ENV))
    return (BACKENDS[backend], "-w", str(LOCK_WAIT_S))
