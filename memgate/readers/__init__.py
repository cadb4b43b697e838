"""Bounded, safe reading primitives every loader builds on: CSV, sqlite, pickle, JSON streams,
number text, conversions to int64, size and memory limits. They know no format; the loaders do."""
