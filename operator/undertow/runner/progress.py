"""The live progress display of ``undertow run`` (rich): elapsed of total, acks per second,
errors, active faults, and leader and ISR (and ELR, KIP-966, when any) per partition."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


def render(update: dict[str, Any]) -> Group:
    parts: list[Any] = []
    phase = update.get("phase", "")
    if phase == "faults":
        counts = update["counts"]
        errors = ", ".join(f"{k}={v}" for k, v in sorted(update["errors"].items())) or "none"
        faults = ", ".join(update["active_faults"]) or "none"
        parts.append(Text.assemble(
            (f"{update['elapsed']:5.1f}s / {update['total']:.0f}s  ", "bold"),
            f"acked {counts['ok']} ({update['acks_per_second']:.0f}/s)  "
            f"failed {counts['fail']}  indeterminate {counts['info']}  errors: {errors}\n",
            ("active faults: ", "bold"), (faults, "red" if update["active_faults"] else "green")))
    else:
        parts.append(Text(f"{phase}...", style="bold"))
    partitions = update.get("partitions") or []
    # KIP-966's eligible leader replicas get a column only while some partition has them.
    with_elr = any(p.get("elr") for p in partitions)
    table = Table("partition", "leader", "epoch", "ISR", *(("ELR",) if with_elr else ()),
                  "HW", "LEO per broker", box=None)
    for p in partitions:
        leos = " ".join(f"{b}:{o}" for b, o in p["log_end_offsets"].items())
        leader = str(p["leader"]) if p["leader"] >= 0 else "[red]offline[/red]"
        if p.get("leader_recovery_state") == "RECOVERING":  # KIP-704, after an unclean election
            leader += " [yellow](recovering)[/yellow]"
        elr = (",".join(map(str, p.get("elr") or [])) or "-",) if with_elr else ()
        table.add_row(f"{p['topic']}-{p['partition']}", leader, str(p["leader_epoch"]),
                      ",".join(map(str, p["isr"])), *elr, str(p["high_watermark"]), leos)
    parts.append(table)
    return Group(*parts)


def line(update: dict[str, Any]) -> str:
    """The same facts on one plain line, for logs and pipes."""
    if update.get("phase") != "faults":
        return f"[{update.get('phase')}]"
    counts = update["counts"]
    partitions = " ".join(
        f"{p['topic']}-{p['partition']}:L{p['leader']}/isr={','.join(map(str, p['isr']))}"
        + (f"/elr={','.join(map(str, p['elr']))}" if p.get("elr") else "")
        for p in update.get("partitions") or [])
    return (f"[{update['elapsed']:5.1f}/{update['total']:.0f}s] acked={counts['ok']} "
            f"({update['acks_per_second']:.0f}/s) failed={counts['fail']} "
            f"info={counts['info']} faults={','.join(update['active_faults']) or '-'} "
            f"{partitions}")


class Progress:
    """Callable the runner feeds: a live panel on a terminal, a line every few seconds
    otherwise, nothing when disabled."""

    PLAIN_EVERY_S = 5.0

    def __init__(self, enabled: bool, live: bool) -> None:
        self._enabled = enabled
        self._live = Live(Text("starting..."), refresh_per_second=4, transient=False) \
            if enabled and live else None
        self._last_plain = 0.0

    def __enter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def __call__(self, update: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(render(update))
        elif self._enabled and (update.get("phase") != "faults"
                                or time.monotonic() - self._last_plain >= self.PLAIN_EVERY_S):
            self._last_plain = time.monotonic()
            print(line(update), flush=True)
