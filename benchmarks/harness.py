"""The one way the benchmarks run a measured command: :func:`run`, in a fresh process.

Every section starts its measured runs here (``gnnscale fit``/``plan``/``prepare``, a recipe's
``train.py``, ``torchrun``, a benchmark script of its own) and gets back a :class:`Run`: its
output, wall seconds, CPU seconds, the peak resident memory of its largest process, the
metrics of its CSV logs and, when asked, the peaks of every process of its tree, sampled by
``gnnscale.measure.ProcessTreeMemory``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from gnnscale.measure import ProcessTreeMemory, read_metrics

TIMEOUT_S = 4 * 3600
MARK = "HARNESS_FIGURES"
# Runs a script, a module (-m) or code (-c) in this same process, then prints, as its last
# line, the peak resident memory of its largest process (VmHWM: this one, or a child it waited
# for: DDP ranks started with fork, loader workers), in KiB, and the CPU seconds of all of
# them, user and system. Only the standard library, so it runs under any Python (the peers' own
# too). Not ``ru_maxrss`` of this process, which carries the peak of the process that started
# it across ``exec``.
RUNNER = """
import json, os, resource, runpy, sys
entry, *sys.argv[1:] = sys.argv[1:]
if group := os.environ.pop("HARNESS_CGROUP", ""):  # its processes and the pages they read
    with open(os.path.join(group, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
try:
    if entry == "-m":
        module, *sys.argv[1:] = sys.argv[1:]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif entry == "-c":
        code, *sys.argv[1:] = sys.argv[1:]
        sys.argv[0] = "-c"
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv[0] = entry
        sys.path[0] = os.path.dirname(os.path.abspath(entry))  # as `python script` does
        runpy.run_path(entry, run_name="__main__")
except SystemExit as done:
    if done.code not in (None, 0):
        raise
with open("/proc/self/status") as status:
    own = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
mine = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
figures = {
    "peak_kib": max(own, children.ru_maxrss),
    "user_s": mine.ru_utime + children.ru_utime,
    "system_s": mine.ru_stime + children.ru_stime,
}
print("\\n" + MARK, json.dumps(figures), flush=True)
""".replace("MARK", repr(MARK))


def number(pattern: str, text: str) -> float:
    """The first number after ``pattern`` in ``text`` (commas allowed)."""
    match = re.search(pattern + r"\s+([\d,.]+)", text)
    if match is None:
        raise RuntimeError(f"{pattern!r} not found in the output:\n{text[-2000:]}")
    return float(match.group(1).replace(",", ""))


@dataclass
class Run:
    """What one command measured.

    Args:
        argv: The command as given (its Python first).
        returncode: Its exit status.
        stdout: Its standard output.
        stderr: Its standard error.
        wall_s: Seconds from its start to its end.
        peak_mb: Peak resident memory of its largest process (``VmHWM``): the command's own, or
            a child's that it waited for (a forked DDP rank, a loader worker). 0 if it failed.
        cpu_s: User and system seconds of it and of every process it waited for.
        system_s: The system (kernel) part of ``cpu_s``.
        metrics: Every column of every ``metrics.csv`` under ``logs``, in the files' order (a DDP
            fit logs its final test as a second version).
        memory: Its process tree's peaks, sampled (``run(sample_s=...)``), or ``None``.
        timed_out: It ran past ``run(timeout_s=...)`` and was killed.
    """

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_mb: float = 0.0
    cpu_s: float = 0.0
    system_s: float = 0.0
    metrics: dict[str, list[float]] = field(default_factory=dict)
    memory: ProcessTreeMemory | None = None
    timed_out: bool = False

    @property
    def output(self) -> str:
        """Its standard output, then its standard error."""
        return self.stdout + self.stderr


def run(
    argv: list[str],
    *,
    cwd: Path | None = None,
    logs: Path | None = None,
    workers: int | None = None,
    precision: str | None = None,
    threads: int | None = None,
    env: dict[str, str] | None = None,
    sample_s: float | None = None,
    pss_depth: int | None = None,
    check: bool = True,
    timeout_s: float = TIMEOUT_S,
    cgroup: Path | None = None,
) -> Run:
    """Run ``argv`` in a fresh process and measure it.

    Args:
        argv: ``[python, script, args...]``, ``[python, -m, module, ...]`` or ``[python, -c,
            code, ...]``: the Python that runs it first.
        cwd: Its working directory.
        logs: The folder its CSV logger writes into (``--trainer.logger.init_args.save_dir``,
            given in ``argv``): read into :attr:`Run.metrics` once it ends.
        workers: Loader workers (a ``gnnscale`` command's ``data.loader.num_workers``,
            persistent when above 0).
        precision: A ``gnnscale`` command's ``trainer.precision``.
        threads: Torch threads of its processes (``OMP_NUM_THREADS``).
        env: Variables set for it on top of this process's.
        sample_s: Sample its process tree at this interval (:attr:`Run.memory`).
        pss_depth: With ``sample_s``: also the summed PSS from this depth of the tree down.
        check: Raise if it fails, with the end of its error output.
        timeout_s: Kill it after this many seconds.
        cgroup: A cgroup folder it joins first (:func:`memory_limit`'s): a memory limit then
            holds its processes and the page cache they fill.
    """
    python, *rest = argv
    if workers is not None:
        rest += [
            f"--data.init_args.loader.num_workers={workers}",
            f"--data.init_args.loader.persistent_workers={str(workers > 0).lower()}",
        ]
    if precision is not None:
        rest.append(f"--trainer.precision={precision}")
    variables = {**os.environ, **(env or {})}
    if cgroup is not None:
        variables["HARNESS_CGROUP"] = str(cgroup)
    if threads is not None:
        variables["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", RUNNER, *rest],
        cwd=cwd,
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = ProcessTreeMemory(proc.pid, sample_s, pss_depth) if sample_s else nullcontext()
    timed_out = False
    with sampler:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
    out, mark, figures = out.rpartition(f"\n{MARK} ")
    if not mark:  # it failed before the runner could print
        out, figures = figures, ""
    result = Run(list(argv), proc.returncode, out, err, time.perf_counter() - start)
    result.memory = sampler if isinstance(sampler, ProcessTreeMemory) else None
    result.timed_out = timed_out
    if proc.returncode != 0 or not mark:
        if check:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-3000:]}")
        return result
    measured = json.loads(figures)
    result.peak_mb = measured["peak_kib"] / 1024
    result.cpu_s = measured["user_s"] + measured["system_s"]
    result.system_s = measured["system_s"]
    for path in sorted(logs.rglob("metrics.csv")) if logs is not None else []:
        for key, values in read_metrics(path).items():
            result.metrics.setdefault(key, []).extend(values)
    return result


@contextlib.contextmanager
def memory_limit(gib: float) -> Iterator[Path | None]:
    """A new memory cgroup limited to ``gib``, for :func:`run`'s ``cgroup``; removed after.

    Made under this process's own in cgroup v1's memory hierarchy (the page cache counts
    against its limit); ``None`` where there is none or this process may not make one.
    """
    group, limited = None, False
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        own = next(line.split(":", 2)[2] for line in lines if ":memory:" in line)
        path = Path("/sys/fs/cgroup/memory", own.lstrip("/"), f"gnnscale-bench-{os.getpid()}")
        path.mkdir()
        group = path
        (path / "memory.limit_in_bytes").write_text(str(int(gib * 2**30)))
        limited = True
    try:
        yield group if limited else None
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()
