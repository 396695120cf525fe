"""A store that fails on demand: wraps a real store, raises ``StoreError`` from named methods.

For the transient-failure tests: ``flaky.fail("start_run")`` makes the next
call of ``start_run`` raise without touching the inner store; ``times=None``
keeps failing until :meth:`FlakyStore.heal`. Every other call goes through.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

from bridge.store.base import Store, StoreError


class StoreWrapper:
    """Wraps a real store: a subclass defines the methods it changes, every other call
    goes through."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @property
    def store(self) -> Store:
        """This wrapper, typed as the store it stands in for."""
        return cast(Store, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FlakyStore:
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self._failing: dict[str, int | None] = {}
        self.failures: Counter[str] = Counter()
        """How often each method was made to fail."""

    @property
    def store(self) -> Store:
        """This wrapper, typed as the store it stands in for."""
        return cast(Store, self)

    def fail(self, method: str, times: int | None = 1) -> None:
        """Fail the next ``times`` calls of ``method`` (``None``: until healed)."""
        if not callable(getattr(self.inner, method, None)):
            raise TypeError(f"the store has no method {method!r}")
        self._failing[method] = times

    def heal(self, method: str | None = None) -> None:
        if method is None:
            self._failing.clear()
        else:
            self._failing.pop(method, None)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self._failing:
            return attr
        return self._failing_call(name, attr)

    def _failing_call(
        self, name: str, real: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            left = self._failing.get(name, 0)
            if name not in self._failing:
                return await real(*args, **kwargs)
            if left is not None:
                if left <= 1:
                    del self._failing[name]
                else:
                    self._failing[name] = left - 1
            self.failures[name] += 1
            raise StoreError(f"injected failure of {name}")

        return call
