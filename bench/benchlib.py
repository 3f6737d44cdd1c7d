"""Pieces shared by the benchmark scripts: command quoting, the bubblewrap equivalent of palisade's
default policy, percentile summaries and the run's metadata."""

import datetime
import os
import platform
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The build the benchmarks run: release, or debug for CI's --quick runs (bench/build.sh says why).
PROFILE = os.environ.get("PALISADE_BENCH_PROFILE") or "release"
# cargo's own rule: CARGO_TARGET_DIR if set (relative to where cargo ran, here the repository root).
BIN_DIR = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", PROFILE)
PALISADE = os.path.join(BIN_DIR, "palisade")


def check_profile(quick):
    """Refuses a build other than release unless the run is a --quick one, which publishes
    nothing: a debug build's figures are not palisade's."""
    if PROFILE not in ("release", "debug"):
        raise SystemExit(f"PALISADE_BENCH_PROFILE must be release or debug, not {PROFILE!r}")
    if PROFILE != "release" and not quick:
        raise SystemExit(f"PALISADE_BENCH_PROFILE={PROFILE} is accepted only with --quick (a {PROFILE} build's "
                         "figures are not palisade's); unset it, or set it to release")


def quote(args):
    """One shell-style string for an argv, as hyperfine -N splits it and as the results show it."""
    safe = "/-_.=:,+@"
    return " ".join(a if a and all(c.isalnum() or c in safe for c in a) else "'" + a.replace("'", "'\\''") + "'"
                    for a in args)


def bwrap_cmd(scratch, payload, caps=False):
    """bubblewrap with the closest equivalent of palisade's default policy: every namespace, the
    system read-only, a cleared environment, one writable scratch directory, no network; with
    `caps`, also no capabilities (bwrap launched by root keeps them unless told)."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/workspace",
            "--ro-bind", "/usr", "/usr"]
    for d in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        p = "/" + d
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    for e in ("ld.so.cache", "ssl", "localtime", "nsswitch.conf", "alternatives"):
        args += ["--ro-bind-try", "/etc/" + e, "/etc/" + e]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", scratch, "/workspace", "--chdir", "/workspace"]
    if caps:
        args += ["--cap-drop", "ALL"]
    return args + payload


def summary(values, scale=1.0):
    """Median, 10th and 90th percentile and count of a sample, multiplied by `scale`."""
    t = sorted(values)
    if not t:
        return None
    q = statistics.quantiles(t, n=10) if len(t) >= 10 else [t[0]] + [t[-1]] * 8
    return {"median": statistics.median(t) * scale, "p10": q[0] * scale, "p90": q[-1] * scale, "n": len(t)}


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def host_meta():
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"date": now_utc(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "user": "root" if os.geteuid() == 0 else str(os.geteuid()), "loadavg_at_start": load, "build": PROFILE}


# --- Rows measured from inside a long-running process (a library), not one process per run ---

PEERS_DIR = os.environ.get("PALISADE_BENCH_PEERS", "/opt/palisade-bench-peers")
# crates/palisade/examples/startup_bench.rs, which bench/startup.sh and bench/peers.sh build.
STARTUP_BENCH = os.path.join(BIN_DIR, "examples", "startup_bench")
# bench/setup-peers.sh installs sandlock (PyPI) into a virtual environment of its own.
SANDLOCK_PY = os.path.join(PEERS_DIR, "sandlock-venv", "bin", "python")

# (row name, what measures it, its argument, what the row is)
LIBRARY_ROWS = [
    ("palisade template (library)", "palisade", "template",
     "Sandbox::prepare() once, then Template::start per run: a fresh user, pid, mount, network, IPC and UTS "
     "namespace, mounts, cgroup and limits per run (docs/engine.md)"),
    ("palisade exec engine (library)", "palisade", "exec",
     "Sandbox::start per run with the exec engine: a cold start from a library, palisade's init program exec'd"),
    ("sandlock Python API, a sandbox per run", "sandlock", "run",
     "sandlock.Sandbox(...).run(['/bin/true']) per run: Landlock, seccomp and its supervisor, no namespaces"),
    ("sandlock fork API (clones share one sandbox)", "sandlock", "fork",
     "sandlock's fork(64) again and again from one prepared sandbox, each clone exec'ing /bin/true; the "
     "clones share that sandbox (its domain, supervisor and limits): not isolated from one another"),
]


def library_skip(kind):
    """Why a library row cannot run here, or None."""
    if kind == "palisade":
        if not os.access(STARTUP_BENCH, os.X_OK):
            return f"{STARTUP_BENCH} not built (bench/startup.sh and bench/peers.sh build it)"
        if not os.access(PALISADE, os.X_OK):
            return f"{PALISADE} not built"
        return None
    if not os.access(SANDLOCK_PY, os.X_OK):
        return f"sandlock is not installed ({SANDLOCK_PY} is missing; bench/setup-peers.sh installs it)"
    return None


def library_loop(kind, arg, seconds, parallel, scratch):
    """`parallel` callers in one long-running process each start runs of `/bin/true` one after the
    other for `seconds` (sandlock: `parallel` driver processes). Returns completed runs, wall
    seconds, CPU seconds of the measuring processes and their reaped children, and a version."""
    import json
    import subprocess
    if kind == "palisade":
        cmd = [STARTUP_BENCH, "--engine", arg, "--init", PALISADE, "--seconds", str(seconds),
               "--threads", str(parallel), "--", "/bin/true"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 20 + 120, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"startup_bench failed: {p.stderr.strip()[-500:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        return r["runs"], r["wall_s"], r["cpu_ms_per_run"] * r["runs"] / 1000, None
    driver = os.path.join(ROOT, "bench", "sandlock_driver.py")
    procs = [subprocess.Popen([SANDLOCK_PY, driver, arg, str(seconds), scratch], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) for _ in range(parallel)]
    runs, wall, cpu, version = 0, 0.0, 0.0, None
    for p in procs:
        out, err = p.communicate(timeout=seconds * 20 + 120)
        if p.returncode != 0:
            raise RuntimeError(f"sandlock driver failed: {err.strip()[-500:]}")
        r = json.loads(out.strip().splitlines()[-1])
        runs += r["runs"]
        wall = max(wall, r["wall_s"])
        cpu += r["cpu_s"]
        version = r["version"]
    return runs, wall, cpu, version
