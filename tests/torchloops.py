"""Real torch CPU training loops recorded with torch.profiler (profile_memory=True) as Kineto traces.

Each loop's memory behaviour is known by construction: a small ``nn.Sequential`` of Linear layers
with odd sizes (no tensor is a multiple of 512 bytes) trained on one fixed batch, plus a *pattern*
that plants ``torch.empty(n_bytes, dtype=torch.uint8)`` buffers (exactly ``n_bytes`` bytes each,
odd by default) or changes when the optimizer state and the gradients come and go.

Iteration ``i`` (0-based) of the loop is ``ProfilerStep#i`` in the trace: ``prof.step()`` is called
after every iteration, and ``schedule(wait=W, warmup=WU, active=A)`` records iterations
``W + WU .. W + WU + A - 1``. One more iteration runs after the window (the profiler is stopped by
then, as in the scripts of tests/data/samples/torch/PROVENANCE.md): nothing it does is in the trace.

The optimizer is SGD with momentum 0.9 (its momentum buffers are created in iteration 0, before
any window), plain SGD without state (``optimizer="sgd_plain"``), or Adam (``adam_lazy``); all with
foreach off, so that no multi-tensor kernels add temporaries.

Patterns (what the loop does besides forward / loss / backward / optimizer step):

- ``none``: nothing; zero_grad(set_to_none=True) before each backward frees the previous
  iteration's gradients, rebinding ``out`` / ``loss`` frees the previous ones.
- ``leak``: every iteration appends a new buffer to a Python list (never freed).
- ``leak_every_other``: the same on even iterations only.
- ``hold``: every iteration appends a buffer to ``deque(maxlen=hold_steps)``: the buffer of
  iteration ``i`` is freed during iteration ``i + hold_steps`` (when the append pushes it out;
  the new buffer is allocated first).
- ``adam_lazy``: Adam whose first ``opt.step()`` runs at iteration ``first_opt_step``: its state
  (``exp_avg``, ``exp_avg_sq`` like each parameter, plus a 0-dim float32 ``step`` tensor per
  parameter) is allocated then and kept.
- ``cache``: a dict gets one buffer at each iteration in ``cache_iterations``, kept forever.
- ``grad_accum``: no per-iteration zero_grad; every ``accum_steps`` iterations (at the end of
  iterations with ``(i + 1) % accum_steps == 0``) the optimizer steps and
  ``zero_grad(set_to_none=True)`` frees the gradients. Gradients are allocated by the first
  backward of a cycle and accumulated in place by the others.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

PATTERNS = ("none", "leak", "leak_every_other", "hold", "adam_lazy", "cache", "grad_accum")

# Odd layer sizes: 4-byte floats times odd counts, never a multiple of 512 bytes.
IN_FEATURES, HIDDEN, CLASSES, BATCH = 61, 127, 11, 33
N_BYTES = 300_007  # default planted buffer: odd, so a sum of them is recognisable


@dataclass(frozen=True)
class Loop:
    pattern: str = "none"
    wait: int = 1
    warmup: int = 1
    active: int = 6
    n_bytes: int = N_BYTES
    hold_steps: int = 3
    first_opt_step: int = 3
    cache_iterations: tuple[int, ...] = (3, 4)
    accum_steps: int = 2
    optimizer: str = "sgd"  # "sgd" (momentum 0.9), "sgd_plain" (no state), "adam"
    record_shapes: bool = False

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}; one of {PATTERNS}")

    @property
    def first_active(self) -> int:
        """The iteration (and ProfilerStep number) of the first recorded step."""
        return self.wait + self.warmup

    @property
    def active_iterations(self) -> list[int]:
        return list(range(self.first_active, self.first_active + self.active))

    @property
    def iterations(self) -> int:
        return self.wait + self.warmup + self.active + 1


def param_shapes() -> list[tuple[int, ...]]:
    """The model's parameters in ``model.parameters()`` order."""
    return [(HIDDEN, IN_FEATURES), (HIDDEN,), (CLASSES, HIDDEN), (CLASSES,)]


def param_bytes() -> int:
    """Bytes of all parameters (float32) = bytes of all gradients."""
    total = 0
    for shape in param_shapes():
        n = 1
        for d in shape:
            n *= d
        total += 4 * n
    return total


def adam_state_bytes() -> int:
    """Adam's lazily created state on CPU: exp_avg + exp_avg_sq per parameter, and a 0-dim float32
    ``step`` tensor per parameter (torch.optim.Adam, capturable=False, fused/foreach off on CPU)."""
    return 2 * param_bytes() + 4 * len(param_shapes())


