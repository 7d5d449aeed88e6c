"""detour.stop: the resumable exit code and the SIGTERM / SIGINT handling that train, eval and study share."""

from __future__ import annotations

import os
import signal
import threading

from detour.stop import RESUMABLE_EXIT, STOP_SIGNALS, StopFlag, stop_signals_to


def test_the_resumable_exit_code_is_ex_tempfail():
    assert RESUMABLE_EXIT == 75 and set(STOP_SIGNALS) == {signal.SIGTERM, signal.SIGINT}


def test_a_signal_inside_the_block_is_recorded_and_the_old_handlers_come_back():
    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    # SIGINT's handler before the block: Python's default, or SIG_IGN under `nohup ... &`
    before_int = signal.getsignal(signal.SIGINT)
    try:
        flag = StopFlag()
        with stop_signals_to(flag) as handler:
            assert handler is flag and flag.signum == 0
            os.kill(os.getpid(), signal.SIGTERM)
            assert flag.signum == signal.SIGTERM and not seen
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C is a stop too, not a KeyboardInterrupt
            assert flag.signum == signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]  # the handler from before the block again
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_handlers_come_back_when_the_block_raises():
    before = signal.getsignal(signal.SIGTERM)
    try:
        with stop_signals_to(StopFlag()):
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_off_the_main_thread_the_block_runs_and_leaves_signals_alone():
    before = signal.getsignal(signal.SIGTERM)
    ran = []

    def work():
        with stop_signals_to(StopFlag()):
            ran.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert ran == [before] and signal.getsignal(signal.SIGTERM) is before
