"""Writing results: run directories, the Gantt timeline, the Chrome/Perfetto trace, bar plots.

A run directory holds `config.json`, `steps.parquet`, `requests.parquet`, `summary.json`,
`timeline.png` (busy intervals of every rollout instance, step boundaries dashed) and
`trace.json` (Chrome trace-event format: open it in ui.perfetto.dev or chrome://tracing; one
track per instance, one slice per busy interval, steps on their own track, and the trainer's
`update` and `sync` slices on its own). Files are written
to a temporary name and renamed, so an interrupted write never leaves a half file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlsim.files import atomic_save, atomic_write_bytes, save_figure, write_error
from rlsim.result import Result


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def to_json(obj: Any) -> str:
    return json.dumps(_clean(obj), indent=2, default=str)


def perfetto_trace(result: Result) -> dict[str, Any]:
    """Chrome trace events: instance busy slices and step slices (microseconds)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"rlsim {result.policy}"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "RL steps"}},
    ]
    for _, row in result.steps.iterrows():
        events.append(
            {
                "name": f"step {int(row['step'])}",
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "ts": row["time/start"] * 1e6,
                "dur": (row["time/end"] - row["time/start"]) * 1e6,
                "args": {k: row[k] for k in ("timing_s/gen", "bubble_ratio", "num_samples")},
            }
        )
    trainer = len(result.segments) + 1  # the trainer's track: its update, then a sync that stops the rollout
    events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": trainer, "args": {"name": "trainer"}})
    for _, row in result.steps.iterrows():
        start, end = row.get("time/train_start", np.nan), row["time/end"]
        sync = row.get("time/sync_start", np.nan)
        if not np.isfinite(start):
            continue
        for name, a, b in (("update", start, sync if np.isfinite(sync) else end), ("sync", sync, end)):
            if np.isfinite(a) and b > a:
                events.append({"name": name, "ph": "X", "pid": 0, "tid": trainer, "ts": a * 1e6, "dur": (b - a) * 1e6})
    for i, segs in enumerate(result.segments):
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": i + 1,
                "args": {"name": f"instance {i}"},
            }
        )
        events += [
            {
                "name": "rollout",
                "ph": "X",
                "pid": 0,
                "tid": i + 1,
                "ts": s * 1e6,
                "dur": (e - s) * 1e6,
            }
            for s, e in segs
        ]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot_timeline(result: Result, out: Path) -> Path:
    """Gantt chart of instance busy intervals with step boundaries."""
    fig = timeline_figure(result)
    import matplotlib.pyplot as plt

    try:
        save_figure(fig, out)
    finally:
        plt.close(fig)
    return out


def timeline_figure(result: Result):  # noqa: ANN201 - a matplotlib Figure
    """The figure `plot_timeline` writes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(result.segments)
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.18 * n), dpi=110)
    for i, segs in enumerate(result.segments):
        ax.broken_barh([(s, e - s) for s, e in segs], (i - 0.4, 0.8), color="tab:blue")
    for t in result.steps["time/start"]:
        ax.axvline(t, color="grey", ls="--", lw=0.6)
    ax.set_xlabel("simulated time (s); dashed: step starts")
    ax.set_ylabel("rollout instance")
    ax.set_ylim(-0.6, n - 0.4)
    fit_title(fig, ax, f"{result.policy}: instance busy time (blue), bubble ratio {result.summary['bubble_ratio']:.0%}")
    return fig


def fit_title(fig, ax, text: str, **kwargs) -> None:  # noqa: ANN001, ANN003 - a matplotlib Figure and Axes
    """Set `ax`'s title, wrapped (a long policy string, which has no spaces, cut where it must) until
    its box lies inside the figure; then lay the figure out tightly around it."""
    import textwrap

    title = ax.set_title(text, **kwargs)
    fig.tight_layout()
    for _ in range(8):
        fig.canvas.draw()
        box, page = title.get_window_extent(), fig.bbox
        if box.x0 >= page.x0 and box.x1 <= page.x1 and box.y1 <= page.y1:
            return
        # the widest line, shortened by the share of the box that overhangs (and a little more)
        half = min(box.x1 - box.x0, 2 * min((box.x0 + box.x1) / 2 - page.x0, page.x1 - (box.x0 + box.x1) / 2))
        widest = max(map(len, title.get_text().splitlines()))
        chars = max(10, int(widest * half / max(box.x1 - box.x0, 1.0)) - 2)
        title.set_text("\n".join(textwrap.wrap(text, chars, break_long_words=True, break_on_hyphens=False)))
        fig.tight_layout()


def write_run_dir(result: Result, out: Path, swap: bool = True) -> Path:
    """Write every file of a run directory. With `swap` (a simulated run), all at once: into a
    temporary sibling directory that replaces `out` only when complete, so a run killed while
    writing never leaves a directory that mixes two runs (an existing `out` stays whole until the
    swap). Without it (a real run's directory, which holds the run's other files), file by file,
    each atomically."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not swap:
            out.mkdir(exist_ok=True)
            _write_files(result, out)
            return out
        _remove_orphans(out)
    except OSError as exc:
        raise write_error(out, exc) from None
    mine = f".{out.name}.{os.getpid()}."
    old = out.with_name(f"{mine}old")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=mine, suffix=".tmp", dir=out.parent))
        _write_files(result, tmp)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException as exc:
        _undo_swap(out, mine, old)
        if isinstance(exc, OSError):
            raise write_error(out, exc) from None
        raise
    return out


