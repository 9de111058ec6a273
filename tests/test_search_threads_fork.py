"""A process forked while another thread holds the lock of the search threads
(`speed_paths.two_halves`) searches in parts in the child, without waiting
for a lock no thread of the child will release.

The scenario runs in a fresh interpreter: forked from a test worker that has
run other tests, a child can also inherit locks that the backends' own
threads held (XLA's, logging's), which is not what this tests."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD_SECONDS = 20

SCENARIO = f"""
import os, threading, time
import numpy as np
from keras_transformer.speed_paths import two_halves

parent_threads = two_halves._search_threads()
held, release = threading.Event(), threading.Event()

def hold_the_lock():
    with two_halves._SEARCH_THREADS_LOCK:
        held.set()
        release.wait()

holder = threading.Thread(target=hold_the_lock)
holder.start()
held.wait()
child = os.fork()
if child == 0:  # the child: exit code 0 once it searched in parts with threads of its own
    ok = False
    try:
        halves = two_halves.search_in_parts(lambda part: {{"x": np.asarray(part["x"]) * 2}}, {{"x": np.arange(4)}}, 2)
        ok = halves["x"].tolist() == [0, 2, 4, 6] and two_halves._search_threads() is not parent_threads
    finally:
        os._exit(0 if ok else 1)
release.set()
holder.join()
deadline = time.monotonic() + {CHILD_SECONDS}
while (finished := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if finished[0] == 0:
    os.kill(child, 9)
    os.waitpid(child, 0)
    raise SystemExit("the child still waited after {CHILD_SECONDS} s")
assert os.waitstatus_to_exitcode(finished[1]) == 0, "the child did not search in parts"
assert two_halves._search_threads() is parent_threads
print("ok")
"""


def test_a_child_forked_while_a_thread_holds_the_lock_searches_in_parts():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCENARIO)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
