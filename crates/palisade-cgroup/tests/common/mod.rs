//! What the kernel tests of this crate share.

use std::path::{Path, PathBuf};

/// The memory cgroup directory process `pid` is in (v1: in the memory hierarchy; v2: the unified
/// one, at the top of `/sys/fs/cgroup` or under `unified/`).
pub fn memory_dir_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let rel = path.trim_start_matches('/');
        if ctrls.split(',').any(|c| c == "memory") {
            return Path::new("/sys/fs/cgroup/memory").join(rel);
        }
        if ctrls.is_empty() {
            for top in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                let d = Path::new(top).join(rel);
                if d.join("memory.current").exists() {
                    return d;
                }
            }
        }
    }
    panic!("no memory cgroup for {pid} in {text}")
}
