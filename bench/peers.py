"""palisade side by side with the sandboxes users would pick instead, in one run (issue #6).

Every tool runs the same payload under the closest equivalent of palisade's default policy (own
mount, pid and network namespaces, read-only system, one writable scratch directory, no network,
cleared environment); where a tool cannot do one of these, the results say so. Before anything is
timed each tool is checked: it must run `/bin/true` and `python3 -c pass` with exit 0, and a probe
inside reports what the policy really was (scratch writable, /usr read-only, interfaces, whether
the launcher's environment leaked in, which namespaces are its own). A tool that is not installed
or cannot run on this host is skipped with the reason, and the reason goes into the results.

Measurements, all interleaved in rounds with a rotated order so that drift hits every tool alike:
- start-up: `hyperfine -N` per tool per round, `/bin/true` and `python3 -c pass`, a fresh sandbox
  every run (warm page cache, nothing pre-created);
- throughput: completed sandboxed runs per second with 1 and with nproc parallel launchers, each
  for a fixed time;
- host cost: peak RSS and CPU time per run of the launched process tree (wait4), and the whole
  machine's CPU per run (/proc/stat, less what processes outside the harness used meanwhile);
- start-up with limits on (memory, pids, timeout) for the tools that have them.
Medians with the 10th and 90th percentiles; ratios are tool / palisade. Nothing is asserted: the
targets of issue #6 are computed and reported as met or missed, never turned into an exit code.
"""

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    LIBRARY_ROWS, PALISADE, PEERS_DIR, ROOT, bwrap_cmd, check_profile, host_meta, library_loop, library_skip, quote, summary)

NPM = os.path.join(PEERS_DIR, "npm", "node_modules")
IMAGE = "localhost/palisade-bench-host:latest"
LAUNCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARKER = "PALISADE_BENCH_MARKER"
# The limits every tool that has them is given in the "limits on" rows.
LIMIT_MEM_MIB, LIMIT_PIDS, LIMIT_TIMEOUT_S = 256, 64, 30
HUNG_AFTER_S = 60
SETTLE_S = 0.2


def log(msg):
    print(f"peers: {msg}", flush=True)


