"""``undertow run`` end to end on the local platform: real brokers, a real Kafka client, real
signals. The analysis is skipped here (tests/analysis covers it); these tests check the
history the run leaves (every line as `undertow_history.schema` defines it), its exit
codes, and that nothing outlives an interrupted run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from procs import living_with_mark, processes_mentioning
from small_experiment import SMALL_CONFIG, small_experiment, write_small_experiment

from undertow.platform.base import wait_for
from undertow.runner.run import max_run_duration_s
from undertow.spec import load_experiment
from undertow_history import schema as history_schema

REPO = Path(__file__).resolve().parents[2]


def write_experiment(tmp_path: Path, name: str, duration: str, faults: str) -> Path:
    return write_small_experiment(tmp_path / f"{name}.yaml", name, duration, faults)


STARTED: list[subprocess.Popen] = []
"""Every `undertow` process this module started, for `no_run_outlives_its_test`."""


def undertow(*args: str, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "undertow", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kwargs)
    STARTED.append(proc)
    return proc


def bound_s(experiment: Path) -> float:
    """How long a run of `experiment` may take: the bounds of its own waits
    (`max_run_duration_s`; a run that is well takes a fraction of it) and two minutes for
    the cluster's start and the faults' recovery. Past that, the run hangs."""
    return max_run_duration_s(load_experiment(experiment)) + 120


@pytest.fixture(autouse=True)
def no_run_outlives_its_test() -> Iterator[None]:
    """A run still going when its test ends (a `communicate` that timed out, a failed
    assertion) is stopped as a user would stop it: SIGTERM, on which it heals and stops its
    cluster, then SIGKILL after a minute (its guardian then stops what it left)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is not None:
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def schema_lines(history: Path) -> dict:
    """Each JSON Lines file of `history` by its schema file, every line checked against it."""
    written = {f: lines(history / f.filename) for f in history_schema.FILES if f.json_lines}
    for file, records in written.items():
        assert [p for r in records for p in file.problems(r)] == [], file.filename
    return written


def test_a_transactional_run_writes_each_transaction_with_its_outcome(tmp_path: Path) -> None:
    """A transactional producer (every fourth transaction aborted) and a read_committed
    consumer through a leader kill: each transaction's line, its sends with its outcome,
    committed records drained where their produce response put them, aborted ones never
    read, and the partitions' last stable offsets sampled."""
    experiment = tmp_path / "txn.yaml"
    # The kill at 3 s, not the usual 1 s: the producer's init_transactions (which creates
    # __transaction_state on first use) runs on the workload's clock, and on a busy machine
    # took until after a kill at 1 s had healed (CI, 2026-12-01), leaving no commit before it.
    # 12 s, not 8: after the kill's recovery (at about 5.6 s) the producer first aborts the
    # transaction the kill broke and finds the new leader; beside the library's simulations
    # it began no committed transaction in the 2.4 s an 8 s run left (CI, 2026-12-01).
    experiment.write_text(small_experiment("txn", "12s", """\
    - kind: kill
      target: {role: leader}
      at: 3s
      duration: 2s""", workload={
        "retries": 3, "transactions": "{recordsPerTransaction: 4, abortRatio: 0.25}"}))
    out = tmp_path / "out"
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis", "--seed", "7")
    output, _ = proc.communicate(timeout=bound_s(experiment))
    assert proc.returncode == 0, output

    history = out / "history"
    written = schema_lines(history)
    meta = json.loads((history / "meta.json").read_text())
    assert (meta["idempotent"], meta["transactions"]) == (True, {"timeout_s": 10.0})
    txns = written[history_schema.TXNS]
    assert {t["intent"] for t in txns} == {"commit", "abort"}
    assert all(t["status"] == "fail" for t in txns if t["intent"] == "abort")
    sends = {s["value"]: s for s in written[history_schema.SENDS]}
    for t in txns:
        assert {sends[v]["txn"] for v in t["values"]} == {t["txn"]}
        assert {sends[v]["status"] for v in t["values"]} <= {t["status"], "info"}
    reads = written[history_schema.READS]
    assert {r["isolation"] for r in reads} == {"read_committed"}
    drained = {r["value"]: (r["partition"], r["offset"]) for r in reads if r["phase"] == "drain"}
    committed = [s for s in sends.values() if s["status"] == "ok"]
    aborted = {s["value"] for s in sends.values() if s["status"] == "fail"}
    # Transactions committed on both sides of the kill (how many depends on the machine's
    # speed: about 150 here, 100 on a loaded one), and some aborted.
    kill = {f["action"]: f["t"] for f in written[history_schema.FAULTS]}
    assert any(s["t_complete"] < kill["inject"] for s in committed), kill
    assert any(s["t_invoke"] > kill["recover"] for s in committed), kill
    assert aborted
    assert all(drained.get(s["value"]) == (s["partition"], s["offset"]) for s in committed)
    assert not aborted & {r["value"] for r in reads}, "read_committed returned an aborted record"
    assert any(c["last_stable_offset"] for c in written[history_schema.CLUSTER])


