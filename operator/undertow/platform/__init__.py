"""Where a cluster runs and how faults reach it: local child processes or Kubernetes.

``base.Platform`` is the interface the runner and the fault units use; ``local.LocalPlatform``
runs minibroker as child processes on this machine.

The names below are imported from ``base`` on first use: a link delayer
(``nfqueue_delay``, a process for each delayed link, in the fault agent's container too)
needs only ``link_delay`` from here, and ``base`` with what it imports made each
delayer take 12 MB of its container's memory instead of 7, which a Kubernetes pod's fault
agent pays once for each peer of a delayed node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from undertow.platform.base import CLIENT, Link, Platform, PlatformError, wait_for

__all__ = ["CLIENT", "Link", "Platform", "PlatformError", "wait_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from undertow.platform import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
