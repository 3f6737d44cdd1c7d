//! `palisade doctor`: what this host gives each layer, what palisade will do, and how to fix what
//! is missing. Every row is read from the host itself (sysctls, a user-namespace probe, the
//! Landlock ABI query, the cgroup detection palisade runs with), and the last row is a real
//! sandbox run of `/bin/true`, so the verdict cannot disagree with `palisade run`.

use crate::{Sandbox, Status};
use palisade_linux::plan::HostFs;
use serde::Serialize;
use std::path::Path;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Available; palisade enforces it.
    Ok,
    /// Works, with something worth knowing.
    Warn,
    /// Missing: `palisade run` refuses (or needs a named waiver).
    Fail,
}

/// One row of the doctor's report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The layer or host property checked (`user-namespaces`, `landlock`, `cgroup`, …).
    pub name: &'static str,
    /// Whether `palisade run` can use it.
    pub verdict: Verdict,
    /// What the host has, and what palisade does with it.
    pub detail: String,
    /// The command or file that fixes it, when something is missing.
    pub fix: Option<String>,
}

fn check(name: &'static str, verdict: Verdict, detail: String, fix: Option<&str>) -> Check {
    Check {
        name,
        verdict,
        detail,
        fix: fix.map(str::to_owned),
    }
}

/// A sysctl's value, if the host has it.
fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Runs every check; `cgroup_root` is where the cgroup hierarchies are (normally /sys/fs/cgroup).
pub fn run_checks(cgroup_root: &Path) -> Vec<Check> {
    use Verdict::*;
    let mut v = Vec::new();
    let euid = palisade_linux::host::euid();

    // Kernel.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (maj, min) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    v.push(if (maj, min) >= (5, 14) {
        check("kernel", Ok, format!("Linux {release}"), None)
    } else {
        check(
            "kernel",
            Fail,
            format!("Linux {release}: palisade needs 5.14 or newer (mount_setattr, RLIMIT_NPROC per user namespace)"),
            Some("upgrade the kernel"),
        )
    });

    // User namespaces: the sysctls that gate them, then a real attempt.
    let max = sysctl("user/max_user_namespaces");
    let apparmor = sysctl("kernel/apparmor_restrict_unprivileged_userns");
    let debian = sysctl("kernel/unprivileged_userns_clone");
    let mut detail = match palisade_linux::host::try_user_namespace() {
        Result::Ok(()) => "a user namespace can be created".to_owned(),
        Err(e) => format!(
            "creating a user namespace fails: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    };
    let created = detail.starts_with("a user");
    if let Some(m) = &max {
        detail.push_str(&format!("; user.max_user_namespaces = {m}"));
    }
    let (verdict, fix) = if max.as_deref() == Some("0") {
        (
            Fail,
            Some("sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)"),
        )
    } else if debian.as_deref() == Some("0") && euid != 0 {
        detail.push_str("; kernel.unprivileged_userns_clone = 0");
        (Fail, Some("sysctl -w kernel.unprivileged_userns_clone=1"))
    } else if !created {
        (Fail, Some("in a container, allow unshare/clone of user namespaces in its seccomp profile (e.g. docker --security-opt seccomp=unconfined, or a profile that permits them) or run palisade on the host"))
    } else if apparmor.as_deref() == Some("1") && euid != 0 {
        detail.push_str("; AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1): one can be made, but without capabilities inside, so setup fails unless palisade is allowed by an AppArmor profile");
        (Warn, Some("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or install the AppArmor profile packaging/apparmor/palisade (docs/host-setup.md)"))
    } else {
        (Ok, None)
    };
    v.push(check("user-namespaces", verdict, detail, fix));

    // Landlock.
    v.push(match palisade_linux::plan::RealHost.landlock_abi() {
        Result::Ok(abi) => check(
            "landlock",
            Ok,
            format!(
                "ABI {abi}: the filesystem's second wall is enforced{}",
                if abi < 6 {
                    " (signal and abstract-socket scoping need ABI 6)"
                } else {
                    ""
                }
            ),
            None,
        ),
        Err(e) => check(
            "landlock",
            Fail,
            format!(
                "unavailable ({}): `palisade run` refuses unless Landlock is waived (--allow-degraded landlock)",
                std::io::Error::from_raw_os_error(e)
            ),
            Some(palisade_linux::landlock::unavailable_hint(e)),
        ),
    });

    // seccomp, with the user notification the report of refused calls rests on.
    let actions = sysctl("kernel/seccomp/actions_avail").unwrap_or_default();
    v.push(if actions.split_whitespace().any(|a| a == "user_notif") {
        check(
            "seccomp",
            Ok,
            format!("filter with user notification (actions: {actions})"),
            None,
        )
    } else {
        check(
            "seccomp",
            Fail,
            format!("the kernel offers no seccomp user notification (actions: {actions:?})"),
            Some("a kernel built with CONFIG_SECCOMP_FILTER, Linux 5.0 or newer"),
        )
    });

    // Core dumps: what the kernel does with a crash inside.
    let pattern = sysctl("kernel/core_pattern").unwrap_or_default();
    v.push(core_dumps(&pattern, (maj, min)));

    // cgroups, detected exactly as a run detects them (and without creating a run cgroup).
    v.push(match palisade_cgroup::detect(cgroup_root, palisade_linux::host::cgroup_uid()) {
        Result::Ok(m) => check(
            "cgroup",
            Ok,
            format!(
                "cgroup {} under {}: memory, pids and CPU-time ceilings are enforced",
                m.version(),
                cgroup_root.display()
            ),
            None,
        ),
        Err(e) => check(
            "cgroup",
            Fail,
            format!("{e}"),
            Some("see the message; or pass --allow-degraded cgroup to run with rlimits only (reported)"),
        ),
    });

    // Running inside a container changes what the host can give.
    let markers: Vec<&str> = [("/.dockerenv", "docker"), ("/run/.containerenv", "podman")]
        .iter()
        .filter(|(p, _)| Path::new(p).exists())
        .map(|(_, n)| *n)
        .collect();
    let cg1 = std::fs::read_to_string("/proc/1/cgroup").unwrap_or_default();
    let k8s = cg1.contains("kubepods");
    v.push(if markers.is_empty() && !k8s {
        check("container", Ok, "not inside a container as far as /.dockerenv, /run/.containerenv and /proc/1/cgroup tell".into(), None)
    } else {
        check(
            "container",
            Warn,
            format!(
                "inside a container ({}): its seccomp profile and cgroup mount decide what palisade can use; the rows above are what it allows",
                if k8s { "kubernetes".to_owned() } else { markers.join(", ") }
            ),
            Some("see docs/limits.md (cgroup delegation) and the user-namespaces row"),
        )
    });

    // The verdict that counts: a real sandbox.
    let trial = Sandbox::builder()
        .command(["/bin/true"])
        .cgroup_root(cgroup_root)
        .output();
    v.push(match trial {
        Result::Ok(o) if o.report.status == Status::Ok => check(
            "trial-run",
            Ok,
            format!(
                "`palisade run -- /bin/true` works here ({:.1} ms, {} of {} layers enforced)",
                o.report.wall_time_ms,
                o.report.layers.iter().filter(|l| l.enforced).count(),
                o.report.layers.len()
            ),
            None,
        ),
        Result::Ok(o) => check(
            "trial-run",
            Fail,
            format!(
                "`palisade run -- /bin/true` fails: {}",
                o.report
                    .error
                    .unwrap_or_else(|| format!("{:?}", o.report.status))
            ),
            Some("fix the rows marked fail above"),
        ),
        Err(e) => check("trial-run", Fail, e.to_string(), None),
    });
    v
}

/// The `core-dumps` row, from `kernel.core_pattern` and the kernel's version. Every payload runs
/// with `RLIMIT_CORE` pinned at 1 (`palisade_linux::seccomp::CORE_LIMIT`): no core file, and no
/// pipe helper, which the kernel skips at exactly 1. A core-dump socket (`@`, Linux 6.16+) ignores
/// the limit: the server behind it receives every crash of the host, a sandbox's included.
fn core_dumps(pattern: &str, kernel: (u32, u32)) -> Check {
    let socket = pattern.starts_with('@') && kernel >= (6, 16);
    if socket {
        check(
            "core-dumps",
            Verdict::Warn,
            format!(
                "kernel.core_pattern = {pattern:?} sends every crash to a core-dump socket: the kernel connects to it from a crashing process inside a sandbox too, whatever its RLIMIT_CORE, and the server on the host receives that process's memory"
            ),
            Some("a file pattern (sysctl -w kernel.core_pattern=core), or a core-dump server that rejects crashes from user namespaces other than the host's (it gets the crashing process's pidfd to check)"),
        )
    } else if pattern.starts_with('|') {
        check(
            "core-dumps",
            Verdict::Ok,
            format!(
                "kernel.core_pattern = {pattern:?} pipes crashes to a helper that the kernel starts as root on the host with the crashing process's memory; a sandbox never reaches it: RLIMIT_CORE is pinned at {}, the one value at which the kernel starts no helper",
                palisade_linux::seccomp::CORE_LIMIT
            ),
            None,
        )
    } else {
        check(
            "core-dumps",
            Verdict::Ok,
            format!(
                "kernel.core_pattern = {pattern:?} names core files; a sandbox writes none: RLIMIT_CORE is pinned at {} byte, below the smallest core file",
                palisade_linux::seccomp::CORE_LIMIT
            ),
            None,
        )
    }
}

/// True when nothing failed.
pub fn healthy(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.verdict != Verdict::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_dump_patterns() {
        let file = core_dumps("core", (6, 18));
        assert_eq!((file.verdict, file.fix), (Verdict::Ok, None));
        assert!(file.detail.contains("names core files"), "{}", file.detail);
        let pipe = core_dumps("|/usr/share/apport/apport -p%p -s%s -c%c", (6, 18));
        assert_eq!((pipe.verdict, pipe.fix), (Verdict::Ok, None));
        assert!(pipe.detail.contains("never reaches it"), "{}", pipe.detail);
        let socket = core_dumps("@/run/systemd/coredump", (6, 16));
        assert_eq!(socket.verdict, Verdict::Warn);
        assert!(socket.fix.unwrap().contains("kernel.core_pattern=core"));
        // Before 6.16, `@` is the first letter of a file name.
        assert_eq!(core_dumps("@/run/x", (6, 15)).verdict, Verdict::Ok);
    }
}