def planted(loop: Loop) -> dict[int, int]:
    """Iteration -> bytes of the buffer the pattern allocates in it (by construction)."""
    its = range(loop.iterations)
    if loop.pattern in ("leak", "hold"):
        return {i: loop.n_bytes for i in its}
    if loop.pattern == "leak_every_other":
        return {i: loop.n_bytes for i in its if i % 2 == 0}
    if loop.pattern == "cache":
        return {i: loop.n_bytes for i in its if i in loop.cache_iterations}
    return {}


def record(path: str | Path, loop: Loop, *, seed: int = 0) -> Path:
    """Run ``loop`` under torch.profiler in this process and write its Chrome trace to ``path``.

    Prefer :func:`record_isolated` in tests: torch's CPU memory reporter keeps state across
    profiling sessions of one process (see there).
    """
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    path = Path(path)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    assert [tuple(p.shape) for p in model.parameters()] == param_shapes()
    optimizer = "adam" if loop.pattern == "adam_lazy" else loop.optimizer
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    elif optimizer == "sgd_plain":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    x = torch.randn(BATCH, IN_FEATURES)
    y = torch.randint(0, CLASSES, (BATCH,))
    kept: list[Any] = []
    held: collections.deque[Any] = collections.deque(maxlen=loop.hold_steps)
    cache: dict[int, Any] = {}

    def plant() -> Any:
        return torch.empty(loop.n_bytes, dtype=torch.uint8)

    def ready(p: Any) -> None:
        p.export_chrome_trace(str(path))

    sched = schedule(wait=loop.wait, warmup=loop.warmup, active=loop.active, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=loop.record_shapes,
                 with_stack=False, schedule=sched, on_trace_ready=ready) as prof:
        for i in range(loop.iterations):
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            if loop.pattern != "grad_accum":
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if loop.pattern == "grad_accum":
                if (i + 1) % loop.accum_steps == 0:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            elif loop.pattern != "adam_lazy" or i >= loop.first_opt_step:
                opt.step()
            if loop.pattern == "leak" or (loop.pattern == "leak_every_other" and i % 2 == 0):
                kept.append(plant())
            elif loop.pattern == "hold":
                held.append(plant())
            elif loop.pattern == "cache" and i in loop.cache_iterations:
                cache[i] = plant()
            prof.step()
    if not path.is_file():
        raise RuntimeError(f"torch.profiler wrote no trace to {path} (on_trace_ready not called)")
    return path


def record_isolated(jobs: Sequence[tuple[str | Path, Loop]], *, timeout: float = 300) -> None:
    """Record each ``(path, loop)`` in a process of its own that never profiled before.

    Why: torch's CPU allocator reporter (c10 ProfiledCPUMemoryReporter) remembers the size of every
    block allocated while memory profiling is on, and forgets it only when the block is freed while
    profiling is on. Blocks freed after the profiler stopped (the last step's gradients, a leak
    list) stay in its table and in its running total: a second recording in the same process starts
    with a ``Total Allocated`` baseline holding them (the committed cpu_train_leak sample starts at
    39724 B, exactly the clean run's last-step gradients + output + loss), and when the address of
    such a stale entry is reused by a block allocated before the next window (wait / warmup),
    freeing that block inside the window is reported as a free of the stale size, with no
    allocation. A fresh process has neither: ``Total Allocated`` starts at 0 and frees of blocks
    allocated before the window are not reported at all.

    One helper interpreter imports torch once (and torch._dynamo, which the first optimizer
    construction imports lazily: 1.6 s), then forks a child per job where fork exists (Linux,
    macOS); elsewhere each job gets its own interpreter.
    """
    payload = json.dumps([[str(path), asdict(loop)] for path, loop in jobs])
    done = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=payload, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"recording failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")


# Two profiling sessions in one process (see record_two_sessions): odd sizes, none a multiple of 512,
# none equal to a tensor of the model, so each is recognisable in a trace; their sum is 357_350.
STALE_SIZES = (100_003, 7_001, 333, 250_013)
HOLD_BYTES = 123_457  # the second session's one in-window buffer


