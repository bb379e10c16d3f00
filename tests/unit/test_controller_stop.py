"""The daemon's main thread obeys SIGTERM even when the kernel hands the signal to another thread.

Python runs signal handlers only in the main thread, and only between bytecodes: a main thread blocked in
``Event.wait()`` with no timeout never runs the handler if the signal landed on the policy thread (one waiting on
squeue, say). CI saw exactly that: a controller that ignored SIGTERM and went on acting on later tests' jobs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading, time
    from nuro.slurm_plugins.controller.daemon import _wait_interruptibly

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def policy_thread():
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # delivered to this thread, not the main one
        time.sleep(30)

    threading.Thread(target=policy_thread, daemon=True).start()
    _wait_interruptibly(stop)  # stop.wait() here hangs until the timeout (Python 3.11, Linux)
    print("stopped")
    """
)


def _run(timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def test_main_thread_stops_when_another_thread_took_the_signal() -> None:
    done = _run(timeout_s=10)
    assert done is not None and done.returncode == 0 and "stopped" in done.stdout, done
