"""memgate.readers.memory: the cyclic collector paused over a big load and resumed as it was, and the
address space a load may add capped, then restored (a pickle bomb through the real loader against that
cap: tests/test_safepickle.py)."""

from __future__ import annotations

import gc
import os

import pytest

from memgate.readers.memory import address_space_capped, collector_paused, release_free_memory

try:
    import resource
except ImportError:  # Windows: no address-space cap
    resource = None  # type: ignore[assignment]

# RLIMIT_AS, set from what Linux's /proc/self/statm says is mapped (elsewhere the cap caps nothing)
capped = pytest.mark.skipif(resource is None or not os.path.exists("/proc/self/statm"), reason="Linux RLIMIT_AS")


def test_the_collector_is_paused_inside_and_left_as_it_was() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still paused, and the outer block resumes it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # paused by someone else: still paused after the block
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("a failed load resumes it too")
    assert gc.isenabled()


@capped
def test_an_allocation_past_the_cap_is_a_memory_error_and_the_limit_comes_back() -> None:
    before = resource.getrlimit(resource.RLIMIT_AS)
    with address_space_capped(64 << 20):
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        assert soft != resource.RLIM_INFINITY and hard == before[1]
        with pytest.raises(MemoryError):
            bytearray(1 << 30)  # 1 GiB: far past 64 MiB more than is mapped
        small = bytearray(1 << 20)  # well under the cap: fine
        assert len(small) == 1 << 20
    assert resource.getrlimit(resource.RLIMIT_AS) == before


@capped
def test_a_tighter_limit_already_set_is_left_as_it_is() -> None:
    before = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    tight = mapped + (512 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (tight, before[1]))
    try:
        with address_space_capped(1 << 40):  # looser than the limit already set
            assert resource.getrlimit(resource.RLIMIT_AS) == (tight, before[1])
        assert resource.getrlimit(resource.RLIMIT_AS) == (tight, before[1])
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)


def test_releasing_free_memory_keeps_what_is_in_use() -> None:
    kept = bytearray(b"x" * 4096)
    release_free_memory()  # Arrow's pool and glibc's heap: nothing in use is touched
    assert kept == b"x" * 4096
