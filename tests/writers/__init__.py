"""Test-side writers: render a ground-truth :class:`groundtruth.Trace` in a profiler's file format.

Each writer follows docs/formats-reference.md (and the real samples) only; none imports memgate.
"""