def record_two_sessions(first: str | Path, second: str | Path, stale_sizes: Sequence[int] = STALE_SIZES,
                        hold_bytes: int = HOLD_BYTES, *, seed: int = 0) -> None:
    """Profile the same training loop twice, one session after the other, in this process.

    Each iteration is self-contained: ``train_step`` runs forward, loss, backward and the optimizer
    step, then ``zero_grad(set_to_none=True)`` and returns, so that nothing it allocated outlives
    it; only the SGD momentum buffers, created in iteration 0 of the first session (a wait
    iteration, before any window), and what the loop below keeps on purpose survive an iteration.

    First session, ``schedule(wait=1, warmup=1, active=3)``: ProfilerStep#2..#4. The last active
    iteration (#4) also allocates one ``torch.empty(n, dtype=torch.uint8)`` per ``stale_sizes``
    entry and keeps them in a list, which is dropped after the profiler stopped: the reporter never
    hears of those frees, so its running total keeps ``sum(stale_sizes)`` and its table keeps their
    addresses (freed memory, not live). One unprofiled iteration follows (training goes on).

    Second session, a new profiler object, ``schedule(wait=1, warmup=1, active=4)``: its steps are
    numbered from 0 again, ProfilerStep#2..#5. Iteration 3 allocates a ``hold_bytes`` buffer before
    its train_step and drops it after: the window's peak is in #3, ``hold_bytes`` above the peak
    of a plain step. No block allocated before this window is freed inside it (every iteration
    frees what it allocates), so no free in the window can hit a stale address of the table.
    """
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=False)
    x = torch.randn(BATCH, IN_FEATURES)
    y = torch.randint(0, CLASSES, (BATCH,))

    def train_step() -> float:
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.item())

    def session(path: Path, active: int, body: Any) -> None:
        def ready(p: Any) -> None:
            p.export_chrome_trace(str(path))

        sched = schedule(wait=1, warmup=1, active=active, repeat=1)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=False, schedule=sched,
                     on_trace_ready=ready) as prof:
            for i in range(2 + active):
                body(i)
                prof.step()
        if not path.is_file():
            raise RuntimeError(f"torch.profiler wrote no trace to {path} (on_trace_ready not called)")

    kept: list[Any] = []

    def first_body(i: int) -> None:
        train_step()
        if i == 4:  # the last active iteration
            kept.extend(torch.empty(n, dtype=torch.uint8) for n in stale_sizes)

    def second_body(i: int) -> None:
        held = torch.empty(hold_bytes, dtype=torch.uint8) if i == 3 else None
        train_step()
        del held

    session(Path(first), 3, first_body)
    kept.clear()  # freed while no profiler records
    train_step()  # unprofiled: the reporter neither adds nor forgets anything
    session(Path(second), 4, second_body)


# record_stale_reuse: a buffer above glibc's largest mmap threshold (32 MiB on 64-bit), so that malloc
# always maps it on its own and unmaps it on free: the next block of (about) its size gets its address.
BIG_STALE = 40_000_003
BIG_REUSE = BIG_STALE + 2  # the block that gets the stale address: not the same size
SMALL_STALE = 1_001
WINDOW_BUFFER = 5_003


def record_stale_reuse(first: str | Path, second: str | Path) -> bool:
    """Two sessions in this process where a block allocated between them lands on a stale address.

    First session (no schedule): keeps ``BIG_STALE`` and ``SMALL_STALE`` byte buffers, dropped after
    it stopped (both stay in the reporter's table and total). Between the sessions, unprofiled, a
    ``BIG_REUSE`` byte buffer is allocated: it gets the big stale buffer's address (returns whether
    it did). Second session: allocates ``WINDOW_BUFFER`` bytes, drops the pre-window buffer, drops
    its own buffer. The reporter finds the pre-window buffer's address in its table and reports
    its free, with the size the table holds for that address: ``-BIG_STALE``.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    def session(path: Path, body: Any) -> None:
        def ready(p: Any) -> None:
            p.export_chrome_trace(str(path))

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, on_trace_ready=ready):
            body()

    kept: list[Any] = []
    session(Path(first), lambda: kept.extend(torch.empty(n, dtype=torch.uint8) for n in (BIG_STALE, SMALL_STALE)))
    stale_address = kept[0].data_ptr()
    kept.clear()
    pre = [torch.empty(BIG_REUSE, dtype=torch.uint8)]
    reused = pre[0].data_ptr() == stale_address

    def second_body() -> None:
        own = torch.empty(WINDOW_BUFFER, dtype=torch.uint8)
        pre.clear()
        del own

    session(Path(second), second_body)
    return reused


CALLS: dict[str, Any] = {"record_two_sessions": record_two_sessions, "record_stale_reuse": record_stale_reuse}


def call_isolated(calls: Sequence[tuple[str, dict[str, Any]]], *, timeout: float = 300) -> list[Any]:
    """Run each ``(name, kwargs)`` of :data:`CALLS` in a process of its own that never profiled before
    (a fork of one helper interpreter that imported torch once, as :func:`record_isolated` does);
    their results (JSON values), in order."""
    payload = json.dumps([[name, kwargs] for name, kwargs in calls])
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--calls"], input=payload,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"recording failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
    results = [json.loads(line[len(_RESULT):]) for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if len(results) != len(calls):
        raise RuntimeError(f"{len(results)} results for {len(calls)} calls:\n{done.stdout}\n{done.stderr}")
    return results


_RESULT = "torchloops-result: "


def _call_forked(name: str, kwargs: dict[str, Any]) -> int:
    """Run one call of :data:`CALLS` in a forked child (where fork exists, else in an interpreter of
    its own); the child prints its result. The child's exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not hasattr(os, "fork"):
        one = json.dumps([[name, kwargs]])
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--calls"], input=one, text=True,
                              check=False).returncode
    return _in_fork(lambda: print(_RESULT + json.dumps(CALLS[name](**kwargs))))


