"""torchrun for a study's training step of several processes, with an exit status the study can read.

    python -m detour.study.torchrun --standalone --nproc-per-node 2 -m detour.cli train RECIPE --out OUT

This is torch's own launcher (torch.distributed.run), unchanged but for its exit status. torchrun
exits 1 both when a rank fails and when the ranks were stopped: a SIGTERM to torchrun (its
SignalException; it passes the signal on and waits for the ranks, which save a checkpoint) or to
the ranks themselves (each exits 75 after saving). A study must resume a stopped step and report a
failed one, so here a stop exits 75 (detour.stop.RESUMABLE_EXIT) and a failure 1.
"""

from __future__ import annotations

import sys

from detour.stop import RESUMABLE_EXIT


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        print(f"torchrun: stopped by signal {exc.sigval.name}; the ranks were passed it and saved what they "
              "could", file=sys.stderr, flush=True)
        return RESUMABLE_EXIT
    except ChildFailedError as exc:
        if {failure.exitcode for failure in exc.failures.values()} == {RESUMABLE_EXIT}:
            print("torchrun: every rank stopped and saved (exit 75)", file=sys.stderr, flush=True)
            return RESUMABLE_EXIT
        print(exc, file=sys.stderr, flush=True)  # torchrun's table of the failed ranks, as it prints it
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
