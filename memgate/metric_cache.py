"""The metrics of one profile per :class:`~memgate.metrics.MetricOptions`, computed once.

Budgets with the same options share one computation; with a store (:class:`memgate.cache.ResultStore`)
a warm run reads the results back without loading the profile's frames at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile, ProfileInfo


class MetricStore(Protocol):
    """Where results of an earlier run are kept (:class:`memgate.cache.ResultStore`)."""

    def get(self, options: MetricOptions) -> list[DeviceMetrics] | None: ...

    def put(self, options: MetricOptions, metrics: list[DeviceMetrics]) -> None: ...


class MetricCache:
    """Device metrics of one profile per :class:`MetricOptions`, computed once.

    Built from a loaded ``profile``, or from a profile's ``info`` and a ``load`` that loads it only
    when a result is not in ``store`` (a warm run judges without reading the profile's frames).
    """

    def __init__(self, profile: Profile | None = None, *, info: ProfileInfo | None = None,
                 load: Callable[[], Profile] | None = None, store: MetricStore | None = None) -> None:
        if profile is None and (info is None or load is None):
            raise TypeError("MetricCache needs a profile, or its info and a load")
        self._profile = profile
        self._load = load
        self.info = info if info is not None else ProfileInfo.of(profile)  # type: ignore[arg-type]
        self._store = store
        self._cache: dict[MetricOptions, list[DeviceMetrics]] = {}

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            assert self._load is not None
            self._profile = self._load()
        return self._profile

    def get(self, options: MetricOptions | None = None) -> list[DeviceMetrics]:
        key = options or MetricOptions()
        if key not in self._cache:
            stored = self._store.get(key) if self._store is not None else None
            if stored is None:
                stored = profile_metrics(self.profile, key)
                if self._store is not None:
                    self._store.put(key, stored)
            self._cache[key] = stored
        return self._cache[key]