def test_a_pipeline_run_kills_members_mid_transaction_and_records_what_they_did(
        tmp_path: Path) -> None:
    """A consume-transform-produce pipeline of two member processes, one SIGKILLed every
    4 s: the transaction each kill left open is `fail` with MEMBER_DIED (the replacement's
    InitProducerId aborted it), its outputs never drained; every kill is in faults.jsonl with
    its replacement's recovery; the output topic is drained, one committed output per input
    record below the committed offsets, and the group's commits are the transactions'."""
    experiment = tmp_path / "pipe.yaml"
    # Kills at 4 s (c0) and 8 s (c1) from the pipeline's start, whatever each replacement
    # takes to join (Pipeline keeps to its times): c0's replacement has 8 s to get partitions
    # and commit a transaction, even on a busy machine.
    experiment.write_text(small_experiment("pipe", "12s", "    []", workload={
        "consumers": 2, "retries": 3,
        "consumer": "{mode: subscribe, commitInterval: 300ms, sessionTimeout: 2s}",
        "transactions": "{recordsPerTransaction: 5, abortRatio: 0.2}",
        "pipeline": "{killEvery: 4s}"}))
    out = tmp_path / "out"
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis", "--seed", "3")
    output, _ = proc.communicate(timeout=bound_s(experiment))
    assert proc.returncode == 0, output

    history = out / "history"
    written = schema_lines(history)
    meta = json.loads((history / "meta.json").read_text())
    assert {k: meta["pipeline"][k] for k in ("input_topic", "output_topic", "members")} == {
        "input_topic": "t", "output_topic": "t-out", "members": 2}
    assert meta["output_ended"] is True and set(meta["pipeline"]["drain"]) == {"0", "1"}
    faults = written[history_schema.FAULTS]
    injects = [f for f in faults if f["action"] == "inject"]
    assert len(injects) >= 2 and {f["target"] for f in injects} == {"c0", "c1"}
    assert len([f for f in faults if f["action"] == "recover"]) >= len(injects) - 1
    txns = [t for t in written[history_schema.TXNS] if t["producer"].startswith("c")]
    died = [t for t in txns if t["error"] == "MEMBER_DIED"]
    assert died and all(t["status"] in ("fail", "info") for t in died)
    assert {t["producer"] for t in txns} >= {"c0.0", "c0.1", "c1.0"}
    reads = written[history_schema.READS]
    outputs = [r["value"] for r in reads if r["phase"] == "drain" and r["topic"] == "t-out"]
    dead_outputs = {v for t in died if t["status"] == "fail" for v in t["values"]}
    assert outputs and not dead_outputs & set(outputs)
    inputs = [r["value"].rsplit("/", 1)[0] for r in reads if r["topic"] == "t-out"]
    assert len(inputs) == len(set(inputs)), "an input record's output drained twice"
    commits = [g for g in written[history_schema.GROUPS] if g["type"] == "commit"]
    assert commits and {g["member"] for g in commits} <= {t["producer"] for t in txns}
    committed = {}
    for g in commits:
        if g["status"] == "ok":
            committed[g["partition"]] = max(committed.get(g["partition"], 0), g["offset"])
    below = {r["value"] for r in reads if r["phase"] == "drain" and r["topic"] == "t"
             and r["offset"] < committed.get(r["partition"], 0)}
    assert below and below <= set(inputs), "an input record below a commit has no output"


