"""The mechanism in force, owned in one place: one :class:`CollectionState` per collection.

The ingest service counts the versions it accepts, the refresh estimates with them, the
controller adopts new versions (agents/control/controller.py) and the web views show the current one;
all of them read it here (docs/pipeline.md "The worker's parts").
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ldpstream.agents.store.layout import Layout
from ldpstream.estimators.mechanism import Mechanism

if TYPE_CHECKING:
    from ldpstream.config import Collection


class CollectionState:
    """One collection's mechanism in force, the versions whose reports are still counted, and
    the count layout of each version (agents/store/layout.py)."""

    def __init__(self, collection: Collection) -> None:
        self.collection = collection
        #: the mechanism the config describes (version ``collection.version``)
        self.configured: Mechanism = collection.mechanism()
        self._current: Mechanism = self.configured
        self._accepted: dict[int, Mechanism] = {self._current.version: self._current}
        self._layouts: dict[int, Layout] = {}

    @property
    def current(self) -> Mechanism:
        """The mechanism in force (what devices are told to use)."""
        return self._current

    def versions(self) -> Mapping[int, Mechanism]:
        """The versions whose reports are counted now (version → mechanism): the one in force
        and the earlier ones it still accepts."""
        return self._accepted

    def adopt(self, mech: Mechanism) -> Mechanism:
        """Put ``mech`` in force (with the versions it accepts); returns the one it replaces."""
        old = self._current
        self._current = mech
        self._accepted = {v: mech for v in mech.accepted_versions()}
        return old

    def layout(self, version: int) -> Layout:
        """The count layout of mechanism ``version``: its tensors for the configured marginals."""
        lay = self._layouts.get(version)
        if lay is None:
            mech = self._accepted[version]
            lay = self._layouts[version] = Layout.of(version,
                                                     mech.tensors(self.collection.marginals))
        return lay


class CollectionStates(Mapping[str, CollectionState]):
    """Every collection's :class:`CollectionState` (collection id → state)."""

    def __init__(self, collections: Mapping[str, Collection]) -> None:
        self._states = {cid: CollectionState(c) for cid, c in collections.items()}

    def __getitem__(self, cid: str) -> CollectionState:
        return self._states[cid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def known(self) -> dict[str, Mapping[int, Mechanism]]:
        """collection → {version: mechanism} accepted on the wire."""
        return {cid: s.versions() for cid, s in self._states.items()}
