"""The report's explanations: loss incidents and truncations as plain data with one sentence
each, built from the rows `attribution` and `offsets` compute. Plain Python over a handful of
rows.

A sentence names, in Kafka's terms, who held the records (or the committed offsets), what
removed them and why: the election (its kind, the ISR it chose from, the fault active then),
the power loss or the truncations. An incident no event explains says so loudly: it means a
bug in the broker or in the harness, not a property of the configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from undertow_analysis import late_requests
from undertow_analysis.report import fault_intervals, fault_label, shortfall_text
from undertow_history.checker import MECHANISMS

MAX_INCIDENTS = 100
"""Incidents kept in report.json (unexplained ones first, then in the order of the elections
that dropped them); the count says how many there were."""

_REMOVAL_REASONS = {
    "offset_for_leader_epoch": "on becoming its follower (OffsetForLeaderEpoch, KIP-101)",
    "high_watermark": "to their high watermark on becoming its follower (pre-KIP-101)",
    "out_of_range": "when their fetch offset fell outside its log",
    "log_recovery": "when a power loss cut their logs",
}
_TRUNCATION_REASONS = {
    "offset_for_leader_epoch": "to the end of the leader's epoch (OffsetForLeaderEpoch)",
    "high_watermark": "to its high watermark (pre-KIP-101 rule)",
    "out_of_range": "to the leader's log end (fetch offset out of range)",
    "log_recovery": "at restart: the power loss took its unflushed tail",
}


def _brokers(ids: list[int]) -> str:
    if not ids:
        return ""
    names = [str(i) for i in ids]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"broker{'s' if len(names) > 1 else ''} {joined}"


def _records(n: int, what: str, fate: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''} {fate}" if n else ""


def _fault_at(t: float | None, faults: list[dict[str, Any]],
              intervals: list[tuple[float, float, str]]) -> str | None:
    """The faults active at `t` ("during ..."), else the last one that ended before it
    ("after ..."): the fault that led to an election is often healed by the time the
    controller holds it (a broker's restart is the recovery of its kill)."""
    if t is None:
        return None
    active = next((label for start, end, label in intervals if start <= t < end), None)
    if active:
        return f"during {active}"
    ended = [f for f in faults if f["end"] <= t]
    if ended:
        return f"after {fault_label(max(ended, key=lambda f: f['end']))}"
    return None


def _election_t(inc: dict[str, Any]) -> float | None:
    """When the controller elected the dropping leader (else when it became leader; None
    when no election dropped the records)."""
    election = inc.get("election") or {}
    return election["t"] if election.get("t") is not None else inc["drop_t"]


KIP_966_ELECTIONS = {
    "elr": "from the eligible leader replicas (KIP-966) with an empty ISR",
    "last_known_leader": "as the partition's last known leader once unfenced, with the ISR "
                         "and the ELR empty (KIP-966, Kafka 4.1+)",
}
"""How the controller chose the leader in KIP-966's elections (events.jsonl's `kind`), in
the words that follow "elected broker N"."""


def _recovery(inc: dict[str, Any], t0: float) -> str:
    """KIP-704's window after an unclean election, as "RECOVERING, KIP-704, until 7.2 s,
    when its ISR first grew" ("" when the history has no `leader_recovery` events for it)."""
    recovery = inc.get("recovery") or {}
    if recovery.get("began") is None:
        return ""
    if recovery.get("ended") is None:
        return "RECOVERING, KIP-704, to the end of the run: its ISR never grew"
    return f"RECOVERING, KIP-704, until {recovery['ended'] - t0:.1f} s, when its ISR first grew"


def _election(inc: dict[str, Any], t0: float) -> str:
    """What the controller did at the dropping election, in words."""
    election = inc.get("election") or {}
    kind, reason = election.get("kind"), election.get("reason")
    new = f"broker {inc['dropper']}"
    fault = inc.get("fault")
    at = f"at {_election_t(inc) - t0:.1f} s" + (f", {fault}," if fault else "")
    isr = election.get("isr")
    isr_text = f" {{{', '.join(map(str, isr))}}}" if isr else ""
    previous = election.get("previous_leader")
    # The leader the controller removed, when the election says which (-1: there was none).
    removed = previous if previous is not None and previous >= 0 else None
    if kind in KIP_966_ELECTIONS:
        chosen = f"elected {new} {KIP_966_ELECTIONS[kind]}"
        if reason == "leader_fenced" and removed is not None:
            what = f"{at} the controller fenced broker {removed} and {chosen}"
        elif reason == "unclean_shutdown" and removed is not None:
            what = (f"{at} the controller removed broker {removed}, registered again after an "
                    f"unclean shutdown, from the ISR and the ELR and {chosen}")
        elif reason == "broker_unfenced" and kind == "elr":
            what = f"{at} the controller {chosen} as it returned"
        else:
            what = f"{at} the controller {chosen}"
    elif kind == "preferred":
        what = f"{at} the controller moved leadership back to the preferred replica, {new}"
    elif kind == "unclean":
        what = (f"{at} the controller elected {new} although it was not in the ISR{isr_text} "
                f"(an unclean election)")
    elif reason == "leader_fenced" and previous is not None:
        what = (f"{at} the controller fenced broker {previous} and elected "
                f"{new} from the ISR{isr_text}")
    elif reason == "unclean_shutdown" and removed is not None:
        what = (f"{at} the controller removed broker {removed}, registered again after an "
                f"unclean shutdown, from the ISR and elected {new} from the ISR{isr_text}")
    elif reason == "broker_unfenced":
        what = f"{at} the controller elected {new} from the ISR{isr_text} as it returned"
    else:
        what = f"{at} {new} became leader in epoch {inc['drop_epoch']}"
    recovering = _recovery(inc, t0) if kind in ("unclean", "last_known_leader") else ""
    return f"{what}, whose log ended at {inc['dropper_end']}" + (
        f" ({recovering})" if recovering else "")


def _span(inc: dict[str, Any], t0: float) -> str:
    """When the incident's records were acknowledged (or read), as " at 5.1 s" or " between
    5.1 and 5.4 s"; "" without their times."""
    if inc.get("first_t") is None or inc.get("last_t") is None:
        return ""
    first, last = f"{inc['first_t'] - t0:.1f}", f"{inc['last_t'] - t0:.1f}"
    return f" at {first} s" if first == last else f" between {first} and {last} s"


def incident_sentence(inc: dict[str, Any], t0: float) -> str:
    """One incident in one sentence (see the module docstring)."""
    where = f"{inc['topic']}-{inc['partition']}"
    first, last = inc["first_offset"], inc["last_offset"]
    offsets = f"offset {first}" if first == last else f"offsets {first}-{last}"
    acked = inc["lost"] + inc["misplaced"]
    read_first = inc["phantom_read"] - inc["phantom_only"]
    counts = [_records(inc["lost"], "acknowledged record", "lost"),
              _records(inc["misplaced"], "acknowledged record", "misplaced"),
              f"{read_first} of them read by a consumer before" if read_first else "",
              _records(inc["phantom_only"], "unacknowledged record",
                       "read by a consumer, then gone"),
              _records(inc.get("skipped", 0), "record", "skipped by the consumer group, "
                       "written there after its committed offset had passed")]
    listed = "; ".join(c for c in counts if c)
    if acked or inc["phantom_read"]:
        subject = f"records at {offsets} of {where} ({listed})"
        held = "were acknowledged by" if acked else "were read from"
    else:  # skipped only: the records the election removed were others, read and committed
        subject = f"{offsets} of {where} ({listed})"
        held = "held records the consumer group had committed past on"
    holder = (f"broker {inc['holder']} in epoch {inc['holder_epoch']}"
              if inc.get("holder") is not None else "a leader no event names")
    mechanism = inc["mechanism"]
    if mechanism == "unexplained":
        short = inc.get("drain_short")
        if short:
            return (f"UNEXPLAINED: {subject} {held} {holder}, and no election or truncation "
                    f"in events.jsonl removed them; the drain did not read them "
                    f"({shortfall_text(short)}): the cluster did not heal, and they may "
                    f"still be on a broker.")
        return (f"UNEXPLAINED: {subject} {held} {holder}, and no election or truncation in "
                f"events.jsonl removed them: this is a bug in the broker or in the harness, "
                f"not a property of the configuration.")
    if mechanism == "hanging_transaction":
        return (f"{subject} {held} {holder}, and are still on the brokers, but behind a "
                f"transaction nothing ended: {where}'s last stable offset stayed at "
                f"{inc['hanging_lso']}, its first batch, and read_committed consumers never "
                f"read past it (no coordinator ended the transaction with a marker).")
    cause = inc.get("cause") or {}
    if mechanism == "acks1_before_replication":
        why = f" with acks=1, before broker {inc['dropper']} had fetched them"
        previous = (inc.get("election") or {}).get("previous_leader")
        if previous is not None and previous >= 0 and previous != inc["holder"]:
            # A leader between the two (a preferred election, say) had fetched them: it
            # became leader after they were acknowledged with a log past them, else its
            # election would be the one that dropped them (attribution's rule).
            why += f" (broker {previous} had, and led after broker {inc['holder']})"
    elif mechanism == "power_loss":
        why = (f"; broker {inc['dropper']} lost them to a power loss (its log came back ending "
               f"at {cause.get('to_offset')} instead of {cause.get('from_offset')}: they were "
               f"never fsynced)")
    elif mechanism == "high_watermark_truncation":
        why = (f"; at {cause['t'] - t0:.1f} s broker {inc['dropper']} truncated its log to its "
               f"high watermark, {cause.get('to_offset')}, on becoming a follower (the "
               f"pre-KIP-101 rule), below records every ISR member had")
    elif mechanism == "deposed_leader":
        why = (f"{_span(inc, t0)}, after the controller had replaced it and before it learned "
               f"of epoch {inc['drop_epoch']} (a deposed leader: a broker learns of a new "
               f"epoch only from the metadata log)")
    elif mechanism == "disk_lost":
        why = (f"; broker {inc['dropper']}, an ISR member that had them, came back from a "
               f"restart without them (its disk was lost)")
    elif mechanism == "unclean_election" and (inc.get("election") or {}).get(
            "kind") == "last_known_leader":  # Kafka counts it as unclean: say why it is here
        why = f"; broker {inc['dropper']} never had them"
    else:
        why = ""
    removal = ""
    if inc.get("removals"):
        how = _REMOVAL_REASONS.get(inc.get("removal_reason"), "")
        removal = f", and {_brokers(inc['removals'])} truncated them {how}".rstrip()
    return f"{subject} {held} {holder}{why}; {_election(inc, t0)}{removal}."


def truncation_sentence(cut: dict[str, Any], t0: float,
                        group: dict[str, Any] | None = None) -> str:
    """One truncation: who cut what, why, and whether acknowledged records were among it (or,
    on the consumer `group`'s __consumer_offsets partition, its commits)."""
    how = _TRUNCATION_REASONS.get(cut["reason"], cut["reason"] or "")
    text = (f"at {cut['t'] - t0:.1f} s broker {cut['broker']} truncated "
            f"{cut['topic']}-{cut['partition']} from {cut['from_offset']} to {cut['to_offset']} "
            f"{how}: ")
    if group and (cut["topic"], cut["partition"]) == (group["offsets_topic"],
                                                      group["offsets_partition"]):
        return text + (f"those offsets held commits of the consumer group {group['group_id']}; "
                       f"a committed offset it took is a loss incident.")
    cut_n = cut["from_offset"] - cut["to_offset"]
    records = f"{cut_n:,} record{'s' if cut_n != 1 else ''}"
    if not cut["acked"]:
        return text + (f"it cut {records}, none of them acknowledged (whatever was "
                       f"acknowledged at those offsets was written there by a later leader "
                       f"and is still there).")
    fates = []
    if cut["lost"]:
        fates.append(f"{cut['lost']:,} lost for good (no replica kept them)")
    if cut["lost_before"]:
        fates.append(f"{cut['lost_before']:,} lost, counted at an earlier truncation that cut "
                     f"them too")
    if cut["kept"]:
        fates.append(f"{cut['kept']:,} kept at other offsets (the producer's retry or "
                     f"another replica)")
    return text + (f"it cut {records}, {cut['acked']:,} of them acknowledged: "
                   + "; ".join(fates) + ".")


_IDEMPOTENCE = ("without enable.idempotence the broker cannot tell a retry from a new "
               "record (KIP-98)")


def duplicate_sentence(group: dict[str, Any], t0: float) -> str:
    """One duplicate group (`attribution.duplicate_groups`) in one sentence."""
    n = group["duplicates"]
    one = n == 1
    were, their, them = ("was", "its send", "it") if one else ("were", "their sends", "them")
    first, last = group["first_offset"], group["last_offset"]
    offsets = f"offset {first}" if first == last else f"offsets {first}-{last}"
    subject = (f"{n} record{'' if one else 's'} of {group['topic']}-{group['partition']} "
               f"acknowledged at {offsets} {were} written twice")
    holder = (f"broker {group['holder']} led epoch {group['holder_epoch']}"
              if group.get("holder") is not None else "a leader no event names led")
    change = (f"broker {group['new_leader']} became leader in epoch {group['new_epoch']} at "
              f"{group['change_t'] - t0:.1f} s before the acknowledgement"
              if group.get("change_t") is not None else None)
    if group["mechanism"] == "unexplained":
        during = f"; {change}" if change else ""
        return (f"UNEXPLAINED: {subject} although the producer was idempotent (KIP-98), whose "
                f"retries the leader recognises by producer id and sequence number ({their} "
                f"began while {holder}{during}): this is a bug in the broker or in the "
                f"harness.")
    if group["mechanism"] == "retry_across_election":
        return (f"{subject}: {their} began while {holder}, {change}, and the producer "
                f"retried {them} there; the first attempt had been written and kept, its "
                f"answer never came, and {_IDEMPOTENCE}.")
    return (f"{subject} while {holder}: the producer retried a request whose answer came too "
            f"late (request.timeout.ms), and {_IDEMPOTENCE}.")


WITHOUT_EVENTS: dict[str, Any] = {
    "events": False, "incident_count": 0, "record_incidents": 0, "unexplained": 0,
    "incidents": [],
    "truncations": [], "truncations_cut_acked": 0, "truncations_lost": 0, "duplicates": [],
    "late_requests": [], "late_request_count": 0, "late_requests_decided": 0}
"""The sections of a history without events.jsonl: nothing explained, nothing claimed."""


def _short_drain(inc: dict[str, Any], drain_short: Sequence[dict[str, Any]]
                 ) -> dict[str, Any] | None:
    """The drain's shortfall on the incident's partition when the drain stopped at or
    before the incident's first offset (None otherwise)."""
    return next((s for s in drain_short
                 if (s["topic"], s["partition"]) == (inc["topic"], inc["partition"])
                 and (s["end"] is None or s["read_to"] <= inc["first_offset"])), None)


def _returned(offset: int | None) -> str:
    return "no committed offset" if offset is None else str(offset)


def commit_sentence(inc: dict[str, Any], t0: float) -> str:
    """One incident of committed offsets lost (`offsets.commit_losses`) in one sentence."""
    where, first, n = inc["offsets_partition"], inc["examples"][0], inc["commits"]
    tp = f"{first['topic']}-{first['partition']}"
    holder = (f"broker {inc['holder']} (coordinator, leader of {where} in epoch "
              f"{inc['holder_epoch']})" if inc.get("holder") is not None
              else f"a coordinator no event names (no leader of {where} before it)")
    acked = f"acknowledged at {first['t_commit'] - t0:.1f} s by {holder}"
    fetched = (f"at {first['t_fetch'] - t0:.1f} s the coordinator returned "
               f"{_returned(first['returned'])}")
    if n == 1:
        subject, it = (f"the committed offset {first['committed']} of group {inc['group']} "
                       f"for {tp}, {acked}, was lost"), "it"
    else:
        subject, it = (f"{n} committed offsets of group {inc['group']}, the first "
                       f"{first['committed']} for {tp} {acked}, were lost"), "them"
        fetched += f" for {tp}"
    if inc["mechanism"] == "unexplained":
        return (f"UNEXPLAINED: {subject} ({fetched}), and no power loss, truncation or unclean "
                f"election of {where} in events.jsonl removed {it}: this is a bug in the "
                f"broker or in the harness, not a property of the configuration.")
    cause = inc["cause"]
    when = f"{cause['t'] - t0:.1f} s" + (f", {inc['fault']}," if inc.get("fault") else "")
    why = {
        "power_loss": f"broker {cause['broker']} lost power at {when} before flushing {it}, "
                      f"and came back with {where} cut to offset {cause['to_offset']}",
        "disk_lost": f"broker {cause['broker']} came back at {when} with {where} empty (its "
                     f"disk was lost)",
        "unclean_election": f"at {when} the controller elected broker {cause['leader']} "
                            f"leader of {where} although it was not in the ISR "
                            f"{{{', '.join(map(str, cause.get('isr') or []))}}} (an unclean "
                            f"election)",
        "high_watermark_truncation": f"at {when} broker {cause['broker']} truncated {where} "
                                     f"from {cause['from_offset']} to its high watermark, "
                                     f"{cause['to_offset']}, on becoming a follower (the "
                                     f"pre-KIP-101 rule)",
    }.get(inc["mechanism"], f"at {when} broker {cause['broker']} truncated {where} from "
                            f"{cause['from_offset']} to {cause['to_offset']} "
                            f"{_TRUNCATION_REASONS.get(cause['reason'], cause['reason'])}")
    if inc["mechanism"] in ("high_watermark_truncation", "coordinator_truncation") \
            and cause.get("leader") is not None:
        why = (f"at {cause['leader_t'] - t0:.1f} s broker {cause['leader']} became leader of "
               f"{where} with its log ending at {cause['leader_end']}, and {why}")
    return f"{subject}: {why}; {fetched}."


def _commit_incident(inc: dict[str, Any], group: dict[str, Any] | None,
                     faults: list[dict[str, Any]],
                     intervals: list[tuple[float, float, str]], t0: float) -> dict[str, Any]:
    """An incident of committed offsets lost, with the keys a record incident is sorted and
    numbered by (`drop_t`: its cause's time, else the first fetch; the first commit's topic,
    partition and offset)."""
    first = inc["examples"][0]
    cause_t = (inc.get("cause") or {}).get("t")
    inc = {**inc, "kind": "committed_offsets",
           "group": group["group_id"] if group else None,
           "offsets_partition": (f"{group['offsets_topic']}-{group['offsets_partition']}"
                                 if group else "__consumer_offsets (partition unknown)"),
           "mechanism_name": MECHANISMS[inc["mechanism"]],
           "fault": _fault_at(cause_t, faults, intervals),
           "drop_t": cause_t if cause_t is not None else first["t_fetch"],
           "topic": first["topic"], "partition": first["partition"],
           "first_offset": first["committed"]}
    inc["sentence"] = commit_sentence(inc, t0)
    inc["examples"] = [{**{k: v for k, v in e.items() if k not in ("t_commit", "t_fetch")},
                        "t_commit_s": round(e["t_commit"] - t0, 3),
                        "t_fetch_s": round(e["t_fetch"] - t0, 3)} for e in inc["examples"]]
    return inc


def explanations(incidents: list[dict[str, Any]], cuts: list[dict[str, Any]],
                 faults: list[dict[str, Any]], t0: float,
                 drain_short: Sequence[dict[str, Any]] = (),
                 duplicates: Sequence[dict[str, Any]] = (),
                 commits: Sequence[dict[str, Any]] = (),
                 group: dict[str, Any] | None = None,
                 late: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """report.json's `incidents`, `truncations`, `duplicates` and `late_requests` sections;
    `drain_short` are the partitions the drain did not read to their end
    (`report.drain_shortfalls`), `duplicates` the duplicate groups
    (`attribution.duplicate_groups`), `commits` the incidents of committed offsets lost
    (`offsets.commit_losses`) of the consumer `group` (meta.json's consumer_group), listed
    with the records' incidents, `late` the late EndTxn requests (`late_requests.pair`)."""
    intervals = fault_intervals(faults)
    rows = []
    for inc in incidents:
        inc = {**inc, "kind": "records", "mechanism_name": MECHANISMS[inc["mechanism"]],
               "fault": _fault_at(_election_t(inc), faults, intervals)}
        if inc["mechanism"] == "unexplained":
            inc["drain_short"] = _short_drain(inc, drain_short)
        inc["sentence"] = incident_sentence(inc, t0)
        rows.append(inc)
    rows += [_commit_incident(inc, group, faults, intervals, t0) for inc in commits]
    for inc in rows:
        for key in ("cause", "election"):
            if inc.get(key):
                inc[key] = {**inc[key], "t_s": round(inc[key]["t"] - t0, 3)}
    rows.sort(key=lambda i: (i["mechanism"] != "unexplained", i["drop_t"] or 0.0,
                             i["topic"], i["partition"], i["first_offset"]))
    for i, inc in enumerate(rows, start=1):
        inc["id"] = i
        for key in ("drop_t", "removal_t", "first_t", "last_t"):
            if inc.get(key) is not None:
                inc[f"{key}_s"] = round(inc.pop(key) - t0, 3)
    truncations = sorted(({**c, "t_s": round(c["t"] - t0, 3),
                           "sentence": truncation_sentence(c, t0, group)} for c in cuts),
                         key=lambda c: (c["t"], c["node"]))
    for c in truncations:
        del c["t"], c["id"]
    groups = sorted(({**g, "mechanism_name": MECHANISMS[g["mechanism"]],
                      "sentence": duplicate_sentence(g, t0)} for g in duplicates),
                    key=lambda g: (g["mechanism"] != "unexplained", g["first_t"], g["topic"],
                                   g["partition"]))
    for g in groups:
        for key in ("change_t", "first_t", "last_t"):
            if g.get(key) is not None:
                g[f"{key}_s"] = round(g.pop(key) - t0, 3)
    late_rows = [_late_request(r, faults, intervals, t0) for r in late]
    return {
        "events": True,
        "incident_count": len(rows),
        "record_incidents": sum(1 for i in rows if i["kind"] == "records"),
        "unexplained": sum(i["records"] if i["kind"] == "records" else i["commits"]
                           for i in rows if i["mechanism"] == "unexplained")
        + sum(g["duplicates"] for g in groups if g["mechanism"] == "unexplained"),
        "duplicates": groups[:MAX_INCIDENTS],
        "incidents": rows[:MAX_INCIDENTS],
        "truncations": truncations,
        "truncations_cut_acked": sum(1 for c in truncations if c["acked"]),
        "truncations_lost": sum(c["lost"] for c in truncations),
        "late_requests": late_rows[:MAX_INCIDENTS],
        "late_request_count": len(late_rows),
        "late_requests_decided": sum(r["reason"] == "decided" for r in late_rows),
    }


def _late_request(late: dict[str, Any], faults: list[dict[str, Any]],
                  intervals: list[tuple[float, float, str]], t0: float) -> dict[str, Any]:
    """A late EndTxn as report.json keeps it: its sentence, times from the report's zero,
    and the two transactions by name."""
    row = {**late, "sentence": late_requests.sentence(
        late, t0, lambda t: _fault_at(t, faults, intervals)), "t_s": round(late["t"] - t0, 3)}
    row["landed_in"] = late["landed_in"]["txn"]
    row["sent_by"] = late["sent_by"]["txn"] if late["sent_by"] else None
    del row["t"]
    return row
