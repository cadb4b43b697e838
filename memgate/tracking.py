"""What a recording notes of the models and optimizers it was told to track: the storages of their
parameters, buffers, gradients and optimizer state, each with its address, at moments the trace marks.

``Recorder.track(model, optimizer)`` (or ``record(dir, track=[...])``) hands them to a
:class:`StorageTracker`. At each ``step()`` end, around each tracked optimizer's ``step()`` (its
pre- and post-step hooks, where gradients and state are surely live) and when recording stops, the
tracker notes, inside a ``torch.profiler.record_function("memgate::note#<k>")`` span:

- every tracked module's parameters, buffers and gradients (``p.grad``);
- every tracked optimizer's parameters and their gradients (its ``param_groups``) and its state
  tensors (the tensor values of ``optimizer.state[p]``: ``exp_avg``, ``exp_avg_sq``, ``step``...);

each storage once per moment, as (category, device, ``t.untyped_storage().data_ptr()``, the
storage's ``nbytes()``). The span puts the moment in the trace's own clock (and, where a snapshot
records history, in the snapshot's ``external_annotations``): no clock of this process is compared
with the profiler's. :meth:`manifest` is the recording manifest's ``tracked`` record
(schemas/recording.schema.json): the moments, and the storages as runs (a storage noted at
consecutive moments is one row, ``first`` to ``last`` moment), so a model's parameters are one row
each however many steps ran. The loader attributes the blocks by address and lifetime
(:mod:`memgate.categories`).

Modules and optimizers are held by weak references: tracking keeps nothing alive (a model a test
drops is not memory the test left behind). torch is never imported here: the recorder passes it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from typing import Any, Self

from memgate.categories import NOTE_PREFIX

STORAGE_COLUMNS = ("category", "device", "data_ptr", "nbytes", "first", "last")


class StorageTracker:
    """Notes the storages of tracked modules and optimizers (module docstring)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._modules: list[weakref.ref[Any]] = []
        self._optimizers: list[weakref.ref[Any]] = []
        self._hooks: list[Any] = []  # optimizer hook handles, removed at close()
        self.moments: list[dict[str, Any]] = []  # per moment: why, the step it falls in, time.time_ns()
        self._runs: list[list[Any]] = []  # STORAGE_COLUMNS per run
        self._open: dict[tuple[str, str, int, int], int] = {}  # noted at the last moment → its run
        self.step = 0  # the step the next moment falls in (the recorder's step() calls so far)
        self.active = False  # notes only while the recorder records

    def add(self, objects: Iterable[Any]) -> None:
        """Track modules and optimizers (an iterable of them, nested lists flattened); TypeError for anything else."""
        nn, optim = self._torch.nn, self._torch.optim
        for obj in objects:
            if isinstance(obj, nn.Module):
                if not any(ref() is obj for ref in self._modules):
                    self._modules.append(weakref.ref(obj))
            elif isinstance(obj, optim.Optimizer):
                if not any(ref() is obj for ref in self._optimizers):
                    self._optimizers.append(weakref.ref(obj))
                    self._hooks.append(obj.register_step_pre_hook(self._hook("optimizer step start")))
                    self._hooks.append(obj.register_step_post_hook(self._hook("optimizer step end")))
            elif isinstance(obj, (list, tuple, set)):
                self.add(obj)
            else:
                raise TypeError(f"track() takes torch.nn.Module and torch.optim.Optimizer objects, not "
                                f"{type(obj).__name__}")

    @property
    def tracking(self) -> bool:
        return bool(self._modules or self._optimizers)

    def _hook(self, why: str) -> Any:
        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.note(why)
        return hook

    def note(self, why: str) -> None:
        """One moment: every tracked storage, inside its ``memgate::note#<k>`` span."""
        if not self.active or not self.tracking:
            return
        k = len(self.moments)
        with self._torch.profiler.record_function(f"{NOTE_PREFIX}{k}"):
            seen = self._storages()
        self.moments.append({"at": why, "step": self.step, "t_ns": time.time_ns()})
        still: dict[tuple[str, str, int, int], int] = {}
        for key in seen:
            run = self._open.get(key)
            if run is not None and self._runs[run][5] == k - 1:
                self._runs[run][5] = k
            else:
                run = len(self._runs)
                self._runs.append([*key, k, k])
            still[key] = run
        self._open = still

    def _storages(self) -> dict[tuple[str, str, int, int], None]:
        """(category, device, data_ptr, nbytes) of every tracked storage now, each once per category."""
        found: dict[tuple[str, str, int, int], None] = {}

        def add(category: str, tensor: Any) -> None:
            if not isinstance(tensor, self._torch.Tensor):
                return
            located = self.locate(tensor)
            if located is not None:
                found[(category, *located)] = None

        for module in _alive(self._modules):
            for p in module.parameters():
                add("parameters", p)
                add("gradients", p.grad)
            for b in module.buffers():
                add("buffers", b)
        for optimizer in _alive(self._optimizers):
            for group in optimizer.param_groups:
                for p in group.get("params", ()):
                    add("parameters", p)
                    add("gradients", getattr(p, "grad", None))
            for state in list(optimizer.state.values()):
                if isinstance(state, dict):
                    for value in list(state.values()):
                        add("optimizer_state", value)
        return found

    def locate(self, tensor: Any) -> tuple[str, int, int] | None:
        """(device, data_ptr, nbytes) of a tensor's storage; None for one without memory of its own."""
        try:  # a sparse or meta tensor, a wrapper subclass without a storage of its own
            storage = tensor.untyped_storage()
            ptr, nbytes, device = int(storage.data_ptr()), int(storage.nbytes()), storage.device
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            return None
        if nbytes > 0 and ptr and device.type != "meta":
            return str(device), ptr, nbytes
        return None

    def close(self) -> None:
        """No more moments; the optimizer hooks removed."""
        self.active = False
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def manifest(self) -> dict[str, Any] | None:
        """The manifest's ``tracked`` record; None where nothing was tracked."""
        if not self.moments and not self.tracking:
            return None
        return {
            "modules": len(self._modules),
            "optimizers": len(self._optimizers),
            "moments": list(self.moments),
            "columns": list(STORAGE_COLUMNS),
            "storages": [list(run) for run in self._runs],
        }