def test_a_consumer_protocol_group_reads_everything_across_a_leader_kill(
        tmp_path: Path) -> None:
    """workload.consumer.groupProtocol consumer: the stock client speaks KIP-848's
    ConsumerGroupHeartbeat (group.protocol=consumer) to minibroker's coordinator; the two
    members share the partitions, commit, carry their member epochs as the reads' generation,
    and nothing acknowledged is lost across the leader kill. The same file in simulation
    (librdkafka's member as a model) gives the same."""
    experiment = tmp_path / "kip848.yaml"
    config = {**SMALL_CONFIG, "group.consumer.session.timeout.ms": 6000,
              "group.consumer.min.session.timeout.ms": 6000,
              "group.consumer.heartbeat.interval.ms": 500,
              "group.consumer.min.heartbeat.interval.ms": 500}
    experiment.write_text(small_experiment("kip848", "8s", config=config, workload={
        "consumers": 2, "consumer": "{mode: subscribe, groupProtocol: consumer}"}))
    for platform in ("local", "sim"):
        out = tmp_path / platform
        proc = undertow("run", str(experiment), "--platform", platform, "--out", str(out),
                        "--no-analysis", "--seed", "5")
        output, _ = proc.communicate(timeout=bound_s(experiment))
        assert proc.returncode == 0, output
        history = out / "history"
        groups = lines(history / "groups.jsonl")
        assigned = [g for g in groups if g["type"] == "assign"]
        assert {g["partition"] for g in assigned} == {0, 1}, platform
        assert {g["member"] for g in assigned} == {"c0", "c1"}, platform
        assert any(g["type"] == "commit" and g["status"] == "ok" for g in groups), platform
        run_reads = [r for r in lines(history / "reads.jsonl") if r["phase"] == "run"]
        assert run_reads and all(r["generation"] is not None and r["generation"] >= 1
                                 for r in run_reads), f"{platform}: a member epoch on every read"
        acked = {s["value"] for s in lines(history / "sends.jsonl") if s["status"] == "ok"}
        drained = {r["value"] for r in lines(history / "reads.jsonl") if r["phase"] == "drain"}
        assert acked and acked <= drained, platform


def test_a_run_writes_the_documented_history(tmp_path: Path) -> None:
    """Two consumers in a group (subscribe mode), so that every file has lines."""
    experiment = tmp_path / "kill-leader.yaml"
    experiment.write_text(small_experiment("kill-leader", "8s", """
    - kind: kill
      target: {role: leader}
      at: 2s
      duration: 2s""", workload={"consumers": 2,
                                  "consumer": "{mode: subscribe, groupId: documented}"}))
    out = tmp_path / "out"
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis", "--seed", "7")
    output, _ = proc.communicate(timeout=bound_s(experiment))
    assert proc.returncode == 0, output

    history = out / "history"
    for file in history_schema.FILES:
        if not file.json_lines:
            continue
        records = lines(history / file.filename)
        # Its producers are not transactional: the test below writes txns.jsonl.
        assert records or file is history_schema.TXNS, f"{file.filename} is empty"
        for record in records:
            assert not file.problems(record), (file.filename, record, file.problems(record))
    meta = json.loads((history / "meta.json").read_text())
    assert meta["seed"] == 7 and meta["expect"] == "clean" and meta["idempotent"] is False
    assert meta["end"] > meta["start"]
    assert meta["spec"]["topic"]["name"] == "t"

    sends = lines(history / "sends.jsonl")
    acked = {s["value"]: (s["partition"], s["offset"]) for s in sends if s["status"] == "ok"}
    assert len(acked) > 300
    drained = {r["value"]: (r["partition"], r["offset"])
               for r in lines(history / "reads.jsonl") if r["phase"] == "drain"}
    assert all(drained.get(v) == where for v, where in acked.items()), "acks=all lost a record"

    # The group: each partition assigned, its committed offset asked, progress committed,
    # and every record a member returned carries its generation.
    groups = lines(history / "groups.jsonl")
    assigned = {g["partition"] for g in groups if g["type"] == "assign"}
    assert assigned == {0, 1}
    assert {g["partition"] for g in groups if g["type"] == "committed"} == assigned
    assert any(g["type"] == "commit" and g["status"] == "ok" for g in groups)
    run_reads = [r for r in lines(history / "reads.jsonl") if r["phase"] == "run"]
    assert run_reads and all(r["generation"] is not None and r["generation"] >= 1
                             for r in run_reads)
    assert meta["consumer_group"]["group_id"] == "documented"

    faults = lines(history / "faults.jsonl")
    assert [f["action"] for f in faults] == ["inject", "heal", "recover"]
    assert faults[0]["target"].startswith("broker-") and faults[0]["role"] == "leader of t-0"
    assert 1.5 < faults[1]["t"] - faults[0]["t"] <= faults[2]["t"] - faults[0]["t"] < 10
    # The sampler saw the leader change that the kill caused.
    leaders = {c["leader"] for c in lines(history / "cluster.jsonl") if c["partition"] == 0}
    assert len(leaders - {-1}) >= 2

    # Where the time after the workload went, printed and beside the history (no analysis
    # here: the record ends with the history's close).
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["phases"]) == ["healing", "last sends", "recovery", "drain", "history"]
    assert all(0 <= s < 60 for s in timings["phases"].values())
    assert abs(timings["total"] - sum(timings["phases"].values())) < 0.05
    assert "cluster stop" in timings["beside"]
    assert "time after the workload: healing " in output


