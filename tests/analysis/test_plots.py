"""The timeline: its four panels render every kind of input, legibly at report.html's size."""

from __future__ import annotations

from matplotlib.text import Text

from undertow_analysis import plots
from undertow_analysis.grid import Grid
from undertow_analysis.report import Series


def busy_run() -> dict:
    """40 s: steady acknowledgements, an outage from 10 s to 14 s whose backlog is
    acknowledged at once, failures and timeouts, a kill of the leader, a split partition, a
    consumer cut off, elections of every kind, fences, truncations, a group rebalance and a
    coordinator move, and two partitions' ISR."""
    grid = Grid(1000.0, 0.1, 0.1)
    buckets = [(b, 50, 50, 0, 0) for b in range(0, 100)]
    buckets += [(b, 50, 0, 2, 1) for b in range(100, 140)]
    buckets += [(140, 50, 2000, 0, 0)] + [(b, 50, 50, 0, 0) for b in range(141, 400)]
    cells = [(b, 60, "acked", 50) for b in range(0, 100)]
    cells += [(b, 150, "failed", 2) for b in range(100, 140)]
    cells += [(b, 200, "indeterminate", 1) for b in range(100, 140)]
    cells += [(140, 180, "acked", 2000)] + [(b, 62, "acked", 50) for b in range(141, 400)]
    faults = [
        {"id": 1, "fault": "kill", "target": "broker-1", "start_s": 10.0, "healed_s": 14.0,
         "end_s": 14.6, "recovered": True},
        {"id": 2, "fault": "partition", "target": "broker-0|broker-2,controller",
         "start_s": 20.0, "healed_s": 25.0, "end_s": 25.1, "recovered": True},
        {"id": 3, "fault": "partition", "target": "client-c1", "start_s": 22.0,
         "healed_s": None, "end_s": 40.0, "recovered": False},
        {"id": 4, "fault": "pause", "target": "broker-2->broker-0", "start_s": 30.0,
         "healed_s": 31.0, "end_s": 31.2, "recovered": True},
    ]
    events = [
        {"type": "broker_fenced", "broker": 1, "t_s": 13.0},
        {"type": "leader_election", "kind": "clean", "leader": 2, "t_s": 13.0},
        {"type": "leader_election", "kind": "unclean", "leader": 0, "t_s": 21.0},
        {"type": "leader_election", "kind": "offline", "leader": -1, "t_s": 22.0},
        {"type": "leader_election", "kind": "preferred", "leader": 1, "t_s": 35.0},
        {"type": "leader_election", "kind": "elr", "leader": 1, "t_s": 16.0},
        {"type": "leader_election", "kind": "last_known_leader", "leader": 2, "t_s": 26.0},
        {"type": "truncation", "broker": 1, "t_s": 14.7},
        {"type": "coordinator_load", "broker": 2, "t_s": 13.1},
        {"type": "group_rebalance", "group": "g", "t_s": 22.5},
        {"type": "group_stable", "group": "g", "generation": 2, "t_s": 29.0},
        {"type": "group_rebalance", "group": "g", "t_s": 38.0},
    ]
    # t-1's last stable offset held below its HW from 30 s to 36 s (hatched) and for 3 s at
    # 5 s, as a transaction open while it writes (not hatched).
    isr = [{"topic": "t", "partition": p, "bucket": b, "isr": 2 if 10 <= b < 15 else 3,
            "elr": 1 if p == 0 and 10 <= b < 15 else 0,
            "offline": p == 1 and b == 22,
            "lso_held": p == 1 and (30 <= b < 36 or 5 <= b < 8)}
           for p in (0, 1) for b in range(40)]
    unavailable = [{"kind": "no_acks", "start_s": 10.0, "duration_s": 4.0},
                   {"kind": "offline", "start_s": 22.0, "duration_s": 1.0}]
    return {"series": series_of(grid, buckets, cells), "t0": 1000.0, "t_end": 1040.0,
            "clock": {"zero": 1000.0, "zero_is": "the workload's start",
                      "zero_utc": "1970-01-01T00:16:40.000Z"},
            "isr": isr, "isr_width": 1.0, "faults": faults, "unavailable": unavailable,
            "lost_t": [9.5, 9.6], "events": events, "brokers": 3}


