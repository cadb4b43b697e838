"""The snapshot family: torch's ``_dump_snapshot`` pickles (CUDA and torch_npu), read by
:mod:`~memgate.loaders.snapshot.snapshot` over its parts (segments, trace, stacks, steps, the allocator's
block sizes)."""
