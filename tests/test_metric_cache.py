"""memgate.metric_cache: a profile's device metrics per MetricOptions, computed once; with a store (the
profile cache's results), a warm run judges from the stored results without loading the profile."""

from __future__ import annotations

import pandas as pd
import pytest

from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import DeviceModel, Profile, ProfileInfo, Series
from memgate.table import Table

FRAME = Table.from_pandas(pd.DataFrame([(1, 10, 20, None), (2, 30, 40, None)],
                                       columns=["t_ns", "allocated", "reserved", "active"]).astype("Int64"))
PROFILE = Profile(path="p", format="test", rank="0",
                  devices=(DeviceModel("npu:0", series={"PTA": Series("PTA", FRAME, "f.csv")}),))


class Store:
    """A result store that remembers what it was asked and given."""

    def __init__(self, held: dict[MetricOptions, list[DeviceMetrics]] | None = None) -> None:
        self.held = dict(held or {})
        self.asked: list[MetricOptions] = []
        self.given: list[MetricOptions] = []

    def get(self, options: MetricOptions) -> list[DeviceMetrics] | None:
        self.asked.append(options)
        return self.held.get(options)

    def put(self, options: MetricOptions, metrics: list[DeviceMetrics]) -> None:
        self.given.append(options)
        self.held[options] = metrics


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[MetricOptions]:
    calls: list[MetricOptions] = []

    def counted(profile: Profile, options: MetricOptions | None = None) -> list[DeviceMetrics]:
        calls.append(options or MetricOptions())
        return profile_metrics(profile, options)

    monkeypatch.setattr("memgate.metric_cache.profile_metrics", counted)
    return calls


def test_metrics_are_computed_once_per_options(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    cache = MetricCache(PROFILE)
    first = cache.get()
    assert first[0].values["peak_allocated_bytes"] == 30
    assert cache.get(MetricOptions()) is first  # the default options, asked either way: one computation
    cache.get(MetricOptions(warmup_steps=0))
    cache.get(MetricOptions(warmup_steps=0))
    assert calls == [MetricOptions(), MetricOptions(warmup_steps=0)]
    assert cache.info == ProfileInfo.of(PROFILE)


def test_a_stored_result_is_used_without_loading_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    stored = profile_metrics(PROFILE)
    store = Store({MetricOptions(): stored})

    def load() -> Profile:
        raise AssertionError("loaded the profile although its result was stored")

    cache = MetricCache(info=ProfileInfo.of(PROFILE), load=load, store=store)
    assert cache.get() is stored
    assert calls == [] and store.given == []


def test_a_result_not_stored_loads_the_profile_once_and_stores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    loads: list[int] = []

    def load() -> Profile:
        loads.append(1)
        return PROFILE

    store = Store()
    cache = MetricCache(info=ProfileInfo.of(PROFILE), load=load, store=store)
    assert loads == []  # nothing loaded until a result is asked for
    cache.get()
    cache.get(MetricOptions(warmup_steps=0))
    cache.get()
    assert loads == [1]  # loaded once, for both options
    assert store.asked == store.given == calls == [MetricOptions(), MetricOptions(warmup_steps=0)]
    assert cache.profile is PROFILE


def test_a_cache_needs_a_profile_or_its_info_and_a_load() -> None:
    with pytest.raises(TypeError, match="MetricCache needs a profile, or its info and a load"):
        MetricCache()
    with pytest.raises(TypeError, match="MetricCache needs a profile, or its info and a load"):
        MetricCache(info=ProfileInfo.of(PROFILE))
