"""Ending a component's asyncio tasks within a bound.

Kafka's components end their threads in ``shutdown``: ``ShutdownableThread.initiateShutdown``
then ``awaitShutdown``, and a ``KafkaScheduler`` that waits for its tasks. minibroker's tasks
end by cancellation, and a task can ignore one: before Python 3.12, ``asyncio.wait_for``
returns its result (or raises its error) when the cancellation arrives in the same turn of
the loop as the result, so a loop that retries on that error carries on as if never asked
to stop. A stop that waited for such a task without a bound would never return, and one
that did not wait would leave it running (reconnecting to the controller, applying
metadata) after the broker said it had stopped. So the wait has a bound, and a task still
running past it is named in the log with where it stands.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Collection

log = logging.getLogger("minibroker.shutdown")

STOP_TIMEOUT_S = 5.0
"""How long a component's tasks have to end once cancelled."""


async def end_tasks(tasks: Collection[asyncio.Task], owner: str,
                    timeout: float = STOP_TIMEOUT_S) -> bool:
    """Cancel ``tasks`` and wait at most ``timeout`` for them to end; False if any is still
    running then (each logged with its stack). ``tasks`` may be a live set that tasks join
    while these end (an answer's callback sends the next request): those are cancelled
    too, within the same bound.

    The wait is ``asyncio.wait``, which never raises what a task raised: a CancelledError
    here is this caller's own cancellation, and goes up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    cancelled: set[asyncio.Task] = set()
    while pending := {task for task in tasks if not task.done()}:
        remaining = deadline - loop.time()
        if remaining <= 0:
            for task in pending:
                log.error("%s: task %s ignored its cancellation for %.1f s and is still "
                          "running:\n%s", owner, task.get_name(), timeout, task_stack(task))
            return False
        for task in pending - cancelled:
            task.cancel()
        cancelled |= pending
        await asyncio.wait(pending, timeout=remaining)
    for task in cancelled:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed while stopping", owner, task.get_name(),
                      exc_info=task.exception())
    return True


def task_stack(task: asyncio.Task) -> str:
    """Where ``task`` is suspended, as a traceback reads."""
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()
