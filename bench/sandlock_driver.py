"""Throughput of sandlock's Python API, for bench/peers.py and bench/startup.py (run with the
interpreter of the virtual environment bench/setup-peers.sh installs sandlock into).

Usage: sandlock_driver.py run|fork SECONDS SCRATCH

- `run`: a new `Sandbox(...).run(["/bin/true"])` each time, one after the other: a fresh
  sandbox per run, as a cold start.
- `fork`: sandlock's fork API: one sandbox whose `init_fn` ran once, then `fork(64)` again and
  again, each clone exec'ing `/bin/true`. The clones share that one sandbox (its Landlock domain,
  its seccomp supervisor, its limits): they are not isolated from one another.

Prints one JSON line: runs, wall seconds, CPU seconds of this process and its reaped children
(getrusage), and sandlock's version. Policy: the closest to palisade's default that sandlock has
(system directories readable, one writable scratch directory, no network, a cleared environment).
"""

import json
import os
import resource
import sys
import time

import sandlock
from sandlock import Sandbox

READ = ["/usr", "/lib", "/lib64", "/bin", "/etc"]


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main():
    mode, seconds, scratch = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    readable = [p for p in READ if os.path.exists(p)]
    policy = dict(fs_readable=readable, fs_writable=[scratch], clean_env=True, cwd=scratch)
    runs = 0
    if mode == "run":
        assert Sandbox(**policy).run(["/bin/true"]).success
        c0, t0 = cpu(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            r = Sandbox(**policy).run(["/bin/true"])
            if not r.success:
                sys.exit(f"sandlock run failed: {r}")
            runs += 1
    elif mode == "fork":
        def work(_clone):
            os.execv("/bin/true", ["/bin/true"])

        sb = Sandbox(**policy, init_fn=lambda: None, work_fn=work)
        sb.fork(8)
        c0, t0 = cpu(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            runs += len(sb.fork(64).pids)
    else:
        sys.exit(f"unknown mode {mode}")
    wall = time.monotonic() - t0
    print(json.dumps({"runs": runs, "wall_s": wall, "cpu_s": cpu() - c0, "version": sandlock.__version__}))


if __name__ == "__main__":
    main()
