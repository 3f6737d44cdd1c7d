//! The v2 delegation path against the real kernel: this host's cgroup2 mount moves processes the
//! way a delegated systemd scope would, whether or not it offers controllers.

use palisade_cgroup::{CgroupError, PROCS_LEAF, V2};
use std::path::PathBuf;

/// The cgroup2 mount point, from mountinfo.
fn cgroup2_mount() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = pre.split(' ').nth(4)?;
            (post.split(' ').next()? == "cgroup2").then(|| PathBuf::from(point))
        })
        .expect("no cgroup2 mount on this host: the v2 path cannot be tested")
}

/// Needs root, to create a cgroup at the top of the cgroup2 mount and mark it delegated (a
/// `trusted.*` attribute). Ignored by default, so that a run without root lists it as ignored
/// rather than passing without testing anything; the root passes of `scripts/test.sh` and of the
/// VM matrix run it (`--include-ignored`), and without root it fails.
#[test]
#[ignore = "needs root: creates a cgroup2 directory marked trusted.delegate; the root pass runs it with --include-ignored"]
fn processes_of_the_delegated_cgroup_move_into_the_leaf() {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(
        uid.unwrap(),
        0,
        "this test creates a cgroup to stand for a delegated one, which needs root: run it as root"
    );
    let own = cgroup2_mount().join(format!("palisade-v2test-{}", std::process::id()));
    std::fs::create_dir(&own).unwrap();
    // What systemd puts on a unit with Delegate=yes (and `palisade cgroup-delegate` on v2).
    rustix::fs::setxattr(
        &own,
        "trusted.delegate",
        b"1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(own.join("cgroup.procs"), child.id().to_string()).unwrap();
    let got = V2::delegated(&own, 0, std::process::id());
    let now = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let leaf = own.join(PROCS_LEAF);
    let _ = std::fs::remove_dir(&leaf);
    let _ = std::fs::remove_dir(&own);
    let want = format!("/palisade-v2test-{}/{PROCS_LEAF}", std::process::id());
    assert!(
        now.lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&want)),
        "the process did not move into the leaf: {now}"
    );
    // A host whose cgroup2 offers memory and pids gives a manager; one without (a hybrid host
    // whose controllers are on v1) refuses by name, never half-works.
    match got {
        Ok(_) => {}
        Err(CgroupError::MissingControllers { missing, .. }) => {
            assert!(missing.contains("memory"), "{missing}")
        }
        Err(e) => panic!("unexpected: {e}"),
    }
}
