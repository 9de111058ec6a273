"""A process forked while another thread holds the lock of the search threads
(`speed_paths.two_halves`) searches in parts in the child, without waiting
for a lock no thread of the child will release."""

import os
import threading
import time

import numpy as np

from keras_transformer.speed_paths import two_halves

CHILD_SECONDS = 20


def test_a_child_forked_while_a_thread_holds_the_lock_searches_in_parts():
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
            halves = two_halves.search_in_parts(lambda part: {"x": np.asarray(part["x"]) * 2}, {"x": np.arange(4)}, 2)
            ok = halves["x"].tolist() == [0, 2, 4, 6] and two_halves._search_threads() is not parent_threads
        finally:
            os._exit(0 if ok else 1)
    release.set()
    holder.join()
    deadline = time.monotonic() + CHILD_SECONDS
    while (finished := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if finished[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert finished[0] == child, f"the child still waited after {CHILD_SECONDS} s"
    assert os.waitstatus_to_exitcode(finished[1]) == 0
    assert two_halves._search_threads() is parent_threads
