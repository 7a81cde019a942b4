"""The runner's HistoryWriter writes the files and fields of the history schema, and importing the
runner pulls in no Spark (the operator image, which runs it in Kubernetes, has none).

The writer does not check its lines at runtime (it is on the workload's hot path); these tests
do, and tests/analysis/test_real_history.py does for every line of a real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from undertow.runner.history import HistoryWriter
from undertow_analysis import history_schema as schema


def test_the_writer_creates_every_json_lines_file_of_the_schema(tmp_path: Path) -> None:
    HistoryWriter(tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f.filename for f in schema.FILES if f.json_lines)


def test_every_line_the_writer_writes_has_the_schema_fields_and_types(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path)
    writer.send(producer="p0", value="p0-1", topic="t", partition=0, status="ok", offset=2**40,
                error=None, t_invoke=1763830000.1, t_complete=1763830000.2)
    # Never assigned a partition, no offset: the nullable fields as null.
    writer.send(producer="p1", value="p1-7", topic="t", partition=None, status="info",
                offset=None, error="_MSG_TIMED_OUT", t_invoke=1763830001.0, t_complete=1763830031.0)
    writer.read(consumer="drain", phase="drain", topic="t", partition=2, offset=5, value="p0-1",
                t=1763830040.0)
    writer.fault(fault="partition", target="broker-0|broker-1,broker-2", role="split",
                 action="inject")
    writer.close()

    written = {f: [json.loads(line) for line in (tmp_path / f.filename).read_text().splitlines()]
               for f in schema.FILES if f.json_lines}
    assert {f.name: len(lines) for f, lines in written.items()} == {
        "sends": 2, "reads": 1, "faults": 1, "cluster": 0}
    for file, lines in written.items():
        for line in lines:
            assert file.problems(line) == [], (file.filename, line)


def test_importing_the_runner_imports_no_spark() -> None:
    code = ("import sys, undertow.runner.run; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'py4j'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert run.stdout.strip() == "[]"
