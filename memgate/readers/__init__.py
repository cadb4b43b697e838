"""Bounded, safe reading primitives every loader builds on: CSV, sqlite, pickle, JSON streams (a Chrome
trace's events among them), number text, conversions to int64, size and memory limits. They know no
profiler's format; the loaders do."""
