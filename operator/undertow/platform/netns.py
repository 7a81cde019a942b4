"""Network namespaces and iptables: partitions that drop real packets (root only).

Each node gets its own network namespace with a veth pair to a bridge in the root
namespace, and an address in a private /24 used by nothing else on the host; the bridge
holds the subnet's first address, which is where the clients (the runner) connect from.
Blocking ``A -> B`` adds one iptables DROP rule inside a node's namespace: on B's INPUT for
packets from A, or, when B is the clients' side, on A's OUTPUT (a node never opens
connections to clients, so the sender never sees the EPERM such a rule gives connect()).
Deleting the namespaces removes every rule with them; the guardian does that if the
runner dies.

Delaying ``A -> B`` sends the same packets to an NFQUEUE instead (``nfqueue_delay``): a
delayer process in that namespace holds each one for its drawn delay. DROP rules are
inserted first in their chain, so a partition of a delayed link drops its packets. The
guardian kills the delayers with the namespaces' processes; a dead delayer's queue passes
its packets at once (``--queue-bypass``).
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import json
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from undertow.platform.base import CLIENT, Link, PlatformError
from undertow.platform.link_delay import LinkDelay
from undertow.platform.nfqueue_delay import Delayer, DelayerError
from undertow.platform.procfs import proc_stat

if TYPE_CHECKING:
    from undertow.platform.guardian import Guardian

_HOST_OFFSET = 10  # node k gets the subnet's address 10 + k
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


@functools.cache
def unavailable_reason() -> str | None:
    """Why namespace mode cannot run here, or None when it can (probed once per process)."""
    if os.geteuid() != 0:
        return "--network netns needs root (network namespaces and iptables)"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"--network netns needs {tool!r}: apt-get install -y {package}"
    probe = f"undertow-probe-{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-w", "-S")
    except PlatformError as exc:
        return f"--network netns cannot work here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return None


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PlatformError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    used = []
    for entry in json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all") or "[]"):
        if entry.get("dst", "default") != "default":
            used.append(ipaddress.ip_network(entry["dst"], strict=False))
    for link in json.loads(_run("ip", "-j", "-4", "addr") or "[]"):
        for addr in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}",
                                             strict=False))
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _networks_in_use()
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{random.randrange(200, 255)}.{random.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise PlatformError("no free private /24 under 10.200.0.0/13 for the node namespaces")


class NetnsNetwork:
    """One namespace per node on a private bridge; links blocked with iptables DROP."""

    def __init__(self, nodes: Sequence[str], guardian: Guardian | None = None,
                 run_id: str | None = None) -> None:
        if CLIENT in nodes:
            raise PlatformError(f"{CLIENT!r} is the clients' side, not a node")
        self.nodes = list(nodes)
        self.run_id = run_id or secrets.token_hex(2)
        self.bridge = f"ut{self.run_id}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self._guardian = guardian
        self._namespaces: list[str] = []
        self._veths: list[str] = []
        self._bridge_created = False
        self._rules: set[tuple[str, str, str, str]] = set()
        self._queues = itertools.count(1)
        self._delayers: dict[Link, tuple[list[str], Delayer]] = {}
        """Each delayed link's NFQUEUE rule (iptables arguments) and delayer process."""

    def namespace(self, node: str) -> str:
        return f"undertow-{self.run_id}-{node}"

    def address(self, endpoint: str) -> str:
        """The IPv4 address of a node, or of the clients for ``CLIENT``."""
        if self.subnet is None:
            raise PlatformError("network namespaces are not set up")
        if endpoint == CLIENT:
            return str(self.subnet.network_address + 1)
        return str(self.subnet.network_address + _HOST_OFFSET + self.nodes.index(endpoint))

    def setup(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise PlatformError(reason)
        self._check_bridge_forwarding()
        self.subnet = _free_subnet()
        try:
            self._track("link", self.bridge)
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._bridge_created = True
            _run("ip", "addr", "add", f"{self.address(CLIENT)}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for index, node in enumerate(self.nodes):
                self._add_node(index, node)
        except BaseException:
            self.teardown()
            raise

    def _add_node(self, index: int, node: str) -> None:
        ns = self.namespace(node)
        host_end, node_end = f"ut{self.run_id}h{index}", f"ut{self.run_id}n{index}"
        self._track("netns", ns)
        _run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        # Created with its peer already inside the namespace, so no half-made pair is left
        # in the root namespace. Teardown deletes the host end explicitly: a deleted
        # namespace lingers (and keeps its veth) while sockets in it wind down.
        self._track("link", host_end)
        _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end,
             "netns", ns)
        self._veths.append(host_end)
        _run("ip", "link", "set", host_end, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", node_end)
        _run("ip", "-n", ns, "link", "set", node_end, "up")

    def _match(self, link: Link) -> tuple[str, str, str, str]:
        """Where ``link``'s packets are caught: the namespace, chain and address match."""
        if link.dst != CLIENT:
            return self.namespace(link.dst), "INPUT", "-s", self.address(link.src)
        return self.namespace(link.src), "OUTPUT", "-d", self.address(link.dst)

    def set_blocked(self, link: Link, blocked: bool) -> None:
        """Drop (or pass again) the packets ``link.src`` sends to ``link.dst``."""
        rule = self._match(link)
        if blocked == (rule in self._rules):
            return
        ns, chain, flag, addr = rule
        _run("ip", "netns", "exec", ns, "iptables", "-w", "-I" if blocked else "-D", chain,
             flag, f"{addr}/32", "-j", "DROP")
        if blocked:
            self._rules.add(rule)
        else:
            self._rules.discard(rule)

    def set_delay(self, link: Link, delay: LinkDelay | None) -> None:
        """Delay the packets ``link.src`` sends to ``link.dst`` (None: no more), through an
        NFQUEUE and a delayer process in the namespace that catches them."""
        self._stop_delayer(link)
        if delay is None:
            return
        ns, chain, flag, addr = self._match(link)
        queue = next(self._queues)
        try:
            delayer = Delayer.start(queue, delay, ("ip", "netns", "exec", ns),
                                    new_session=True)
        except DelayerError as exc:
            raise PlatformError(f"the delayer of {link}: {exc}") from None
        if self._guardian is not None:
            stat = proc_stat(delayer.pid)
            self._guardian.track("process", delayer.pid, stat[1] if stat else None)
        rule = [chain, flag, f"{addr}/32", "-j", "NFQUEUE", "--queue-num", str(queue),
                "--queue-bypass"]
        try:
            _run("ip", "netns", "exec", ns, "iptables", "-w", "-A", *rule)
        except BaseException:
            self._end(delayer)
            raise
        self._delayers[link] = ([ns, *rule], delayer)

    def _stop_delayer(self, link: Link) -> None:
        if link not in self._delayers:
            return
        (ns, *rule), delayer = self._delayers.pop(link)
        try:
            _run("ip", "netns", "exec", ns, "iptables", "-w", "-D", *rule)
        finally:
            self._end(delayer)

    def _end(self, delayer: Delayer) -> None:
        delayer.stop()
        self._forget("process", delayer.pid)

    def rules(self, node: str) -> str:
        """``iptables -S`` inside the node's namespace."""
        return _run("ip", "netns", "exec", self.namespace(node), "iptables", "-w", "-S")

    def teardown(self) -> None:
        """Stop the delayers; delete the veths, the namespaces (and with them every rule)
        and the bridge."""
        errors = []
        for link in list(self._delayers):
            try:
                self._stop_delayer(link)
            except PlatformError as exc:
                errors.append(str(exc))
        for host_end in reversed(self._veths):
            try:
                _run("ip", "link", "delete", host_end)
                self._forget("link", host_end)
            except PlatformError as exc:
                errors.append(str(exc))
        self._veths.clear()
        for ns in reversed(self._namespaces):
            try:
                _run("ip", "netns", "delete", ns)
                self._forget("netns", ns)
            except PlatformError as exc:
                errors.append(str(exc))
        self._namespaces.clear()
        self._rules.clear()
        if self._bridge_created:
            try:
                _run("ip", "link", "delete", self.bridge)
                self._forget("link", self.bridge)
                self._bridge_created = False
            except PlatformError as exc:
                errors.append(str(exc))
        if errors:
            raise PlatformError("; ".join(errors))

    @staticmethod
    def _check_bridge_forwarding() -> None:
        """With br_netfilter, bridged packets cross the host's FORWARD chain: it must pass them."""
        try:
            if _BRIDGE_NF.read_text().strip() != "1":
                return
        except OSError:
            return
        if "-P FORWARD DROP" in _run("iptables", "-w", "-S", "FORWARD"):
            raise PlatformError("the host's iptables FORWARD policy is DROP and br_netfilter is "
                                "on, so bridged namespace traffic would be dropped; run with "
                                "--network proxy or set net.bridge.bridge-nf-call-iptables=0")

    def _track(self, kind: str, name: str) -> None:
        if self._guardian is not None:
            self._guardian.track(kind, name)

    def _forget(self, kind: str, name: str) -> None:
        if self._guardian is not None:
            self._guardian.forget(kind, name)