def _undo_swap(out: Path, mine: str, old: Path) -> None:
    """What an interrupted swap leaves (a SIGTERM or Ctrl-C can land between any two steps),
    taken back: the earlier directory put back where the swap had moved it aside, and this
    process's temporary folders removed, one made before its name was even returned included."""
    if old.exists():
        if out.exists():  # the swap was done: only the earlier directory's removal was cut short
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.rename(out)
    for path in out.parent.iterdir():
        if path.name.startswith(mine) and path.name.endswith(".tmp"):
            shutil.rmtree(path, ignore_errors=True)


def _remove_orphans(out: Path) -> None:
    """Remove what a writer of `out` killed outright left beside it (`.NAME.PID.*.tmp` being written,
    `.NAME.PID.old` being swapped out), where that process is gone: a SIGKILL runs no clean-up."""
    for path in out.parent.glob(f".{out.name}.*"):
        parts = path.name[len(out.name) + 2 :].split(".")  # PID, tmp's random part, tmp; or PID, old
        ours = parts[-1:] == ["old"] and len(parts) == 2 or parts[-1:] == ["tmp"] and len(parts) == 3
        if ours and path.is_dir() and parts[0].isdigit() and not _alive(int(parts[0])):
            shutil.rmtree(path, ignore_errors=True)  # (`.run.2.PID...` of a run named run.2 has 4 parts)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _write_files(result: Result, out: Path) -> None:
    atomic_write_bytes(out / "config.json", to_json(result.config).encode())
    for name, frame in (("steps", result.steps), ("requests", result.requests)):
        atomic_save(out / f"{name}.parquet", lambda tmp, f=frame: f.to_parquet(tmp, compression="zstd", index=False))
    atomic_write_bytes(out / "summary.json", to_json(result.summary).encode())
    atomic_write_bytes(out / "trace.json", json.dumps(perfetto_trace(result)).encode())
    plot_timeline(result, out / "timeline.png")


def plot_compare(rows: list[dict[str, Any]], out: Path) -> Path:
    """Bars of epoch time per policy (one bar group per epoch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = sorted({e for r in rows for e in r["epoch_time_s"]})
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    width = 0.8 / max(1, len(rows))
    for k, r in enumerate(rows):
        x = np.arange(len(epochs)) + k * width
        label = r["policy"] + (f" ({r['rollout_engine']})" if "rollout_engine" in r else "")
        ax.bar(x, [r["epoch_time_s"].get(e, 0) / 3600 for e in epochs], width, label=label)
    ax.set_xticks(np.arange(len(epochs)) + width * (len(rows) - 1) / 2, [f"epoch {e}" for e in epochs])
    ax.set_ylabel("epoch wall time (hours)")
    ax.set_title("Epoch time per policy")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        save_figure(fig, out)
    finally:
        plt.close(fig)
    return out
