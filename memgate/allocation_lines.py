"""Where a recording's blocks were allocated, to the line: a torch function mode that wraps each torch
call made from the user's code in a ``memgate::at <frames>`` profiler span.

Kineto's Python tracer records where each function *starts* (its ``def`` line), so the trace alone
places an allocation in a function, never on the line that allocated. While a :class:`~memgate.record.Recorder`
records, :class:`AllocationLines` (a ``torch.overrides.TorchFunctionMode``) sees every torch function
and tensor method the user's code calls (``torch.empty``, ``model(x)``'s ``F.linear``, ``loss.backward()``,
the ``torch._foreach_*`` calls of ``opt.step()``), finds the user's frames on the stack (code outside the
standard library, installed packages, torch and memgate), and runs the call inside
``torch.profiler.record_function("memgate::at f (file.py:18) <- g (file.py:40)")``: innermost frame
first, each at the line it is executing, spelled as owners are (:func:`memgate.owners.frame_owner`). An allocation's ``[memory]`` event then lies inside the span of
the line that caused it, in the trace's own clock (no clock of this process is compared with the
profiler's). :func:`memgate.record.allocation_stacks` reads these spans back.

Only the outermost torch call from user code is wrapped (torch's own calls inside it run with the mode
paused, as torch function modes do), so a span costs one ``record_function`` per user-level call.
torch is never imported here: the recorder passes it.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any

from memgate.owners import frame_owner

SPAN_PREFIX = "memgate::at "
FRAME_SEPARATOR = " <- "
DEPTH = 4  # user frames kept per span, innermost first (memgate.record.STACK_DEPTH)


def span_frames(name: str) -> list[str] | None:
    """The frames of a ``memgate::at`` span's name, innermost first; None for any other name."""
    if not name.startswith(SPAN_PREFIX):
        return None
    return [frame for frame in name[len(SPAN_PREFIX):].split(FRAME_SEPARATOR) if frame]


def make_mode(torch: Any, is_user_file: Any) -> Any:
    """An :class:`AllocationLines` mode for ``torch``: ``is_user_file(filename) -> bool`` says which code is
    the user's. Frames are spelled as owners are (:func:`memgate.owners.frame_owner`)."""
    base = torch.overrides.TorchFunctionMode
    record_function = torch.profiler.record_function

    class AllocationLines(base):  # type: ignore[misc, valid-type]  # torch's class, known at run time
        def __init__(self) -> None:
            super().__init__()
            self._user: dict[CodeType, bool] = {}  # code object → whether it is the user's
            self._text: dict[tuple[CodeType, int], str] = {}  # (code, line) → its frame's text

        def _frame(self, code: CodeType, line: int) -> str | None:
            user = self._user.get(code)
            if user is None:
                user = self._user[code] = bool(is_user_file(code.co_filename))
            if not user:
                return None
            text = self._text.get((code, line))
            if text is None:
                text = self._text[(code, line)] = frame_owner(code.co_filename, line, code.co_name)
            return text

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            frames: list[str] = []
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and len(frames) < DEPTH:
                text = self._frame(frame.f_code, frame.f_lineno)
                if text is not None:
                    frames.append(text)
                frame = frame.f_back
            if not frames:
                return func(*args, **(kwargs or {}))
            with record_function(SPAN_PREFIX + FRAME_SEPARATOR.join(frames)):
                return func(*args, **(kwargs or {}))

    return AllocationLines()
