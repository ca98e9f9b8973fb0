"""Merged frontiers of a subscription and Strymon's epoch-atomicity filter (pure logic).

Kept apart from the Kafka-facing `subscriber` so that the rules a subscriber follows can be
tested exhaustively without a broker.
"""

from __future__ import annotations

from collections.abc import Iterable

from substreams.frontier import Antichain, MutableAntichain, Time, UpperAntichain


class SubscriptionFrontiers:
    """Per-part lower frontiers, their meet, and Strymon's upper-frontier filter.

    A *part* is one control topic.  The filter is the union of the parts' starting-snapshot
    upper frontiers; an element is forgotten once the merged lower frontier has passed it
    (``retain_not_passed``).  Lower-frontier deltas are frontier *changes* (a time entering
    or leaving), so they are applied idempotently: a snapshot may already reflect changes
    that its writer publishes only afterwards.
    """

    def __init__(self) -> None:
        self.parts: dict[str, MutableAntichain] = {}
        self.upper = UpperAntichain()
        self._lower = Antichain()

    @property
    def lower(self) -> Antichain:
        """The merged lower frontier: the meet of every part's."""
        return self._lower

    def start(self, part: str, lower: Iterable[Time], upper: Iterable[Time]) -> None:
        """Begin following ``part`` at a snapshot of its two frontiers."""
        self.parts[part] = MutableAntichain()
        self._set(part, lower)
        self.upper = self.upper.union(UpperAntichain(upper))
        self._merge()

    def admits(self, t: Time) -> bool:
        """False while ``t`` is at or below an element of the filter: the subscriber may
        have missed part of it."""
        return not self.upper.covers(t)

    def apply(self, part: str, updates: Iterable[tuple[Time, int]]) -> Antichain | None:
        """Apply frontier changes of ``part``; the new merged lower frontier if it moved."""
        mut = self.parts[part]
        for t, delta in updates:
            present = mut.count_for(t) > 0
            if delta > 0 and not present:
                mut.update_iter([(t, 1)])
            elif delta < 0 and present:
                mut.update_iter([(t, -mut.count_for(t))])
        return self._merge()

    def complete(self, part: str, t: Time, updates: Iterable[tuple[Time, int]]) -> Antichain | None:
        """``t`` of ``part`` completed with these frontier changes.  A complete time is no
        longer active whatever the deltas say (a snapshot taken while ``t``'s activation was
        still unpublished would otherwise leave ``t`` in the frontier for good)."""
        return self.apply(part, [*updates, (t, -1)])

    def complete_many(
        self, part: str, times: Iterable[Time], updates: Iterable[tuple[Time, int]]
    ) -> Antichain | None:
        """A run of times of ``part`` completed in one record (``EpochsComplete``): its
        frontier changes hold for the run as a whole, so they are applied once, after every
        time of it -- completing the times one by one would pass through frontiers the
        writer never had (the first time retired before the activation of the next one,
        which the run's changes carry, was applied)."""
        return self.apply(part, [*updates, *((t, -1) for t in times)])

    def _set(self, part: str, lower: Iterable[Time]) -> None:
        mut = self.parts[part]
        wanted = set(lower)
        current = set(mut.frontier())
        changes = [(t, -mut.count_for(t)) for t in current - wanted]
        changes += [(t, 1) for t in wanted - current]
        mut.update_iter(changes)

    def _merge(self) -> Antichain | None:
        merged = Antichain()
        for mut in self.parts.values():
            merged = merged.meet(mut.frontier())
        if self.upper:
            self.upper = self.upper.retain_not_passed(merged)
        if merged == self._lower:
            return None
        self._lower = merged
        return merged
