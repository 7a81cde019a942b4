"""What every request handler uses to answer: one version's response classes, built from a
superset of fields (``build``), Kafka's values for "none", and how a handler awaits a core
operation that answers through a callback (``completion``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import fields
from datetime import timedelta
from functools import cache
from types import ModuleType
from typing import Any, TypeVar

from kio.index import load_payload_module
from kio.static.constants import EntityType

from minibroker.network.codec import ApiKey

T = TypeVar("T")

NO_THROTTLE = timedelta(0)
NO_NODE = -1


@cache
def response_module(api_key: ApiKey, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.response)


@cache
def _field_names(entity_type: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(entity_type))


def build(entity_type: type[T], **values: Any) -> T:
    """Instantiate one version's entity, dropping the fields that version lacks."""
    names = _field_names(entity_type)
    if names.issuperset(values):  # the newest versions have them all: no copy
        return entity_type(**values)
    return entity_type(**{k: v for k, v in values.items() if k in names})


async def completion(start: Callable[[Callable[[T], None]], None]) -> T:
    """Await a core operation (``ReplicaManager``, ``GroupCoordinator``) that reports
    through a completion callback, now or later."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def complete(result: T) -> None:
        if not future.done():  # the connection may be gone (cancelled) by then
            future.set_result(result)

    start(complete)
    return await future
