"""`last_error` bookkeeping shared by the executors: every public call records how it ended."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from hsched.errors import ExecutorError


class _Records(Protocol):
    last_error: ExecutorError | None


S = TypeVar("S", bound=_Records)
P = ParamSpec("P")
T = TypeVar("T")


def recorded(method: Callable[Concatenate[S, P], Awaitable[T]]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """An executor method that sets `last_error` to the ExecutorError it raises, and clears it when it
    succeeds. A call its caller cancels (the caller's own timeout) leaves `last_error` as it was: the
    executor cannot tell a slow node from an impatient caller."""

    @functools.wraps(method)
    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            result = await method(self, *args, **kwargs)
        except ExecutorError as e:
            self.last_error = e
            raise
        self.last_error = None
        return result

    return wrapper
