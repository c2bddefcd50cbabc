"""What ``jfa-conformance run`` shows while it runs: the warm-up's and the checks' progress per backend,
and what each process is compiling or checking now."""
from __future__ import annotations

import json
import time
from pathlib import Path


class WarmupView:
    """One progress bar per backend while the warm-up compiles: configurations done, compile seconds, and
    what each process is compiling now."""

    def __init__(self, console, jobs, enabled: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn("{task.fields[backend]:<18}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 disable=not enabled)
        self.tasks, self.seconds, self.now = {}, {}, {}
        totals: dict[str, int] = {}
        for job in jobs:
            totals[job.name] = totals.get(job.name, 0) + 1
        for name, total in totals.items():
            self.tasks[name] = self.progress.add_task(name, backend=name, info="compiling: waiting", total=total)
            self.seconds[name] = 0.0
        self.totals, self.done = totals, {name: 0 for name in totals}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def _info(self, name: str) -> str:
        now = [key for (backend, key) in self.now.values() if backend == name]
        doing = f"compiling {now[0]}" + (f" (+{len(now) - 1} more)" if len(now) > 1 else "") if now else "done"
        return f"{self.seconds[name]:.0f} s compile; {doing}"

    def status(self) -> str:
        """``fa4 14/24 (compiling bfloat16 d72 h4:2 none, +3 more); flex 36/36``: each backend's configurations
        done and what its processes compile now; "" once every one is done."""
        parts = []
        for name, total in self.totals.items():
            if self.done[name] >= total:
                continue
            now = [key for (backend, key) in list(self.now.values()) if backend == name]  # (another thread writes it)
            doing = f" (compiling {now[0]}" + (f", +{len(now) - 1} more)" if len(now) > 1 else ")") if now else ""
            parts.append(f"{name} {self.done[name]}/{total}{doing}")
        return "; ".join(parts)

    def started(self, worker: int, job) -> None:
        self.now[worker] = (job.name, job.config.key)
        self.progress.update(self.tasks[job.name], info=self._info(job.name))

    def finished(self, result) -> None:
        if result.worker is not None:
            self.now.pop(result.worker, None)
        self.seconds[result.backend] = self.seconds.get(result.backend, 0.0) + result.seconds
        self.done[result.backend] = self.done.get(result.backend, 0) + 1
        self.progress.update(self.tasks[result.backend], advance=1, info=self._info(result.backend))


class LiveView:
    """Per-backend progress bars fed by the recorder's JSON lines (verdict counts, seconds spent checking),
    and a line saying what each worker is checking now (from the workers' flight files)."""

    def __init__(self, console, enabled: bool, flight_dir: Path | None = None, compiling=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn("{task.fields[backend]:<18}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), console=console,
                                 disable=not enabled)
        self.tasks, self.counts, self.seconds, self.offset, self.buffer = {}, {}, {}, 0, ""
        self.flight_dir, self.now_task, self.last_look = flight_dir, None, 0.0
        # the warm-up beside the checks: a callable giving a line on what is compiling now ("" when done)
        self.compiling, self.compile_task = compiling, None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        for task in (self.now_task, self.compile_task):
            if task is not None:
                self.progress.remove_task(task)
        self.progress.__exit__(*exc)

    def _look(self) -> None:
        """Refresh the "compiling now" and "checking now" lines (at most once a second)."""
        self.last_look = time.monotonic()
        if self.compiling is not None:
            text = self.compiling()
            if self.compile_task is None and text:
                self.compile_task = self.progress.add_task("compiling", backend="compiling now", counts=text, total=None)
            elif self.compile_task is not None:
                self.progress.update(self.compile_task, counts=text or "done")
        text = self.running_now()
        if self.now_task is None and text:
            self.now_task = self.progress.add_task("now", backend="checking now", counts=text, total=None)
        elif self.now_task is not None:
            self.progress.update(self.now_task, counts=text)

    def _task(self, backend: str, total=None):
        if backend not in self.tasks:
            self.counts[backend], self.seconds[backend] = {}, 0.0
            self.tasks[backend] = self.progress.add_task(backend, backend=backend, counts="", total=total)
        return self.tasks[backend]

    def running_now(self) -> str:
        """``gw3 fa4 gradients [bfloat16] 12 s; ...``: the check each worker is on, longest first."""
        if self.flight_dir is None:
            return ""
        rows = []
        for path in Path(self.flight_dir).glob("*.json"):
            try:
                flight = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if "started" not in flight or "backend" not in flight:
                continue
            what = f"waiting for {flight['backend']}'s warm-up" if flight.get("waiting") else \
                f"probing {flight['backend']}" if flight.get("probe") else \
                f"{flight['backend']} {flight.get('feature', '')}" + \
                (f" [{flight['dtype']}]" if flight.get("dtype") else "")
            elapsed = time.time() - flight["started"]
            rows.append((elapsed, f"{path.stem} {what} {elapsed:.0f} s"))
        rows.sort(reverse=True)
        return "; ".join(text for _, text in rows[:6]) + (f"; +{len(rows) - 6} more" if len(rows) > 6 else "")

    def feed(self, path: Path) -> None:
        if (self.flight_dir is not None or self.compiling is not None) and time.monotonic() - self.last_look > 1.0:
            self._look()
        try:
            with open(path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("kind") == "collected":
                totals: dict[str, int] = {}
                for check in entry["checks"]:
                    totals[check["backend"]] = totals.get(check["backend"], 0) + 1
                for backend, total in totals.items():
                    self.progress.update(self._task(backend), total=total)
            elif entry.get("kind") == "record":
                backend = entry["backend"]
                task = self._task(backend)
                counts = self.counts[backend]
                counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
                self.seconds[backend] += entry.get("duration_s") or 0.0
                self.progress.update(task, advance=1,
                                     counts=f"{_counts_markup(counts)} [dim]{self.seconds[backend]:.0f} s checking[/]")


def _counts_markup(counts: dict) -> str:
    style = {"pass": "green", "fail": "bold red", "crash": "bold magenta", "timeout": "bold yellow",
             "not-run": "red", "unsupported": "dim", "expected-fail": "blue"}
    return " ".join(f"[{style.get(o, '')}]{n} {o}[/]" for o, n in sorted(counts.items()))