def series_of(grid: Grid, buckets: list, cells: list) -> Series:
    return Series(grid, sorted(buckets), sorted(cells))


def test_the_timeline_renders_every_panel_legibly():
    fig = plots.timeline_figure(**busy_run())
    fig.canvas.draw()
    rate, latency, lanes, isr = fig.axes
    texts = [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]
    small = {t.get_text(): t.get_fontsize() for t in texts if t.get_fontsize() < plots.MIN_FONT}
    assert small == {}
    # Shown at most FIGURE_WIDTH * DPI pixels wide, as the PNG is.
    assert fig.get_figwidth() * fig.dpi <= 1150
    # The outage's length is written on it; the lanes are the nodes, the clients and the group.
    assert "4.0 s" in {t.get_text() for t in rate.texts}
    assert [t.get_text() for t in lanes.get_yticklabels()] == [
        "controller", "broker-0", "broker-1", "broker-2", "clients", "group"]
    # A label is written in its bar only where it fits: not in the 1 s pause.
    assert {t.get_text() for t in lanes.texts} == {"kill #1", "partition #2", "partition #3 c1"}
    # Counts are integers: the ISR axis has no half replicas.
    assert all(float(v).is_integer() for v in isr.get_yticks())
    assert latency.get_yscale() == "log"
    assert "the workload's start (t = 0 at 00:16:40 UTC)" in isr.get_xlabel()
    legends = {t.get_text() for ax in fig.axes if ax.get_legend()
               for t in ax.get_legend().get_texts()}
    assert {"acknowledged", "failed", "indeterminate", "p50 of acknowledged",
            "healed → recovered", "broker fenced", "log truncated",
            "elected leader (unclean)", "election found no leader", "no leader",
            "elected leader (ELR, KIP-966)", "elected leader (last known leader, KIP-966)",
            "ELR size (KIP-966)",
            "last stable offset held below the HW (read_committed readers stopped)"} <= legends
    hatched = [c for c in isr.collections if c.get_hatch() == "//"]
    assert [[tuple(v) for v in p.vertices[:3]] for c in hatched for p in c.get_paths()] == [
        [(30.0, 0.0), (30.0, 1.0), (36.0, 1.0)]]
    # KIP-966's elections have colours of their own; t-0's ELR is drawn dashed in its colour.
    assert {plots.ELECTION_COLOURS["elr"], plots.ELECTION_COLOURS["last_known_leader"]} <= {
        line.get_color() for line in lanes.get_lines()}
    assert isr.get_title(loc="left") == "ISR and ELR size per partition"
    # t-0's ISR, its ELR (1 from 10 s to 15 s, dashed in its colour), then t-1's ISR alone.
    t0_isr, t0_elr, _ = isr.get_lines()
    assert (t0_elr.get_linestyle(), t0_elr.get_color()) == ("--", t0_isr.get_color())
    assert [round(y) for y in t0_elr.get_ydata()[9:16]] == [0, 1, 1, 1, 1, 1, 0]
    assert plots.timeline_png(**busy_run())[:4] == b"\x89PNG"


def test_a_run_without_sends_or_faults_still_renders():
    empty = busy_run() | {"series": series_of(Grid(0.0, 0.1, 0.1), [], []), "faults": [],
                          "events": [], "isr": [], "unavailable": [], "lost_t": [],
                          "brokers": None, "clock": None}
    fig = plots.timeline_figure(**empty)
    assert [t.get_text() for t in fig.axes[2].get_yticklabels()] == ["controller"]
    assert plots.timeline_png(**empty)[:4] == b"\x89PNG"


def test_fault_nodes_are_the_nodes_cut_off():
    assert plots.fault_nodes("broker-1") == ["broker-1"]
    assert plots.fault_nodes("broker-0->broker-1,broker-2") == ["broker-0"]
    assert plots.fault_nodes("broker-0|broker-1,broker-2") == ["broker-0"]
    assert plots.fault_nodes("broker-0,broker-1|controller") == ["controller"]
