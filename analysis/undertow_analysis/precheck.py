"""The history's shape checked in plain Python before Spark starts (a JVM takes seconds to
come up): a local directory that is not a history is refused at once, naming what is
missing. Histories at other URIs (s3a://, hdfs://) are left to the job's own checks, which
need Spark's file systems."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

from undertow_history import schema

OPTIONAL_FILES = ("groups", "txns", "faults", "cluster", "events")
"""History files a history may lack (an older run, another harness): the job reads them as
absent (`io`)."""
REQUIRED = tuple(f.filename for f in schema.FILES if f.name not in OPTIONAL_FILES)
"""What every history holds: meta.json, sends.jsonl, reads.jsonl."""


def local_path(uri: str) -> Path | None:
    """The local directory a history URI names, or None for another file system."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") and not parsed.netloc:
        return Path(parsed.path if parsed.scheme else uri)
    return None


def check_history(uri: str) -> None:
    """Raise FileNotFoundError or ValueError, naming the file, when the local directory
    `uri` is not a history; do nothing for a non-local URI."""
    path = local_path(uri)
    if path is None:
        return
    if not path.is_dir():
        raise FileNotFoundError(f"history {uri} is not a directory")
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        hint = (f"; did you mean {path / 'history'}?" if (path / "history" / "meta.json").is_file()
                else " (`undertow run` writes one under OUT/history)")
        raise FileNotFoundError(
            f"history {uri} has no {', '.join(missing)}: not a history directory{hint}")
    try:
        meta = json.loads((path / "meta.json").read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / 'meta.json'}: not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path / 'meta.json'}: expected a JSON object")
