"""The trainer in its own process: a disaggregated real run (`--placement disaggregated --train grpo`).

The rollout's engines keep generating while the trainer updates, as veRL's fully-async trainer
and one-step-off recipes run them on separate GPUs: the driver hands an update's samples to this
process and steps its engines until the update is done (`start`, `done`, `result`), then pushes
the weights at the sync (`save_weights` here, vLLM's reload in the engines). The process holds the
`rlsim.real.trainer.Trainer` (its model, optimizer and version) and answers one command at a time
over a pipe; it is spawned, so it shares no torch or OpenMP state with the driver's process.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from pathlib import Path
from typing import Any

from rlsim.errors import RlsimError


def _serve(conn, model: str, cfg) -> None:  # noqa: ANN001 - a Connection and a TrainerConfig
    """The child: build the trainer, then answer (command, args) until "close"."""
    try:
        from rlsim.real.trainer import Trainer

        trainer = Trainer(model, cfg)
        conn.send(("ok", trainer.threads))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, in one sentence
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        cmd, args = conn.recv()
        if cmd == "close":
            return
        try:
            if cmd == "update":
                t0 = time.perf_counter()
                metrics = trainer.update(args[0])
                conn.send(("ok", (metrics, time.perf_counter() - t0, trainer.version)))
            elif cmd == "save_weights":
                conn.send(("ok", str(trainer.save_weights(Path(args[0])))))
            elif cmd == "save_checkpoint":
                trainer.save_checkpoint(Path(args[0]), Path(args[1]) if args[1] else None)
                conn.send(("ok", None))
            elif cmd == "load_checkpoint":
                trainer.load_checkpoint(Path(args[0]))
                conn.send(("ok", trainer.version))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:  # noqa: BLE001 - the parent raises it
            conn.send(("error", traceback.format_exc(limit=3)))


class TrainerProcess:
    """The parent's handle: one update may run while the parent steps its engines."""

    def __init__(self, model: str, cfg) -> None:  # noqa: ANN001 - a TrainerConfig
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, model, cfg), daemon=True, name="rlsim-trainer")
        self._proc.start()
        child.close()
        self.threads = self._answer()
        self._busy = False
        self.version = 0

    def _answer(self) -> Any:  # noqa: ANN401
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise RlsimError("the trainer process exited (out of memory?)") from None
        if status != "ok":
            raise RlsimError(f"the trainer process failed: {value}")
        return value

    def call(self, cmd: str, *args: object) -> Any:  # noqa: ANN401
        """A command that blocks until answered (never while an update runs)."""
        if self._busy:
            raise RuntimeError(f"trainer asked {cmd!r} while an update runs")
        self._conn.send((cmd, args))
        return self._answer()

    def start(self, samples: list) -> None:
        """Begin one update on these samples; the parent goes on."""
        if self._busy:
            raise RuntimeError("an update already runs")
        self._conn.send(("update", (samples,)))
        self._busy = True

    @property
    def busy(self) -> bool:
        return self._busy

    def done(self) -> bool:
        return self._busy and self._conn.poll()

    def result(self) -> tuple[dict[str, float], float]:
        """The update's metrics and its seconds (waits for it)."""
        metrics, seconds, self.version = self._answer()
        self._busy = False
        return metrics, seconds

    def close(self) -> None:
        try:
            if self._busy:
                self._proc.kill()
            else:
                self._conn.send(("close", ()))
                self._proc.join(timeout=30)
        except (BrokenPipeError, OSError):
            pass
        if self._proc.is_alive():
            self._proc.kill()
