"""Where a cluster runs and how faults reach it: local child processes or Kubernetes.

``base.Platform`` is the interface the runner and the fault units use; ``local.LocalPlatform``
runs minibroker as child processes on this machine.
"""

from undertow.platform.base import CLIENT, Link, Platform, PlatformError, wait_for

__all__ = ["CLIENT", "Link", "Platform", "PlatformError", "wait_for"]
