"""A part built after the parts that call it: the one way the assembly closes a cycle.

Two parts that need each other (the cluster and what a lease means for the service;
the dispatcher and the executor it runs) cannot both take the other in their
constructor. The assembly creates a :class:`Late` first, gives its getter to the part
built earlier, and binds it once, in the same function, to the part built later;
a call before that is a bug in the assembly, and says which part (bridge/assembly.py).
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Late(Generic[T]):
    """Holds one part, bound once; calling it returns the part."""

    __slots__ = ("_name", "_part")

    def __init__(self, name: str) -> None:
        self._name = name
        self._part: T | None = None

    def bind(self, part: T) -> T:
        if self._part is not None:
            raise RuntimeError(f"{self._name} is bound twice")
        self._part = part
        return part

    def __call__(self) -> T:
        if self._part is None:
            raise RuntimeError(f"{self._name} is used before the assembly built it")
        return self._part


__all__ = ["Late"]
