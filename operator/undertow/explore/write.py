"""A minimal experiment as a file like those in `experiments/`: a comment saying what it
shows, a BrokerCluster and a ChaosExperiment with fixed faults, `expect: loss` (or
`anomalies`) and a fixed seed, so that `undertow run FILE` (on processes, pods or in
simulation) replays it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from undertow.spec import LoadedExperiment

from .draw import Schedule, experiment_with

__all__ = ["minimal_name", "write_experiment"]

MAX_NAME = 63
"""A DNS-1123 label's length, the limit of `metadata.name`."""


def minimal_name(original: str, suffix: str) -> str:
    """`original-suffix` as a DNS-1123 label (a suffix that already starts with
    `original-` is not repeated), `original-minimal` for an empty suffix or the original
    name itself: never `original`, so the minimal experiment and the one it came from can
    be applied side by side. Past 63 characters the original part is cut, not the suffix,
    which tells minimal experiments of one original apart."""
    suffix = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()).strip("-")
    suffix = suffix.removeprefix(f"{original}-")
    if suffix in ("", original):
        suffix = "minimal"
    head = original[:max(1, MAX_NAME - len(suffix) - 1)].rstrip("-")
    return f"{head}-{suffix}"[:MAX_NAME].rstrip("-")


class _Flow(dict[str, Any]):
    """A mapping written on one line, as the experiment files write selectors."""


class _Dumper(yaml.SafeDumper):
    """Block style except for `_Flow` mappings; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data,
                                                         flow_style=True))


def _flow_selectors(entry: dict[str, Any]) -> dict[str, Any]:
    entry = dict(entry)
    for key in ("target", "network"):
        if key in entry:
            entry[key] = _Flow(entry[key])
    return entry


def _dump(resource: BaseModel) -> dict[str, Any]:
    """Every setting spelled out, defaults included: the file then reproduces the run even
    if a default changes, and says acks, storage and the like to its reader."""
    return resource.model_dump(mode="json", by_alias=True, exclude_none=True)


def write_experiment(loaded: LoadedExperiment, schedule: Schedule, path: Path,
                     comment_lines: list[str], *, suffix: str | None = None,
                     expect: str = "loss") -> Path:
    """Write `loaded` with `schedule` as its faults to `path` and return `path`.

    The file opens with `comment_lines` as `#` comments; the cluster and the experiment are
    both named `minimal_name(original, suffix)` (the suffix defaults to the file's stem), the
    experiment refers to the cluster by that name, expects `expect` (loss, or the anomalies
    a run found without losing anything) and fixes the schedule's seed. Raises `SpecError`
    when the schedule does not fit the experiment."""
    trial = experiment_with(loaded, schedule)
    name = minimal_name(loaded.experiment.metadata.name, suffix or path.stem)
    cluster = _dump(loaded.cluster)
    cluster["metadata"]["name"] = name
    experiment = _dump(trial.experiment)
    experiment["metadata"]["name"] = name
    spec = experiment["spec"]
    spec["cluster"] = {"ref": name}
    spec["faults"] = [_flow_selectors(entry) for entry in schedule.as_spec_faults()]
    spec["expect"] = expect
    spec["seed"] = schedule.seed
    comment = "".join(f"# {line}".rstrip() + "\n"
                      for text in comment_lines for line in (text.splitlines() or [""]))
    body = yaml.dump_all([cluster, experiment], Dumper=_Dumper, sort_keys=False, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(comment + body, encoding="utf-8")
    return path
