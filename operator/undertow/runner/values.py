"""The workload's record values: ``p{producer}-{seq}``, unique per send, padded to the
record size after a ``|`` that readers cut off. A value is what the analysis identifies a
record by."""

SEPARATOR = "|"


def decode_value(raw: bytes | None) -> str:
    text = (raw or b"").decode("utf-8", errors="replace")
    return text.split(SEPARATOR, 1)[0]