def _in_fork(work: Callable[[], object]) -> int:
    """Run ``work`` in a forked child that leaves without running the parent's cleanup; its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:  # noqa: BLE001  (whatever happens, the child must not return into the loop)
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _loop_from_json(doc: dict[str, Any]) -> Loop:
    return Loop(**{**doc, "cache_iterations": tuple(doc["cache_iterations"])})


def _main(argv: list[str]) -> int:
    if argv[1:2] == ["--calls"]:
        calls = json.loads(sys.stdin.read())
        if len(calls) == 1:  # a process of its own already
            [[name, kwargs]] = calls
            print(_RESULT + json.dumps(CALLS[name](**kwargs)))
            return 0
        # Imported once here; each fork starts with them loaded.
        import torch
        import torch._dynamo
        import torch.optim
        import torch.profiler

        for name, kwargs in calls:
            if _call_forked(name, kwargs) != 0:
                print(f"{name}({kwargs}) failed", file=sys.stderr)
                return 1
        return 0
    jobs = [(path, _loop_from_json(doc)) for path, doc in json.loads(sys.stdin.read())]
    if argv[1:2] == ["--here"]:  # one interpreter per job (no fork)
        for path, loop in jobs:
            record(path, loop)
        return 0
    # Imported once here; each fork starts with them loaded.
    import torch
    import torch._dynamo
    import torch.nn
    import torch.optim
    import torch.profiler  # noqa: F401

    for path, loop in jobs:
        if not hasattr(os, "fork"):
            one = json.dumps([[path, asdict(loop)]])
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--here"], input=one, text=True, check=True)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if _in_fork(functools.partial(record, path, loop)) != 0:
            print(f"recording {path} ({loop}) failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))


def bare_trace_name(path: str | Path) -> None:
    """Rewrite ``traceName`` (the path given to export_chrome_trace) to the bare file name, as the
    committed samples have it (tests/data/samples/torch/PROVENANCE.md, section A). A text edit of
    that one value: every other byte of the trace stays as torch wrote it."""
    path = Path(path)
    text = path.read_text()
    pattern = re.compile(r'"traceName": "(?:[^"\\]|\\.)*"')
    assert len(pattern.findall(text)) == 1, "expected exactly one traceName"
    path.write_text(pattern.sub(lambda _: f'"traceName": {json.dumps(path.name)}', text))


# ---- the raw trace, read without memgate (what the tests compare memgate with) ----------------------


def raw_trace(path: Path) -> dict[str, Any]:
    """A recorded trace as JSON, µs times as Decimal (they do not survive a float)."""
    return json.loads(path.read_bytes(), parse_float=Decimal)  # type: ignore[no-any-return]


def step_spans(trace: dict[str, Any]) -> dict[int, tuple[Decimal, Decimal]]:
    """ProfilerStep number -> (start, end) in µs."""
    return {int(e["name"].split("#")[1]): (Decimal(e["ts"]), Decimal(e["ts"]) + Decimal(e["dur"]))
            for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")}


def memory_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``[memory]`` events in time order (file order on a tie)."""
    mem = [e for e in trace["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]
    return sorted(mem, key=lambda e: Decimal(e["ts"]))

