"""A store wrapper that records the name of every request made through it (what a reader costs rank 0)."""

from __future__ import annotations


class Counting:
    """A store that counts the requests made through it."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return getattr(self.store, name)(*args)

        return call
