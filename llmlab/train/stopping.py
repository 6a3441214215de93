"""When a run stops before its last step: a signal, a budget (``train.max_time``,
``train.max_steps``), another rank, or a loss that is no longer a number."""

from __future__ import annotations

import math
import signal
import threading
import time

from llmlab import console
from llmlab.errors import UserError
from llmlab.train.distributed import any_rank


class StopPolicy:
    """SIGINT / SIGTERM ask the loop to finish its step, save a checkpoint and stop; a second
    SIGINT interrupts at once (handlers only in the main thread). The budgets stop the same
    way, and all ranks stop at the same step."""

    def __init__(self, loop, dist, device):
        self.loop, self.dist, self.device = loop, dist, device
        self.requested: str | None = None
        self.t_start = time.perf_counter()
        self._previous: dict = {}

    def check(self, done: int, steps: int) -> str | None:
        """After step ``done``: the reason to stop now, or None (the same on every rank)."""
        loop = self.loop
        if not self.requested:
            if loop.max_time is not None and time.perf_counter() - self.t_start >= loop.max_time:
                self.requested = f"train.max_time={loop.max_time:g}s"
            elif loop.max_steps is not None and loop.max_steps <= done < steps:
                self.requested = f"train.max_steps={loop.max_steps}"
        reason = self.requested  # one read: a signal may set it while the ranks agree
        if not any_rank(bool(reason), self.dist, self.device):
            return None  # a signal that came since is acted on at the next check
        if not reason:
            reason = self.requested = self.requested or "another rank"
        return reason

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        console.err.print(f"{self.requested}: finishing this step, then saving a checkpoint "
                          "(press ^C again to stop at once)", style="yellow")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def how_to_continue(reason: str, done: int, ckpt_path, run_dir, in_sweep: bool, branch_of=None) -> str:
    """``branch_of``: the run a cooldown branch leaves; its own command continues the branch."""
    same = "the same " + ("sweep command" if in_sweep else "command") + (
        " without train.max_steps" if reason.startswith("train.max_steps") else "")
    where = ("; finished jobs are skipped" if in_sweep else
             f" with hydra.run.dir={branch_of}: its finished part is skipped and this branch resumes" if branch_of
             else f" with hydra.run.dir={run_dir} (or train.resume={ckpt_path})")
    return f"stopped by {reason} after step {done}; checkpoint {ckpt_path}. To continue, run {same}{where}"


def check_finite(loss: float, step: int, last_good, what: str = "loss") -> None:
    if not math.isfinite(loss):
        raise UserError(f"training diverged: the {what} is {loss} at step {step}; nothing was saved after it. "
                        f"Last good checkpoint: {last_good or 'none'}. Try a lower optim.lr or train.grad_clip")
