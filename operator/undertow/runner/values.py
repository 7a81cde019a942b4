"""The workload's record values: ``p{producer}-{seq}``, unique per send, padded to the
record size after a ``|`` that readers cut off. A value is what the analysis identifies a
record by."""

SEPARATOR = "|"


def padding(producer: str, record_size: int) -> str:
    """What follows each value of ``producer`` in its records (every producer of the
    workload, real or simulated, pads the same way): the separator and enough ``x`` for a
    record of about ``record_size`` bytes."""
    return SEPARATOR + "x" * max(record_size - len(producer) - 12, 0)


def decode_value(raw: bytes | None) -> str:
    text = (raw or b"").decode("utf-8", errors="replace")
    return text.split(SEPARATOR, 1)[0]
