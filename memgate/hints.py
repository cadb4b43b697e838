"""What to do about data a profile lacks, in the words of the tool that made it. Pure.

A "not measurable" reason says what is missing; the hint after it says how to record it, and that
depends on how the profile was made: the ``memgate_record`` fixture (``metadata["recorded_by"]``,
set by the plugin), ``torch.profiler`` (Kineto traces), ``torch_npu.profiler``, MindSpore's
profiler, msMemScope, CANN msprof, or allocator snapshots. Advice for one tool given to users of
another sends them the wrong way, so every hint is chosen here, by format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RECORDED_BY_FIXTURE = "memgate_record"


def recorded_by_fixture(metadata: Mapping[str, Any]) -> bool:
    return metadata.get("recorded_by") == RECORDED_BY_FIXTURE


def record_more_steps(fmt: str, metadata: Mapping[str, Any], needed: int, warmup: int) -> str:
    """How to record ``needed`` counted steps after ``warmup`` warm-up steps with the tool of ``fmt``."""
    total = needed + warmup
    lower = "or lower warmup_steps" if warmup else ""
    if recorded_by_fixture(metadata):
        calls = metadata.get("recorded_steps")
        done = f"this test called it {calls} time(s)" if isinstance(calls, int) else ""
        return _join(f"call memgate_record.step() once per training step, at least {total} times "
                     f"({needed} counted after {warmup} warm-up)", done, lower)
    if isinstance(metadata.get("estimate"), dict):  # memgate.estimate's snapshot: its steps are est.step() calls
        return _join(f"call est.step() once per training step of memgate.estimate, at least {total} times "
                     f"({needed} counted after {warmup} warm-up)", lower)
    schedule = f"schedule(wait=1, warmup=1, active={total})"
    active = f"record at least {total} active steps"
    by_format = {
        "kineto": f"{active}: torch.profiler.profile(..., {schedule}) and prof.step() once "
                  "per training step",
        "torch_npu": f"{active}: torch_npu.profiler.profile(..., torch_npu.profiler.{schedule}) "
                     "and prof.step() once per training step",
        "mindspore": f"{active}: mindspore.Profiler(..., mindspore.profiler.{schedule}) and "
                     "prof.step() once per training step",
        "msmemscope": f"{active}: call msmemscope.step() once per training step",
        "torch_snapshot": (f"a snapshot's steps are the ProfilerStep#N annotations torch.profiler adds while "
                           f"_record_memory_history() records: run both, with {schedule} and prof.step() once per "
                           f"training step, for at least {total} steps"),
        "cann": ("a CANN msprof profile has no step records: profile the run with torch_npu.profiler or "
                 f"MindSpore's profiler ({schedule}) or msMemScope (msmemscope.step() per step) instead"),
    }
    if fmt == "mindspore" and (why := _mindspore_no_steps(metadata)):
        return why  # no step is written at all: fewer warm-up steps would not help
    if fmt == "ascend_db":
        fmt = "cann" if metadata.get("export") == "msprof db" else "torch_npu"
    if fmt == "torch_recording":  # a snapshot beside a trace: the trace's steps count
        fmt = "kineto"
    text = by_format.get(fmt, active)
    return _join(text, lower if fmt != "cann" else "")


def no_memory_data(fmt: str, metadata: Mapping[str, Any]) -> str:
    """Why a device has neither an allocator series nor blocks, and how to record them."""
    if recorded_by_fixture(metadata):
        return ("no allocator series and no blocks: the test allocated no tensor memory while memgate_record "
                "recorded (it records with profile_memory=True)")
    how = {
        "kineto": "torch.profiler.profile(..., profile_memory=True) around code that allocates tensors",
        "torch_npu": "torch_npu.profiler.profile(..., profile_memory=True)",
        "ascend_db": "torch_npu.profiler.profile(..., profile_memory=True) or msprof --sys-hardware-mem=on",
        "mindspore": "mindspore.Profiler(profile_memory=True)",
        "msmemscope": "msMemScope with memory events (MALLOC/FREE) enabled",
        "torch_snapshot": "torch.cuda.memory._record_memory_history() before the run, then _dump_snapshot()",
        "torch_recording": "torch.profiler.profile(..., profile_memory=True) around code that allocates tensors",
        "cann": "msprof --sys-hardware-mem=on (or the framework profiler with profile_memory=True)",
    }.get(fmt, "a profiler that records memory")
    return f"no allocator series and no blocks (record with {how})"


MINDSPORE_CPU_TARGET = "CPU"
MINDSPORE_TRACKER_LAYOUT = "memory tracker memory_block.csv"


def _mindspore_no_steps(metadata: Mapping[str, Any]) -> str | None:
    """Where a MindSpore profile cannot hold steps whatever the profiler was asked: say so, not how to."""
    if metadata.get("target") == MINDSPORE_CPU_TARGET:
        return ("MindSpore writes no step marker on the CPU target (neither mindspore.Profiler nor "
                "mindspore.profiler.profile with a schedule and prof.step() leaves one in any file): step figures "
                "need a profile of an Ascend or GPU run, or another recorder that marks steps")
    if metadata.get("layout") == MINDSPORE_TRACKER_LAYOUT:
        return ("the memory tracker's memory_block.csv has no steps (its clock is an event counter, not time): "
                "profile the run with mindspore.Profiler(profile_memory=True, schedule=...) and prof.step() once "
                "per training step on Ascend or GPU for step figures")
    return None


def mindspore_tracker_cpu_pool() -> str:
    """Why a memory_block.csv holding only its header measures nothing (the CPU target's tracker output)."""
    return ("memory_block.csv holds no block: MindSpore's memory tracker skips every block of its CPU pool (a "
            "CPU-target run writes the header alone); a tracker run on Ascend or GPU writes them, and on the CPU "
            "target mindspore.Profiler(profile_memory=True) records the CPU pool's totals in "
            "FRAMEWORK/cpu_ms_memory_record_{rank}.txt")


def no_kineto_memory_events() -> tuple[str, str]:
    """(message, expected) for a Kineto trace without ``[memory]`` events."""
    return (("no [memory] events: the trace was recorded without profile_memory=True, or nothing allocated tensor "
            "memory while it recorded"),
            ("torch.profiler.profile(..., profile_memory=True) around code that allocates tensors, then "
            "export_chrome_trace()"))


def no_kineto_ops() -> str:
    """Why a Kineto trace's allocations name no operator, and how to record one."""
    return ("the trace has no operator spans (X events of cat cpu_op, or Operator before torch 1.10): no allocation "
            "can be attributed to an operator (record with ProfilerActivity.CPU among torch.profiler.profile's "
            "activities)")


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)
