"""Test-side writers: render a ground-truth :class:`groundtruth.Trace` in a profiler's file format.

Each writer follows FORMATS.md (and the real samples) only; none imports memgate.
"""