def test_a_delay_on_one_producer_slows_its_sends_alone(tmp_path: Path) -> None:
    """A run with two producers whose schedule delays p0's links to every broker 300 ms
    each way for 3 s: the runner gives p0 links of its own, p0's sends in that window take
    two delayed trips, p1's stay fast, and faults.jsonl names the producer."""
    experiment = tmp_path / "slow-producer.yaml"
    experiment.write_text(small_experiment("slow-producer", "6s", """
    - kind: delay
      target: {producer: 0}
      delay: {latency: 300ms}
      at: 1s
      duration: 3s""", workload={"producers": 2}))
    out = tmp_path / "out"
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis", "--seed", "7")
    output, _ = proc.communicate(timeout=bound_s(experiment))
    assert proc.returncode == 0, output

    history = out / "history"
    faults = lines(history / "faults.jsonl")
    assert [(f["action"], f["target"], f["role"]) for f in faults] == [
        (action, "client-p0", "producer p0") for action in ("inject", "heal", "recover")]
    injected, healed = faults[0]["t"], faults[1]["t"]

    def window(producer: str) -> list[float]:
        return sorted(s["t_complete"] - s["t_invoke"] for s in lines(history / "sends.jsonl")
                      if s["producer"] == producer and s["status"] == "ok"
                      and injected + 1 < s["t_invoke"] and s["t_complete"] < healed)

    slow, fast = window("p0"), window("p1")
    assert len(slow) >= 10 and len(fast) >= 50, (len(slow), len(fast))
    assert slow[len(slow) // 2] >= 0.5, slow  # two trips of 300 ms, a little jitter aside
    assert fast[len(fast) // 2] < 0.15, fast


PRODUCER_PROCESS = "undertow.runner.producer_process"
"""What the command line of a producer's own process names."""


def p0_paused(at: str, duration: str) -> str:
    """The `faults` of a schedule that pauses producer p0 once."""
    return f"""
    - kind: pause
      target: {{producer: 0}}
      at: {at}
      duration: {duration}"""


def producer_processes(mark: str) -> list[tuple[int, str]]:
    """(pid, state) of the marked run's producer processes."""
    found = []
    for pid, state in living_with_mark(mark):
        try:
            if PRODUCER_PROCESS.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append((pid, state))
        except OSError:  # gone meanwhile
            continue
    return found


def producer_states_while_paused(proc: subprocess.Popen, faults: Path, mark: str) -> set[str]:
    """The states /proc shows for the run's producer processes between the pause's `inject`
    and its `heal` in faults.jsonl, read every 50 ms; returns when the heal is written."""
    def actions() -> list[str]:
        return [f["action"] for f in lines(faults)] if faults.exists() else []

    states: set[str] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        before = actions()
        if "heal" in before:
            break
        seen = {state for _pid, state in producer_processes(mark)}
        if "inject" in before and "heal" not in actions():  # read inside the window
            states |= seen
        time.sleep(0.05)
    return states


@pytest.mark.parametrize("transactions", [None, "{recordsPerTransaction: 4}"],
                         ids=["plain", "transactional"])
def test_a_paused_producer_sends_nothing_until_it_is_resumed(
        tmp_path: Path, transactions: str | None) -> None:
    """Producer p0 paused for 2.5 s (`pause` of `{producer: 0}`): it runs as a process of
    its own, which /proc shows stopped (T) while the pause lasts; none of its sends is
    invoked or completes between the pause's inject and its heal, and it sends again after;
    p1, a thread of the runner, keeps acknowledging through the pause; faults.jsonl has the
    pause's inject, heal and recover on `client-p0`, and every line its documented schema. A
    transactional p0's transactions reach txns.jsonl as a thread's do, each send with its
    transaction."""
    experiment = tmp_path / "paused-producer.yaml"
    workload = {"producers": 2, **({"retries": 3, "transactions": transactions}
                                   if transactions else {})}
    experiment.write_text(small_experiment("paused-producer", "6s", p0_paused("1500ms", "2500ms"),
                                           workload=workload))
    out, mark = tmp_path / "out", uuid.uuid4().hex
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis", "--seed", "7",
                    env={**os.environ, "UNDERTOW_TEST_MARK": mark})
    states = producer_states_while_paused(proc, out / "history" / "faults.jsonl", mark)
    output, _ = proc.communicate(timeout=bound_s(experiment))
    assert proc.returncode == 0, output
    assert states == {"T"}, states

    history = out / "history"
    written = schema_lines(history)
    faults = written[history_schema.FAULTS]
    assert [(f["action"], f["target"], f["role"]) for f in faults] == [
        (action, "client-p0", "producer p0") for action in ("inject", "heal", "recover")]
    paused, healed = faults[0]["t"], faults[1]["t"]
    sends = written[history_schema.SENDS]
    p0 = [s for s in sends if s["producer"] == "p0"]
    during = [s for s in p0 if paused < s["t_invoke"] < healed or paused < s["t_complete"] < healed]
    assert during == []
    # At 100 records/s each: bounds far below the rate, as a loaded machine's transactional
    # producer commits ~50 in the 2 s after the heal, and a broken pause or resume gives 0.
    assert sum(s["t_invoke"] > healed and s["status"] == "ok" for s in p0) >= 10
    assert sum(paused < s["t_complete"] < healed and s["status"] == "ok" for s in sends
               if s["producer"] == "p1") >= 50
    assert (out / "clients" / "p0.log").exists() and not (out / "clients" / "p1.log").exists()
    txns = [t for t in written[history_schema.TXNS] if t["producer"] == "p0"]
    assert bool(txns) == bool(transactions)
    assert sorted(v for t in txns for v in t["values"]) == sorted(
        s["value"] for s in p0 if s["txn"] is not None)
    assert all({s["txn"] for s in p0 if s["value"] in t["values"]} == {t["txn"]} for t in txns)


def test_a_runner_killed_while_its_producer_is_paused_leaves_no_producer_behind(
        tmp_path: Path) -> None:
    """SIGKILL of the runner while p0's own process is stopped: nothing can heal the pause,
    yet the process dies with the runner (PR_SET_PDEATHSIG=SIGKILL, which a stopped process
    does not ignore, and the guardian's SIGCONT and SIGKILL of its process group)."""
    experiment = tmp_path / "killed.yaml"
    experiment.write_text(small_experiment("killed", "60s", p0_paused("1s", "50s")))
    out, mark = tmp_path / "out", uuid.uuid4().hex
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis",
                    env={**os.environ, "UNDERTOW_TEST_MARK": mark})
    wait_for(lambda: proc.poll() is not None or [s for _, s in producer_processes(mark)] == ["T"],
             90, "p0's process to be paused")
    assert proc.poll() is None, proc.communicate()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    try:
        wait_for(lambda: not producer_processes(mark), 20, "p0's process to die with the runner")
        wait_for(lambda: not living_with_mark(mark), 20, "every process of the run to exit")
    finally:  # what outlived the runner, stopped or not, must not outlive the test
        for pid, _state in living_with_mark(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_same_producer_pause_runs_in_simulation(tmp_path: Path) -> None:
    """The file that pauses p0 on local processes runs as it is with `--platform sim`,
    where p0's host is a node of the virtual loop that the pause holds."""
    experiment = tmp_path / "paused-sim.yaml"
    experiment.write_text(small_experiment("paused-sim", "5s", p0_paused("1s", "1s")))
    proc = undertow("run", str(experiment), "--platform", "sim", "--no-analysis",
                    "--no-progress", "--out", str(tmp_path / "out"))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    faults = [json.loads(line) for line in
              (tmp_path / "out" / "history" / "faults.jsonl").read_text().splitlines()]
    assert [(f["target"], f["action"]) for f in faults] == [
        ("client-p0", "inject"), ("client-p0", "heal"), ("client-p0", "recover")], faults


def test_bad_input_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    experiment = write_experiment(tmp_path, "bad", "5q", "    []")
    proc = undertow("run", str(experiment), "--out", str(tmp_path / "out"))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "bad.yaml" in output and "spec.workload.duration" in output and "5q" in output
    assert not (tmp_path / "out" / "history").exists(), "a rejected experiment started"


def test_a_transaction_version_2_workload_is_refused_before_a_local_run(
        tmp_path: Path) -> None:
    """No stock client here speaks transaction version 2: a local run of such a workload is
    rejected, naming the field and where it does run, before anything starts."""
    documents = list(yaml.safe_load_all(
        (REPO / "experiments" / "txn-partition-leader-kill.yaml").read_text()))
    experiment = next(d for d in documents if d["kind"] == "ChaosExperiment")
    experiment["spec"]["workload"]["transactions"]["transactionVersion"] = 2
    path = tmp_path / "tv2.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    proc = undertow("run", str(path), "--out", str(tmp_path / "out"))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert "tv2.yaml" in output and "spec.workload.transactions.transactionVersion" in output
    assert "--platform sim" in output, output
    assert not (tmp_path / "out").exists(), "a rejected experiment started"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_heals_and_leaves_nothing_behind(tmp_path: Path, sig) -> None:
    experiment = write_experiment(tmp_path, "interrupted", "60s", """
    - kind: pause
      target: {role: follower}
      at: 1s
      duration: 50s
    - kind: partition
      target: {role: leader}
      at: 1s
      duration: 50s""")
    out = tmp_path / "out"
    # Started with SIGINT ignored, as a shell starts a script's background job (and as a
    # pytest-xdist worker may leave it): SIGINT must stop the run all the same.
    proc = undertow("run", str(experiment), "--out", str(out), "--no-analysis",
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    faults = out / "history" / "faults.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if faults.exists() and sum(1 for f in lines(faults) if f["action"] == "inject") == 2:
            break
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the faults were never injected")
    assert any(state == "T" for _, state in processes_mentioning(str(out))), "no paused broker"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert processes_mentioning(str(out)) == [], "processes outlived the run"
    records = lines(faults)
    assert sorted(f["action"] for f in records) == ["heal", "heal", "inject", "inject",
                                                    "recover", "recover"]
    meta = json.loads((out / "history" / "meta.json").read_text())
    assert meta["end"] is not None


def test_a_seed_replays_the_same_random_schedule(tmp_path: Path) -> None:
    experiment = write_experiment(tmp_path, "random", "40s", """
    - random:
        kinds: [kill, pause, disk-stall]
        targets: [{role: leader}, {role: follower}]
        interval: {min: 1s, max: 5s}
        duration: {min: 1s, max: 3s}
        count: 5""")

    def planned(seed: str) -> list:
        proc = undertow("plan", str(experiment), "--seed", seed)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        return json.loads(output)["plan"]

    first = planned("11")
    assert first == planned("11")
    assert first != planned("12")
    assert len(first) == 5
