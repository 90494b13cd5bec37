"""The assistant's in-memory caches: a bounded, thread-safe LRU map and the digest that keys it."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A thread-safe LRU map bounded by entry count and, optionally, by the summed ``weight`` of entries."""

    def __init__(
        self, capacity: int, *, max_weight: int | None = None, weight: Callable[[V], int] | None = None
    ) -> None:
        self.capacity = capacity
        self.max_weight = max_weight
        self._weigh = weight or (lambda _v: 0)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def put(self, key: K, value: V) -> None:
        w = self._weigh(value)
        if self.max_weight is not None and w > self.max_weight:
            return  # one entry bigger than the whole cache: not worth evicting everything for
        with self._lock:
            if key in self._items:
                self._weight -= self._items.pop(key)[1]
            self._items[key] = (value, w)
            self._weight += w
            while len(self._items) > self.capacity or (
                self.max_weight is not None and self._weight > self.max_weight
            ):
                self._weight -= self._items.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._items)


def digest(*parts: object) -> str:
    """A cache key over the ``repr`` of each part (lone surrogates in text kept, never an error)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode("utf-8", errors="surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()