def version_of(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def npm_version(pkg):
    try:
        with open(os.path.join(NPM, pkg, "package.json")) as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None


class Tool:
    """One row of the tables: how to build its command for a payload, and what its policy is."""

    def __init__(self, name, role, build, scratch_inside=None, policy="", version="", skip=None):
        self.name, self.role, self.build = name, role, build
        self.scratch_inside, self.policy, self.version, self.skip = scratch_inside, policy, version, skip
        self.check = {}
        self.probe_s = None


def podman_image(state):
    """A local image holding only the skeleton of the host's root (symlinks, mount points and the few
    /etc files the loader and libc read); /usr comes in as a read-only volume, as in the bwrap row.
    No image registry is reachable, so it is made here with `podman import`, anew every run."""
    root = os.path.join(state, "image-root")
    os.makedirs(root)
    for d in ("dev", "proc", "sys", "tmp", "run", "etc", "usr", "workspace"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for d in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        if os.path.islink("/" + d):
            os.symlink(os.readlink("/" + d), os.path.join(root, d))
        elif os.path.isdir("/" + d):
            os.makedirs(os.path.join(root, d))
    for e in ("ld.so.cache", "nsswitch.conf", "localtime", "passwd", "group"):
        if os.path.exists("/etc/" + e):
            shutil.copyfile("/etc/" + e, os.path.join(root, "etc", e))
    tar = os.path.join(state, "image-root.tar")
    subprocess.run(["tar", "-C", root, "-cf", tar, "."], check=True)
    subprocess.run(["podman", "rmi", "-f", IMAGE], capture_output=True, stdin=subprocess.DEVNULL)
    p = subprocess.run(["podman", "import", "--quiet", tar, IMAGE], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        return None, (p.stderr.strip() or "podman import failed")
    return p.stdout.strip(), None


def make_tools(scratch, state):
    """Every tool, in table order. Each gets the closest equivalent of palisade's default policy."""
    tools = []
    have = shutil.which

    tools.append(Tool("bare", "baseline", lambda p: p, policy="no sandbox: the floor"))
    tools.append(Tool("unshare (all namespaces)", "baseline",
                      lambda p: ["unshare", "--user", "--map-root-user", "--fork", "--pid", "--mount", "--net",
                                 "--ipc", "--uts", "--cgroup", "--"] + p,
                      policy="the seven namespaces palisade creates (user, mount, pid, net, ipc, uts, cgroup) and "
                             "nothing else, no filesystem view: the kernel's floor for namespaces",
                      version=version_of(["unshare", "--version"])))

    pal_skip = None if os.access(PALISADE, os.X_OK) else f"{PALISADE} not built (bench/peers.sh builds it)"
    tools.append(Tool("palisade", "palisade",
                      lambda p: [PALISADE, "run", "-q", "--no-tty", "--scratch", scratch, "--"] + p,
                      scratch_inside="/workspace",
                      policy="default policy; host scratch dir at /workspace (the peers bind one too)",
                      version=version_of([PALISADE, "--version"]) if not pal_skip else "", skip=pal_skip))

    tools.append(Tool("bwrap", "peer", lambda p: bwrap_cmd(scratch, p, caps=True), scratch_inside="/workspace",
                      policy="--unshare-all, /usr and /etc basics read-only, --clearenv, scratch bound, "
                             "--cap-drop ALL",
                      version=version_of(["bwrap", "--version"]),
                      skip=None if have("bwrap") else "bwrap not installed (bench/setup-peers.sh)"))

    tools.append(Tool("firejail", "peer",
                      lambda p: ["firejail", "--quiet", "--noprofile", "--net=none", "--ipc-namespace",
                                 "--read-only=/", f"--private={scratch}", "--private-tmp", "--private-dev",
                                 "--caps.drop=all", "--nonewprivs", "--seccomp", "--"] + p,
                      scratch_inside="/root",
                      policy="own mount/pid/net/ipc namespaces, / read-only, scratch as the private home "
                             "(/root inside), "
                             "no user namespace (root launcher), environment passes through; firejail 0.9.72 "
                             "starts the payload through `/bin/bash -c` (its --shell option is deprecated), and "
                             "sleeps of 10 and 20 ms in its setup overlap the payload, which is why "
                             "`python3 -c pass` costs it hardly more than `/bin/true`",
                      version=version_of(["firejail", "--version"]),
                      skip=None if have("firejail") else "firejail not installed (bench/setup-peers.sh)"))

    tools.append(Tool("gVisor (runsc do)", "peer",
                      lambda p: ["runsc", "--network=none", "do"] + p,
                      scratch_inside=scratch,
                      policy="gVisor's own kernel (ptrace platform); host / read-only under an in-memory "
                             "overlay, so writes (scratch and /usr alike) succeed inside but never reach the "
                             "host (`runsc do` has no bind flag)",
                      version=version_of(["runsc", "--version"]),
                      skip=None if have("runsc") else
                      "runsc not installed (Debian 12 packages it; bench/setup-peers.sh installs it)"))

    image_id, image_err = (None, "podman not installed (bench/setup-peers.sh)")
    if have("podman"):
        image_id, image_err = podman_image(state)
    for rt in ("crun", "runc"):
        skip = image_err or (None if have(rt) else f"{rt} not installed (bench/setup-peers.sh)")
        tools.append(Tool(f"podman + {rt}", "peer",
                          lambda p, rt=rt: podman_cmd(rt, scratch, p),
                          scratch_inside="/workspace",
                          policy="own mount/pid/net/ipc/uts namespaces, --read-only root, /usr a read-only "
                                 "volume, scratch volume at /workspace, all capabilities dropped; "
                                 f"local image {IMAGE} made from the host's root skeleton",
                          version=version_of(["podman", "--version"]) + ", " + (version_of([rt, "--version"]) if have(rt) else ""),
                          skip=skip))

    sandlock = os.path.join(PEERS_DIR, "cargo", "bin", "sandlock")
    read = [x for d in ("/usr", "/lib", "/lib64", "/bin", "/etc") if os.path.exists(d) for x in ("-r", d)]
    tools.append(Tool("sandlock (CLI)", "peer",
                      lambda p: [sandlock, "run"] + read + ["-w", scratch, "--clean-env", "--cwd", scratch,
                                                             "--"] + p,
                      scratch_inside=scratch,
                      policy="no namespaces: Landlock (system directories readable, scratch writable), seccomp "
                             "with its supervisor answering notified calls, a cleared environment; the network "
                             "namespace is the host's (sandlock refuses network calls instead)",
                      version=version_of([sandlock, "--version"]) if os.access(sandlock, os.X_OK) else "",
                      skip=None if os.access(sandlock, os.X_OK) else
                      "sandlock-cli not installed (bench/setup-peers.sh, from crates.io)"))

    srt_ver = npm_version("@anthropic-ai/sandbox-runtime")
    settings = os.path.join(state, "srt-settings.json")
    with open(settings, "w") as f:
        json.dump({"network": {"allowedDomains": [], "deniedDomains": []},
                   "filesystem": {"denyRead": [], "allowWrite": [scratch], "denyWrite": []}}, f)
    tools.append(Tool("srt (sandbox-runtime)", "peer",
                      lambda p: [os.path.join(NPM, ".bin", "srt"), "-s", settings, "--"] + p,
                      scratch_inside=scratch,
                      policy="bubblewrap underneath: / read-only, scratch in allowWrite, no allowed domains "
                             "(own net namespace, proxies started), environment passes through",
                      version=f"@anthropic-ai/sandbox-runtime {srt_ver}",
                      skip=None if srt_ver else "npm @anthropic-ai/sandbox-runtime not installed (bench/setup-peers.sh)"))

    cx_ver = npm_version("@openai/codex")
    native = None
    vendor = os.path.join(NPM, "@openai", "codex-linux-x64", "vendor")
    if os.path.isdir(vendor):
        for triple in sorted(os.listdir(vendor)):
            c = os.path.join(vendor, triple, "bin", "codex")
            if os.access(c, os.X_OK):
                native = c
    cx_args = ["sandbox", "-P", ":workspace", "-C", scratch, "--"]
    cx_policy = ("`codex sandbox` (this version has no `linux`/`debug landlock` subcommand), built-in "
                 "profile :workspace: / read-only, the working directory (scratch) and /tmp writable, "
                 "network off, its bundled bubblewrap + seccomp; environment passes through")
    tools.append(Tool("codex sandbox (native)", "peer", lambda p: [native] + cx_args + p,
                      scratch_inside=scratch, policy=cx_policy + "; the platform binary called directly",
                      version=f"@openai/codex {cx_ver}",
                      skip=None if native else "npm @openai/codex (linux-x64 binary) not installed (bench/setup-peers.sh)"))
    tools.append(Tool("codex sandbox (npm launcher)", "peer",
                      lambda p: [os.path.join(NPM, ".bin", "codex")] + cx_args + p,
                      scratch_inside=scratch, policy=cx_policy + "; through the npm `codex` command (node)",
                      version=f"@openai/codex {cx_ver}",
                      skip=None if cx_ver and have("node") else "npm @openai/codex or node not installed (bench/setup-peers.sh)"))
    return tools, image_id


def podman_cmd(runtime, scratch, payload, limits=False):
    # The rlimits are pinned because this VM's bounding set lacks CAP_SYS_RESOURCE, so the runtime
    # cannot raise them to podman's defaults; 1024 is palisade's own open-files default.
    cmd = ["podman", "--runtime", runtime, "run", "--rm", "--pull=never", "--network=none", "--read-only",
           "--cap-drop=all", "--security-opt=no-new-privileges", "--ulimit", "nofile=1024:1024",
           "--ulimit", "nproc=1024:1024", "-v", "/usr:/usr:ro", "-v", f"{scratch}:/workspace", "-w", "/workspace"]
    if limits:
        cmd += [f"--memory={LIMIT_MEM_MIB}m", f"--pids-limit={LIMIT_PIDS}", f"--timeout={LIMIT_TIMEOUT_S}"]
    return cmd + [IMAGE] + payload


def limit_rows(tools, scratch):
    """Start-up with limits on, for the tools that have them; the others are listed with why not."""
    by = {t.name: t for t in tools}
    rows, skips = [], {}
    if "palisade" in by and not by["palisade"].skip:
        rows.append(Tool("palisade +limits", "limits",
                         lambda p: [PALISADE, "run", "-q", "--no-tty", "--scratch", scratch,
                                    "--memory", f"{LIMIT_MEM_MIB}MiB", "--pids", str(LIMIT_PIDS),
                                    "--timeout", f"{LIMIT_TIMEOUT_S}s", "--"] + p,
                         policy="cgroup memory and pids ceilings, wall-clock timeout (palisade always has "
                                "limits; these are tighter values)", version=by["palisade"].version))
    for rt in ("crun", "runc"):
        t = by.get(f"podman + {rt}")
        if t and not t.skip:
            rows.append(Tool(f"podman + {rt} +limits", "limits",
                             lambda p, rt=rt: podman_cmd(rt, scratch, p, limits=True),
                             policy="--memory, --pids-limit (cgroup), --timeout", version=t.version))
    if "bwrap" in by and not by["bwrap"].skip:
        rows.append(Tool("bwrap +limits (prlimit, timeout)", "limits",
                         lambda p: ["timeout", str(LIMIT_TIMEOUT_S), "prlimit", f"--as={LIMIT_MEM_MIB << 20}", "--"]
                         + bwrap_cmd(scratch, p, caps=True),
                         policy="bwrap has no limits: coreutils timeout and an address-space rlimit (not a "
                                "memory ceiling: it bounds mappings, not RSS, per process). No pids limit: "
                                "RLIMIT_NPROC is not enforced for uid 0 and there is no systemd for a scope",
                         version=by["bwrap"].version))
    if "firejail" in by and not by["firejail"].skip:
        rows.append(Tool("firejail +limits (rlimit-as, timeout)", "limits",
                         lambda p, fj=by["firejail"]: ["timeout", str(LIMIT_TIMEOUT_S)] + fj.build(p)[:-len(p) - 1]
                         + [f"--rlimit-as={LIMIT_MEM_MIB}m", "--"] + p,
                         policy="--rlimit-as (address space, per process, not a memory ceiling) and coreutils "
                                "timeout: firejail's own --timeout=00:00:30 adds about 2 s to every run (its "
                                "monitor checks the clock once a second and waits out the next tick after the "
                                "child exits; measured 2.04 s for /bin/true), so it is not used. No pids limit "
                                "that holds for root (--rlimit-nproc is RLIMIT_NPROC, not enforced for uid 0)",
                         version=by["firejail"].version))
    skips["gVisor (runsc do)"] = "`runsc do` takes no memory, pids or time limits (they come from an OCI spec's cgroups)"
    skips["srt (sandbox-runtime)"] = "no memory, pids or time limits at all"
    skips["codex sandbox (native)"] = skips["codex sandbox (npm launcher)"] = \
        "`codex sandbox` has no memory or pids limits (its timeout is the agent's, not the sandbox's)"
    return rows, {k: v for k, v in skips.items() if k in by and not by[k].skip}


PROBE = r"""
if echo ok > '{inside}/.palisade-bench-probe' 2>/dev/null; then echo scratch_write=yes; else echo scratch_write=no; fi
if touch /usr/.palisade-bench-probe 2>/dev/null; then echo usr_write=yes; rm -f /usr/.palisade-bench-probe; else echo usr_write=no; fi
echo net_ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')
if [ -n "${{{marker}:-}}" ]; then echo env_leak=yes; else echo env_leak=no; fi
echo env_vars=$(env | wc -l)
for n in user mnt pid net ipc uts cgroup; do echo ns_$n=$(readlink /proc/self/ns/$n); done
echo uid=$(id -u)
echo cap_eff=$(grep CapEff /proc/self/status | cut -f2)
"""


SANITY = "print('palisade-bench', 6 * 7)"
# Writes every byte, so that it needs 512 MiB of resident memory, twice the limit rows' ceiling.
MEMORY_HOG = "b = b'x' * (512 << 20); print(len(b))"
HINTS = {
    "hybrid mode": "this host mounts cgroup v1 with a cgroup v2 hierarchy beside it that holds a controller "
                   "(hugetlb), and crun 1.8 refuses that layout even with --cgroups=disabled; runc accepts it",
}


def run_once(tool, payload, env):
    """One run of the tool's command; (CompletedProcess, seconds) or (None, reason)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(tool.build(payload), capture_output=True, text=True, env=env,
                           stdin=subprocess.DEVNULL, timeout=HUNG_AFTER_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{quote(tool.build(payload))}` failed: {e}"
    return p, time.monotonic() - t0


def tail(p):
    err = " ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
    for key, hint in HINTS.items():
        if key in err:
            err += f" ({hint})"
    return err[:500]


def check(tool, scratch, env, python):
    """Runs the tool for real before it is timed; returns a skip reason, or None and fills tool.check.
    Exit 0 alone proves nothing (a wrapper that never started the payload exits 0 as well), so the
    payload must also print what only it can print, and /bin/false must come back as a failure."""
    if tool.skip:
        return tool.skip
    for payload in (["/bin/true"], [python, "-c", "pass"]):
        p, dt = run_once(tool, payload, env)
        if p is None:
            return dt
        if p.returncode != 0:
            return f"cannot run here: `{payload[0]}` exited {p.returncode}: {tail(p)}"
        if payload == ["/bin/true"]:
            tool.probe_s = dt
    p, why = run_once(tool, [python, "-c", SANITY], env)
    if p is None:
        return why
    if p.returncode != 0 or "palisade-bench 42" not in p.stdout:
        return f"sanity check failed: the payload's output did not come back (exit {p.returncode}): {tail(p)}"
    p, why = run_once(tool, ["/bin/false"], env)
    if p is None:
        return why
    if p.returncode == 0:
        return "sanity check failed: /bin/false exited 0, so an exit status from this tool says nothing"
    tool.check = {"payload_output": "ok", "false_exit": p.returncode}
    if tool.role == "limits":
        p, why = run_once(tool, [python, "-c", MEMORY_HOG], env)
        if p is None:
            return why
        if p.returncode == 0:
            return f"sanity check failed: a 512 MiB allocation succeeded under the {LIMIT_MEM_MIB} MiB limit"
        tool.check["memory_limit_held"] = f"512 MiB allocation refused (exit {p.returncode})"
    if tool.role == "palisade":
        report = os.path.join(scratch, "..", f"palisade-bench-report-{os.getpid()}.json")
        cmd = tool.build([python, "-c", SANITY])
        cmd = cmd[:2] + ["--json", report] + cmd[2:]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                           timeout=HUNG_AFTER_S)
        try:
            with open(report) as f:
                rep = json.load(f)
            os.unlink(report)
        except (OSError, ValueError) as e:
            return f"sanity check failed: no JSON report ({e}): {tail(p)}"
        if rep.get("status") != "ok" or rep.get("exit_code") != 0 or rep.get("stdout_bytes", 0) < 18:
            return f"sanity check failed: report says status {rep.get('status')}, exit {rep.get('exit_code')}"
        layers = rep.get("layers", [])
        tool.check["report"] = {"status": rep["status"], "cgroup": rep.get("cgroup"),
                                "landlock_abi": rep.get("landlock_abi"),
                                "layers_enforced": sum(1 for la in layers if la.get("enforced")),
                                "layers_not_enforced": [la["name"] for la in layers if not la.get("enforced")]}
    if tool.role in ("baseline", "limits"):
        return None
    inside = tool.scratch_inside or "/workspace"
    script = PROBE.format(inside=inside, marker=MARKER)
    p = subprocess.run(tool.build(["/bin/sh", "-c", script]), capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=HUNG_AFTER_S)
    res = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    if p.returncode != 0 or "cap_eff" not in res:
        return f"sanity check failed: the policy probe did not run (exit {p.returncode}): {tail(p)}"
    host_file = os.path.join(scratch, ".palisade-bench-probe")
    res["scratch_write_reaches_host"] = "yes" if os.path.exists(host_file) else "no"
    if os.path.exists(host_file):
        os.unlink(host_file)
    own = [n for n in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
           if res.get(f"ns_{n}") and res.get(f"ns_{n}") != os.readlink(f"/proc/self/ns/{n}")]
    tool.check.update({
        "scratch_writable": res.get("scratch_write", "?"),
        "scratch_write_reaches_host": res["scratch_write_reaches_host"],
        "usr_writable": res.get("usr_write", "?"),
        "network_interfaces": res.get("net_ifaces", "?").strip(),
        "launcher_env_visible": res.get("env_leak", "?"),
        "env_vars_inside": res.get("env_vars", "?"),
        "own_namespaces": own,
        "uid_inside": res.get("uid", "?"),
        "effective_caps": res.get("cap_eff", "?"),
    })
    return None


def hyperfine(cmd, runs, warmup, env):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        p = subprocess.run(["hyperfine", "-N", "--style", "none", "-w", str(warmup), "-r", str(runs),
                            "--export-json", f.name, quote(cmd)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                           stdin=subprocess.DEVNULL, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip()[-300:])
        with open(f.name) as fh:
            return json.load(fh)["results"][0]["times"]


def reap_orphans():
    """Reaps what the tools left behind: the harness is their subreaper (see main)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def build_launcher(state):
    """Compiles bench/launch.c (a small launcher, so that peak RSS is not the interpreter's)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    exe = os.path.join(state, "launch")
    p = subprocess.run([cc, "-O2", "-o", exe, os.path.join(ROOT, "bench", "launch.c")], capture_output=True, text=True)
    return exe if p.returncode == 0 else None


def launch_loop(cmd, seconds, parallel, env, launcher):
    """`parallel` launchers each start the command again as soon as the last run ended, until the
    time is up. Returns completed runs, the wall time until the last one ended, failures (a Counter of
    exit statuses, -1 for a run killed as hung), and the
    (peak RSS KiB, CPU seconds) of each completed run."""
    if launcher is None:
        return launch_loop_py(cmd, seconds, parallel, env)
    # Each launcher writes to a file of its own: a pipe left unread would stall it mid-window.
    outs = [tempfile.TemporaryFile(mode="w+") for _ in range(parallel)]
    start = time.monotonic()
    procs = [subprocess.Popen([launcher, str(seconds), str(HUNG_AFTER_S), "--"] + cmd, env=env,
                              stdout=o, stdin=subprocess.DEVNULL) for o in outs]
    ok, fail, last, usages = 0, collections.Counter(), start, []
    for p, o in zip(procs, outs):
        p.wait()
        o.seek(0)
        for line in o.read().splitlines():
            f = line.split()
            if len(f) != 7 or f[0] != "run":
                continue
            last = max(last, int(f[6]) / 1e9)
            if f[1] == "0":
                ok += 1
                usages.append((int(f[2]), (int(f[3]) + int(f[4])) / 1e6))
            else:
                fail[int(f[1])] += 1
    return ok, max(last - start, 1e-9), fail, usages


def launch_loop_py(cmd, seconds, parallel, env):
    """The same loop in Python threads, where no C compiler is at hand. Its peak-RSS figures carry
    the interpreter's resident set (a spawned child inherits it until exec), so they are upper bounds."""
    exe = cmd[0] if os.path.isabs(cmd[0]) else shutil.which(cmd[0], path=env["PATH"])
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
               (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)]
    lock = threading.Lock()
    inflight, usages = {}, []
    state = {"ok": 0, "fail": collections.Counter(), "last": 0.0}
    start = time.monotonic()
    deadline = start + seconds

    def worker():
        while time.monotonic() < deadline:
            pid = os.posix_spawn(exe, cmd, env, file_actions=actions)
            with lock:
                inflight[pid] = time.monotonic()
            _, status, ru = os.wait4(pid, 0)
            end = time.monotonic()
            with lock:
                inflight.pop(pid, None)
                if os.waitstatus_to_exitcode(status) == 0:
                    state["ok"] += 1
                    usages.append((ru.ru_maxrss, ru.ru_utime + ru.ru_stime))
                else:
                    code = os.waitstatus_to_exitcode(status)
                    state["fail"][-1 if code == -signal.SIGKILL else code] += 1
                state["last"] = max(state["last"], end)

    def watchdog():
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            now = time.monotonic()
            with lock:
                hung = [p for p, t0 in inflight.items() if now - t0 > HUNG_AFTER_S]
            for p in hung:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    w = threading.Thread(target=watchdog)
    w.start()
    for t in threads:
        t.join()
    w.join()
    return state["ok"], max(state["last"] - start, 1e-9), state["fail"], usages


def cpu_snapshot():
    """CPU time (jiffies, own and reaped children) of every user-space process but this one, by pid
    and start time. Two snapshots tell how much CPU other work on the machine used in between:
    processes that ran and ended in between are counted through their parent's reaped-children
    time (`foreign_cpu_s`). Kernel threads are left out (they mostly tear down this harness's namespaces)."""
    me, snap = os.getpid(), {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the name, from 0: state, ppid, ..., flags (6), ..., utime, stime, cutime, cstime (11-14), ..., starttime (19)
        if int(st[6]) & 0x00200000 or st[1] == "2" or d == "2":  # PF_KTHREAD, or a child of kthreadd
            continue
        snap[(int(d), st[19])] = sum(int(x) for x in st[11:15])
    return snap


def foreign_cpu_s(before, after):
    """CPU-seconds used between two cpu_snapshot()s by processes other than this harness's. A plain
    difference of the sums: a process that ended in between took its total (also what it had used
    before the first snapshot) into its parent's reaped-children time, so its first-snapshot value
    must be subtracted, and so must that of every process still there."""
    hz = os.sysconf("SC_CLK_TCK")
    return max(sum(after.values()) - sum(before.values()), 0) / hz


def source_state():
    """The commit palisade was built from, and whether its sources had changes not yet committed."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{head or 'unknown'}" + (" with uncommitted changes to crates/" if dirty else "")


def rotated(items, r):
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few iterations of each, to prove the harness works (CI)")
    ap.add_argument("--out", default=None, help="results directory (default docs/benchmarks; a temp dir with --quick)")
    ap.add_argument("--rounds", type=int, default=5, help="start-up rounds (default 5)")
    ap.add_argument("--budget", type=float, default=1.2, help="seconds per tool per start-up round (default 1.2)")
    ap.add_argument("--seconds", type=float, default=2.5, help="seconds per throughput window (default 2.5)")
    ap.add_argument("--throughput-rounds", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated tool names to keep (debugging)")
    a = ap.parse_args()
    check_profile(a.quick)
    if a.quick:
        a.rounds, a.budget, a.seconds, a.throughput_rounds = 2, 0.0, 0.4, 1
    min_runs, max_runs, warmup = (3, 3, 0) if a.quick else (5, 40, 2)
    out = a.out or (tempfile.mkdtemp(prefix="palisade-peers-") if a.quick else os.path.join(ROOT, "docs", "benchmarks"))
    os.makedirs(out, exist_ok=True)
    if os.geteuid() != 0:
        sys.exit("peers: run as root (firejail, runsc and rootful podman are compared as root)")
    if not shutil.which("hyperfine"):
        sys.exit("peers: hyperfine is missing; run bench/setup-peers.sh")
    started = time.monotonic()
    # Become the child subreaper: what a tool detaches (podman's conmon) is reparented to this process,
    # so its CPU time lands in this process's reaped-children time and not in outside work's.
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    meta = host_meta()
    meta["mode"] = "quick" if a.quick else "full"
    meta["palisade_source"] = source_state()

    state = tempfile.mkdtemp(prefix="palisade-peers-state-")
    scratch = tempfile.mkdtemp(prefix="palisade-peers-scratch-")
    os.chmod(scratch, 0o755)
    os.makedirs(os.path.join(PEERS_DIR, "codex-home"), exist_ok=True)
    # The launchers' own environment: small and the same for all. MARKER shows which tools let it in.
    env = {"PATH": LAUNCH_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb",
           "CODEX_HOME": os.path.join(PEERS_DIR, "codex-home"), MARKER: "1"}
    os.chdir(scratch)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3", path=LAUNCH_PATH)
    cases = {"/bin/true": ["/bin/true"], "python3 -c pass": [python, "-c", "pass"]}

    tools, image_id = make_tools(scratch, state)
    launcher = build_launcher(state)
    if launcher is None:
        log("no C compiler: throughput runs from Python, and peak RSS then includes the interpreter's")
    limits, limit_skips = limit_rows(tools, scratch)
    if a.only:
        keep = set(a.only.split(",")) | {"palisade"}
        tools = [t for t in tools if t.name in keep]
        limits = [t for t in limits if t.name in keep or t.name == "palisade +limits"]
    skipped = {}
    for t in tools + limits:
        why = check(t, scratch, env, python)
        if why:
            skipped[t.name] = why
            log(f"SKIP {t.name}: {why}")
        else:
            log(f"ok   {t.name} ({t.probe_s * 1000:.0f} ms for a first /bin/true)")
    reap_orphans()
    live = [t for t in tools if t.name not in skipped]
    live_limits = [t for t in limits if t.name not in skipped]
    limit_names = {t.name for t in limits}
    if not any(t.role == "palisade" for t in live):
        sys.exit("peers: palisade itself cannot run here: " + skipped.get("palisade", "?"))

    def runs_for(t):
        return max(min_runs, min(max_runs, int(a.budget / max(t.probe_s, 1e-3))))

    # --- start-up ---
    snap0, t_snap0 = cpu_snapshot(), time.monotonic()
    times = {case: {t.name: [] for t in live + (live_limits if case == "/bin/true" else [])} for case in cases}
    failed = {}
    for r in range(a.rounds):
        for case, payload in cases.items():
            rows = live + (live_limits if case == "/bin/true" else [])
            for t in rotated(rows, r):
                if t.name in failed:
                    continue
                try:
                    times[case][t.name].extend(hyperfine(t.build(payload), runs_for(t), warmup, env))
                    reap_orphans()
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failed[t.name] = f"failed while timed ({case}): {e}"
                    log(f"{t.name} {failed[t.name]}")
        log(f"start-up round {r + 1}/{a.rounds} done ({time.monotonic() - started:.0f} s)")
    startup = {}
    for case in cases:
        startup[case] = {n: summary(v, 1000) for n, v in times[case].items() if v}
        base = startup[case]["palisade"]["median"]
        lbase = startup[case].get("palisade +limits", {}).get("median") if case == "/bin/true" else None
        for n, s in startup[case].items():
            ref = lbase if n in limit_names else base
            s["ratio_to_palisade"] = s["median"] / ref if ref else None

    snap1, t_snap1 = cpu_snapshot(), time.monotonic()
    # --- throughput and host cost ---
    nproc = os.cpu_count() or 1
    tp = {t.name: {"1": [0, 0.0, collections.Counter()], str(nproc): [0, 0.0, collections.Counter()],
                   "rusage": [], "machine_cpu_s": 0.0}
          for t in live}
    hz = os.sysconf("SC_CLK_TCK")
    foreign = []
    # Rows measured from inside one long-running process: palisade's warm engine (a template) and
    # its exec engine as a library, sandlock's Python API and its fork API.
    lib_rows = []
    for name, kind, arg, policy in LIBRARY_ROWS:
        why = library_skip(kind)
        if why:
            skipped[name] = why
            log(f"SKIP {name}: {why}")
        else:
            lib_rows.append((name, kind, arg, policy))
    lib_meta = {name: {"policy": policy} for name, _, _, policy in lib_rows}
    for name, *_ in lib_rows:
        tp[name] = {"1": [0, 0.0, collections.Counter()], str(nproc): [0, 0.0, collections.Counter()],
                    "rusage": [], "machine_cpu_s": 0.0, "tree_cpu_s": 0.0}
    for r in range(a.throughput_rounds):
        for name, kind, arg, _ in rotated(lib_rows, r):
            if name in failed:
                continue
            for par in (1, nproc):
                s0, j0 = cpu_snapshot(), busy_jiffies()
                try:
                    ok, wall, own_cpu, version = library_loop(kind, arg, a.seconds, par, scratch)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                    failed[name] = f"failed while timed (throughput): {e}"
                    log(f"{name} {failed[name]}")
                    tp.pop(name, None)
                    break
                if version:
                    lib_meta[name]["version"] = version
                time.sleep(SETTLE_S)
                reap_orphans()
                j1, s1 = busy_jiffies(), cpu_snapshot()
                other = foreign_cpu_s(s0, s1)
                e = tp[name][str(par)]
                e[0] += ok
                e[1] += wall
                if par == 1:
                    tp[name]["machine_cpu_s"] += max((j1 - j0) / hz - other, 0.0)
                    tp[name]["tree_cpu_s"] += own_cpu
        for t in rotated(live, r):
            cmd = t.build(["/bin/true"])
            for par in (1, nproc):
                s0, j0 = cpu_snapshot(), busy_jiffies()
                ok, wall, fail, usages = launch_loop(cmd, a.seconds, par, env, launcher)
                time.sleep(SETTLE_S)  # the kernel tears the last namespaces down in its own workers
                reap_orphans()
                j1, s1 = busy_jiffies(), cpu_snapshot()
                other = foreign_cpu_s(s0, s1)
                foreign.append(other / (wall + SETTLE_S))
                cpu = (j1 - j0) / hz - other
                e = tp[t.name][str(par)]
                e[0] += ok
                e[1] += wall
                e[2].update(fail)
                if par == 1:
                    tp[t.name]["rusage"].extend(usages)
                    tp[t.name]["machine_cpu_s"] += max(cpu, 0.0)
        log(f"throughput round {r + 1}/{a.throughput_rounds} done ({time.monotonic() - started:.0f} s)")
    throughput, cost = {}, {}
    for n, d in tp.items():
        throughput[n] = {f"runs_per_s_{k}": (d[k][0] / d[k][1] if d[k][1] else 0.0) for k in ("1", str(nproc))}
        throughput[n].update({f"runs_{k}": d[k][0] for k in ("1", str(nproc))})
        codes = d["1"][2] + d[str(nproc)][2]
        throughput[n]["failures"] = sum(codes.values())
        throughput[n]["failure_exit_codes"] = {str(c): k for c, k in sorted(codes.items())}
        rus = d["rusage"]
        cost[n] = {
            "peak_rss_kib": summary([u[0] for u in rus]),
            "tree_cpu_ms_per_run": summary([u[1] for u in rus], 1000),
            "machine_cpu_ms_per_run": d["machine_cpu_s"] * 1000 / d["1"][0] if d["1"][0] else None,
        }
        if "tree_cpu_s" in d and d["1"][0]:
            # A library row: the measuring process and its reaped children, as a mean per run.
            v = d["tree_cpu_s"] * 1000 / d["1"][0]
            cost[n]["tree_cpu_ms_per_run"] = {"median": v, "p10": v, "p90": v, "n": d["1"][0]}
    pbase = throughput["palisade"]
    for n, s in throughput.items():
        for k in ("1", str(nproc)):
            s[f"ratio_to_palisade_{k}"] = s[f"runs_per_s_{k}"] / pbase[f"runs_per_s_{k}"] if pbase[f"runs_per_s_{k}"] else None

    # --- targets (reported, never asserted) ---
    st = startup["/bin/true"]
    pm = st["palisade"]["median"]
    targets = []

    def target(text, name, value, met):
        targets.append({"target": text, "peer": name, "value": round(value, 3), "met": bool(met)})

    if "bwrap" in st:
        target("start-up median below bwrap's (bwrap / palisade > 1)", "bwrap", st["bwrap"]["median"] / pm, st["bwrap"]["median"] > pm)
    if "unshare (all namespaces)" in st:
        v = pm / st["unshare (all namespaces)"]["median"]
        target("within 1.5x of unshare with all namespaces (palisade / unshare <= 1.5)", "unshare (all namespaces)", v, v <= 1.5)
    if "firejail" in st:
        v = st["firejail"]["median"] / pm
        target("3x faster than firejail (firejail / palisade >= 3)", "firejail", v, v >= 3)
    for n in st:
        if n.startswith(("srt", "codex", "podman", "gVisor")) and n not in limit_names:
            v = st[n]["median"] / pm
            target("10x faster than srt, codex and containers (peer / palisade >= 10)", n, v, v >= 10)
    if "bwrap" in throughput:
        v = throughput["palisade"][f"runs_per_s_{nproc}"] / max(throughput["bwrap"][f"runs_per_s_{nproc}"], 1e-9)
        target(f"throughput with {nproc} launchers above bwrap's (palisade / bwrap > 1)", "bwrap", v, v > 1)
    warm = throughput.get("palisade template (library)")
    if warm:
        v = warm[f"runs_per_s_{nproc}"]
        target(f"issue 19: at least 1000 isolated /bin/true runs/s from the warm engine ({nproc} callers)",
               "palisade template (library)", v, v >= 1000)

    snap2, t_snap2 = cpu_snapshot(), time.monotonic()
    # Our own descendants are gone by now; anything they left running would count here too.
    meta["other_work_cpu_s_per_s"] = {
        "startup": round(foreign_cpu_s(snap0, snap1) / max(t_snap1 - t_snap0, 1e-9), 3),
        "throughput": round(foreign_cpu_s(snap1, snap2) / max(t_snap2 - t_snap1, 1e-9), 3)}
    with open("/proc/loadavg") as f:
        meta["loadavg_at_end"] = f.read().split()[:3]
    meta.update({
        "startup_rounds": a.rounds, "runs_per_round": {t.name: runs_for(t) for t in live + live_limits},
        "warmup_runs": warmup, "throughput_rounds": a.throughput_rounds, "throughput_window_s": a.seconds,
        "parallel_launchers": [1, nproc],
        "launcher": "bench/launch.c (posix_spawn + wait4)" if launcher else "Python threads (posix_spawn + wait4); RSS upper bounds", "other_work_cpu_s_per_s_per_window": [round(x, 3) for x in foreign],
        "podman_image": {"name": IMAGE, "id": image_id,
                         "recipe": "podman import of a tarball holding dev proc sys tmp run usr workspace, the "
                                   "host's top-level symlinks (bin sbin lib lib64) and copies of /etc/{ld.so.cache,"
                                   "nsswitch.conf,localtime,passwd,group}; /usr is a read-only volume"},
        "launcher_env": {k: ("<peers dir>/codex-home" if k == "CODEX_HOME" else v) for k, v in env.items()},
        "scratch": "a fresh host temp dir, shown as SCRATCH in the commands",
        "limits": {"memory_mib": LIMIT_MEM_MIB, "pids": LIMIT_PIDS, "timeout_s": LIMIT_TIMEOUT_S},
        "elapsed_s": round(time.monotonic() - started, 1),
    })

    def show(cmd):
        return quote(cmd).replace(scratch, "SCRATCH").replace(state, "STATE")

    all_rows = tools + limits
    result = {
        "meta": meta,
        "targets": targets,
        "startup_ms": startup,
        "throughput": throughput,
        "host_cost": cost,
        "tools": {t.name: {"role": t.role, "version": t.version, "policy": t.policy, "check": t.check,
                           "commands": {c: show(t.build(p)) for c, p in cases.items()
                                        if t.role != "limits" or c == "/bin/true"}}
                  for t in all_rows if t.name not in skipped},
        "skipped": {**skipped, **failed},
        "limits_not_available": limit_skips,
        "library_rows": lib_meta,
        "egress": egress_summary(),
    }
    with open(os.path.join(out, "peers.json"), "w") as f:
        json.dump(result, f, indent=2)
    md = render_md(result, nproc)
    with open(os.path.join(out, "peers.md"), "w") as f:
        f.write(md)
    chart = chart_png(result, os.path.join(out, "peers-startup.png"))
    print(md)
    log(f"results in {out}/peers.json and {out}/peers.md" + (f", chart {chart}" if chart else ""))
    log(f"elapsed {time.monotonic() - started:.0f} s")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


def fmt(v, nd=2):
    return "—" if v is None else f"{v:.{nd}f}"


def render_md(res, nproc):
    m = res["meta"]
    L = [f"# palisade and its peers, side by side ({m['mode']} run)", "",
         f"{m['date']}, kernel {m['kernel']}, {m['cpus']} CPUs, as {m['user']}; load average "
         f"{' '.join(m['loadavg_at_start'])} at the start and {' '.join(m['loadavg_at_end'])} at the end. "
         f"{m['startup_rounds']} interleaved start-up rounds (hyperfine -N, {m['warmup_runs']} warm-up "
         f"runs each), {m['throughput_rounds']} throughput rounds of {m['throughput_window_s']} s per window. "
         f"Took {m['elapsed_s']} s. palisade built from {m['palisade_source']}. Produced by `bench/peers.sh`; "
         "the machine-readable form is `peers.json`.", ""]
    ow = m["other_work_cpu_s_per_s"]
    L += [f"Other work on the machine (processes outside this harness) used {ow['startup']:.2f} CPU-s/s "
          f"during the start-up rounds and {ow['throughput']:.2f} during the throughput rounds (at most "
          f"{max(m['other_work_cpu_s_per_s_per_window'] + [0.0]):.2f} in one window), of {m['cpus']}."]
    if max(ow.values()) > 0.1:
        L += ["**Noisy machine:** others were using it meanwhile. Interleaving spreads that over every "
              "tool alike, so ratios hold better than absolute times."]
    L.append("")
    L += ["## Targets (issue #6), computed from this run", "", "| target | peer | value | met |", "|---|---|---|---|"]
    L += [f"| {t['target']} | {t['peer']} | {t['value']:.2f} | {'yes' if t['met'] else '**no**'} |" for t in res["targets"]]
    for case, rows in res["startup_ms"].items():
        L += ["", f"## Start-up, `{case}`", "", "| tool | median ms | p10 ms | p90 ms | runs | tool / palisade |",
              "|---|---|---|---|---|---|"]
        L += [f"| {n} | {s['median']:.2f} | {s['p10']:.2f} | {s['p90']:.2f} | {s['n']} | {fmt(s['ratio_to_palisade'])} |"
              for n, s in sorted(rows.items(), key=lambda kv: kv[1]["median"])]
    L += ["", "Rows marked +limits compare with `palisade +limits`; palisade always runs with limits "
          "(defaults 2 GiB memory, 1024 pids, 10 min), so its plain row is not limit-free either.", ""]
    k = str(nproc)
    L += ["## Throughput, `/bin/true`", "", "Completed runs per second of wall time, each launcher starting the "
          "next run as soon as its last one ended; failed runs (exit status not 0) are not counted.", "",
          f"| tool | runs/s, 1 launcher | runs/s, {k} launchers | tool / palisade (1) | tool / palisade ({k}) | failed runs |",
          "|---|---|---|---|---|---|"]
    for n, s in sorted(res["throughput"].items(), key=lambda kv: -kv[1][f"runs_per_s_{k}"]):
        L.append(f"| {n} | {s['runs_per_s_1']:.1f} | {s[f'runs_per_s_{k}']:.1f} | {fmt(s['ratio_to_palisade_1'])} | "
                 f"{fmt(s[f'ratio_to_palisade_{k}'])} | {s['failures']}"
                 + (" (exit " + ", ".join(f"{c}: {k}x" for c, k in s["failure_exit_codes"].items()) + ")"
                    if s["failures"] else "") + " |")
    if res.get("library_rows"):
        L += ["", "Rows marked (library), and sandlock's API rows, run inside one long-running process: "
              "1 and "f"{k} callers (threads; sandlock: driver processes) start runs one after the other; "
              "their start-up has no program load of the sandbox tool itself. What each row does:", ""]
        L += [f"- {n}: {d['policy']}" + (f" (sandlock {d['version']})" if d.get("version") else "")
              for n, d in res["library_rows"].items()]
    L += ["", "## Host cost per run, `/bin/true`, 1 launcher", "",
          "| tool | peak RSS KiB (median) | CPU ms, launched tree (median, p90) | CPU ms, whole machine |",
          "|---|---|---|---|"]
    for n, c in res["host_cost"].items():
        rss, cpu = c["peak_rss_kib"], c["tree_cpu_ms_per_run"]
        L.append(f"| {n} | {fmt(rss and rss['median'], 0)} | {fmt(cpu and cpu['median'])} ({fmt(cpu and cpu['p90'])}) | "
                 f"{fmt(c['machine_cpu_ms_per_run'])} |")
    L += ["", "Peak RSS is wait4's `ru_maxrss`: the largest process of the launched tree among those it "
          "reaped. Launched-tree CPU is user + system of that tree as wait4 reports it, which counts only "
          "processes that were waited for: bwrap's outer process exits without reaping its namespace's "
          "pid 1, podman's conmon is detached, and the kernel tears namespaces down (the network one "
          "above all) in its own workers afterwards. The whole-machine column counts all of that: the "
          f"machine's busy time during the window and {SETTLE_S} s after it, less the CPU time that processes "
          "outside this harness used meanwhile (read from /proc), per run (it includes the launcher's own "
          "spawn cost, which the bare row shows). The harness is a child subreaper, so that processes a "
          "tool detaches (conmon) are reaped by it and not counted as outside work.", ""]
    L += ["## Limits not available", ""]
    L += [f"- {n}: {why}" for n, why in res["limits_not_available"].items()] or ["- none"]
    L += ["", "## Skipped", ""]
    L += [f"- {n}: {why}" for n, why in res["skipped"].items()] or ["- none: every peer ran"]
    L += ["", "## What each tool's policy really was (probe inside)", "",
          "| tool | scratch writable (reaches host) | /usr writable | interfaces | launcher env visible | own namespaces | uid | CapEff |",
          "|---|---|---|---|---|---|---|---|"]
    for n, t in res["tools"].items():
        c = t["check"]
        if "scratch_writable" in c:
            L.append(f"| {n} | {c['scratch_writable']} ({c['scratch_write_reaches_host']}) | {c['usr_writable']} | "
                     f"{c['network_interfaces']} | {c['launcher_env_visible']} ({c['env_vars_inside']} vars) | "
                     f"{' '.join(c['own_namespaces'])} | {c['uid_inside']} | {c['effective_caps']} |")
    L += ["", "## Tools, versions and exact commands", "",
          "SCRATCH is a fresh host temporary directory and STATE the run's state directory (srt's settings "
          "file). All commands run with the scratch directory as working directory and the launcher "
          f"environment `{' '.join(f'{k}={v}' for k, v in m['launcher_env'].items())}`.", ""]
    for n, t in res["tools"].items():
        L += [f"### {n}", "", f"{t['version'] or 'version n/a'}. {t['policy']}.", ""]
        L += [f"- `{c}`: `{cmd}`" for c, cmd in t["commands"].items()] + [""]
    L += [f"podman image: {m['podman_image']['recipe']}.", ""]
    L += ["## Sanity checks before timing", "",
          "Every row above passed these before it was timed (a tool that failed one is in Skipped): "
          "`/bin/true` and `python3 -c pass` exit 0; `python3 -c \"print('palisade-bench', 6 * 7)\"` "
          "prints `palisade-bench 42` through the tool (so the payload really ran); `/bin/false` comes "
          "back non-zero (so the exit status that hyperfine and the launcher check is the payload's). "
          "Limit rows: a 512 MiB allocation fails under the 256 MiB limit. hyperfine stops on any "
          "non-zero exit, and the throughput launcher counts only runs that exited 0.", ""]
    for n, t in res["tools"].items():
        c = t["check"]
        extra = []
        if "memory_limit_held" in c:
            extra.append(c["memory_limit_held"])
        if "report" in c:
            r = c["report"]
            extra.append(f"palisade's own report: status {r['status']}, {r['layers_enforced']} layers enforced, "
                         f"not enforced: {', '.join(r['layers_not_enforced']) or 'none'} (cgroup {r['cgroup']}, "
                         f"Landlock ABI {r['landlock_abi']})")
        if extra:
            L.append(f"- {n}: " + "; ".join(extra))
    L += ["", "## Egress", ""]
    e = res["egress"]
    if e.get("results"):
        L += [f"Not measured by this harness: [`bench/egress.sh`](../../bench/egress.sh) measures it "
              f"(results in [egress.md](egress.md)). Its latest committed run, {e['date']}, {e['runs']} runs "
              f"per path, {e['size_mib']} MiB from a server on the host's loopback, then behind a veth link "
              "shaped to each rate:", "",
              "| where | path | MiB/s | vs direct | time to first byte ms | added ms |", "|---|---|---|---|---|---|"]
        for where, rows in [("loopback", e["results"])] + [(f"link {k}", v) for k, v in e.get("links", {}).items()]:
            for n, r in rows.items():
                L.append(f"| {where} | {n} | {r['throughput_mib_s']:.0f} | {r['throughput_vs_direct']:.2f} | "
                         f"{r['ttfb_ms']:.2f} | {r['ttfb_added_ms']:.2f} |")
        L += ["", "None of the peers filters egress by host name: bwrap, firejail, podman (--network=none), "
              "gVisor and codex (network off) have no network at all; srt proxies to allowed domains, "
              "which this policy (no domains) leaves empty."]
    else:
        L += [f"Not measured by this harness: see [`bench/egress.sh`](../../bench/egress.sh) ({e.get('note', '')})."]
    L.append("")
    return "\n".join(L)


def egress_summary():
    """The latest committed result of bench/egress.sh, so that the peers page shows it beside the rest."""
    path = os.path.join(ROOT, "docs", "benchmarks", "egress.json")

    def pick(rows):
        return {n: {k: r[k] for k in ("throughput_mib_s", "throughput_vs_direct", "ttfb_ms", "ttfb_added_ms")}
                for n, r in rows.items()}
    try:
        with open(path) as f:
            e = json.load(f)
        return {"source": "docs/benchmarks/egress.json (bench/egress.sh), a separate run", "date": e["date"],
                "runs": e["runs"], "size_mib": e["size_bytes"] >> 20,
                "results": pick(e["results"]),
                "links": {rate: pick(v["results"]) for rate, v in e.get("links", {}).items()}}
    except (OSError, ValueError, KeyError) as err:
        return {"source": "bench/egress.sh", "note": f"no committed egress result could be read ({err})"}


def chart_png(res, path):
    """Horizontal bars of the start-up medians (log scale), p10–p90 as whiskers, palisade in bold."""
    sys.path.insert(0, os.path.join(PEERS_DIR, "py"))  # bench/setup-peers.sh puts matplotlib there
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no chart: matplotlib is missing (bench/setup-peers.sh installs it)")
        return None
    cases = list(res["startup_ms"])
    first = res["startup_ms"][cases[0]]
    names = sorted(first, key=lambda n: first[n]["median"])
    allv = [s for rows in res["startup_ms"].values() for s in rows.values()]
    lo_edge = min(s["p10"] for s in allv) / 2
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(names) + 1.6))
    h = 0.8 / len(cases)
    colors = ["#4C72B0", "#DD8452"]
    for i, case in enumerate(cases):
        rows = res["startup_ms"][case]
        shown = [n for n in names if n in rows]
        ys = [names.index(n) + i * h for n in shown]
        med = [rows[n]["median"] for n in shown]
        err = [[rows[n]["median"] - rows[n]["p10"] for n in shown], [rows[n]["p90"] - rows[n]["median"] for n in shown]]
        ax.barh(ys, [m - lo_edge for m in med], left=lo_edge, height=h, xerr=err, label=case, capsize=2,
                color=colors[i % len(colors)], error_kw={"elinewidth": 0.8})
        for y, v, n in zip(ys, med, shown):
            ax.text(rows[n]["p90"] * 1.08, y, f"{v:.1f}", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(lo_edge, max(s["p90"] for s in allv) * 2.5)
    ax.set_yticks([j + h * (len(cases) - 1) / 2 for j in range(len(names))])
    ax.set_yticklabels(names, fontsize=8)
    for label in ax.get_yticklabels():
        if label.get_text().startswith("palisade"):
            label.set_fontweight("bold")
    ax.invert_yaxis()
    ax.grid(axis="x", which="major", linewidth=0.4, alpha=0.6)
    ax.set_xlabel("start-up, median ms (log scale; whiskers p10–p90)")
    m = res["meta"]
    ax.set_title(f"Sandbox start-up ({m['mode']} run), {m['date']}, Linux {m['kernel']}, {m['cpus']} CPUs",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