def _alive(refs: list[weakref.ref[Any]]) -> list[Any]:
    return [obj for obj in (ref() for ref in refs) if obj is not None]


class TracksStorages:
    """What a recording (:class:`memgate.record.Recorder`) and an estimate
    (:class:`memgate.estimation.api.Estimator`) share about tracking: :meth:`track` before or after the
    start, the tracker made at the start, a moment at each step end and one at the stop."""

    def __init__(self, track: Any = ()) -> None:
        self._to_track: list[Any] = list(track) if isinstance(track, (list, tuple, set)) else [track]
        self._tracker: StorageTracker | None = None

    def track(self, *objects: Any) -> Self:
        """Note the storages of these models (``nn.Module``) and optimizers at every step end, around
        every optimizer step and at the stop (module docstring): the blocks live at the peak are then
        attributed to parameters, buffers, gradients, optimizer state and activations. Held by weak
        references; may be called before or after the start."""
        if self._tracker is None:
            self._to_track.extend(objects)
        else:
            self._tracker.add(objects)
        return self

    def _start_tracking(self, tracker: StorageTracker) -> None:
        """Hand ``tracker`` what :meth:`track` was given so far. What is no module or optimizer is a
        TypeError here, before anything starts (the tracker closed)."""
        try:
            tracker.add(self._to_track)
        except TypeError:
            tracker.close()
            raise
        self._tracker, self._to_track = tracker, []

    def _note_step_end(self, steps: int) -> None:
        """The moment at the end of step ``steps`` (0-based); later moments fall in the next step."""
        if self._tracker is not None:
            self._tracker.note("step end")
            self._tracker.step = steps + 1

    def _stop_tracking(self) -> None:
        if self._tracker is not None:
            self._tracker.note("stop")
            self._tracker.close()
