"""``ProducerIdManager``: the broker's source of producer ids (Kafka's RPCProducerIdManager).

Idempotent producers get their id from any broker (InitProducerId). Ids must never repeat,
across brokers and restarts, or one producer's retry would be taken for another's batch. So
a broker hands out ids only from blocks the controller allocated to it (AllocateProducerIds);
the controller persists each allocation before answering, and a broker keeps nothing across
restarts: a new incarnation starts with a new block and abandons the rest of the old one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["ProducerIdAllocationError", "ProducerIdManager"]


class ProducerIdAllocationError(Exception):
    """The controller did not allocate a block (unreachable, or refused this incarnation)."""


class ProducerIdManager:
    """Ids from the current block; one allocation in flight, shared by every waiting request."""

    def __init__(self, allocate_block: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        """``allocate_block`` returns (first id, count) or raises ProducerIdAllocationError."""
        self._allocate_block = allocate_block
        self._next_id = 0
        self._block_end = 0
        self._allocation: asyncio.Future[None] | None = None

    async def generate_producer_id(self) -> int:
        while self._next_id >= self._block_end:
            if self._allocation is None:
                self._allocation = asyncio.ensure_future(self._next_block())
            allocation = self._allocation
            try:
                await asyncio.shield(allocation)
            finally:
                if allocation.done() and self._allocation is allocation:
                    self._allocation = None  # the next caller starts a new one if needed
        producer_id = self._next_id
        self._next_id += 1
        return producer_id

    async def _next_block(self) -> None:
        start, count = await self._allocate_block()
        if start < self._block_end or count < 1:
            raise ProducerIdAllocationError(
                f"controller allocated block {start}+{count}, which does not follow the "
                f"previous one (ending at {self._block_end})")
        self._next_id, self._block_end = start, start + count
