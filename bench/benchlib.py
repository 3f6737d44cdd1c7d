"""Pieces shared by the benchmark scripts: command quoting, the bubblewrap equivalent of palisade's
default policy, percentile summaries and the run's metadata."""

import datetime
import os
import platform
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# cargo's own rule: CARGO_TARGET_DIR if set (relative to where cargo ran, here the repository root).
PALISADE = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", "release", "palisade")


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
            "user": "root" if os.geteuid() == 0 else str(os.geteuid()), "loadavg_at_start": load}
