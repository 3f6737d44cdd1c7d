#!/bin/bash
# The guest side of the VM matrix (tests/vm/run.sh). The kernel starts it as /init from the
# initramfs; it copies the root into a tmpfs and switches to it (pivot_root, which the sandbox
# uses, cannot leave the initramfs's rootfs), sets the host up as the configuration asks, runs its
# steps and reports each on the second serial port (/dev/ttyS1):
#   @@pvm step NAME            before a step's output
#   @@pvm result NAME RC SECS  after it
#   @@pvm done                 when every step ran
# The host counts a configuration as passed only if `done` arrived and every result is 0.
set -u
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin

if [ "$$" = 1 ] && [ "${PVM_STAGE:-1}" = 1 ]; then
    mount -t proc proc /proc
    mount -t devtmpfs dev /dev 2>/dev/null
    mkdir -p /newroot
    mount -t tmpfs -o mode=0755,size=80% root /newroot
    for d in /*; do
        case "$d" in /newroot|/proc|/dev|/sys) continue ;; esac
        cp -a "$d" /newroot/
    done
    mkdir -p /newroot/proc /newroot/dev /newroot/sys
    umount /proc /dev
    export PVM_STAGE=2
    exec switch_root /newroot /init
fi

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=0755 run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
hostname palisade-vm

out=/dev/ttyS1
stty -F "$out" raw -echo 2>/dev/null
config=$(sed -n 's/.*palisade_vm=\([a-z0-9-]*\).*/\1/p' /proc/cmdline)
say() { printf '@@pvm %s\n' "$*" > "$out"; }
off() { sync; echo o > /proc/sysrq-trigger; sleep 10; }

P=/opt/palisade
T=$P/tests
TEST_USER=palisade-test
uid=$(id -u "$TEST_USER") gid=$(id -g "$TEST_USER")
home=$(getent passwd "$TEST_USER" | cut -d: -f6)
mkdir -p "$home" && chown "$uid:$gid" "$home"

# step NAME COMMAND...: runs COMMAND as root with its output on the results port.
step() {
    local name=$1
    shift
    say "step $name"
    local t0=$SECONDS
    (cd /tmp && "$@") > "$out" 2>&1 < /dev/null
    local rc=$?
    say "result $name $rc $((SECONDS - t0))"
}

# as_user COMMAND...: COMMAND as the test user, started from the cgroup root delegated to that user
# (what `systemd-run --user --scope -p Delegate=yes` gives a user on a systemd host).
# A subshell of its own, so that the checks below can call it and go on.
as_user() (
    leaf=/sys/fs/cgroup/palisade/user-$uid/palisade-procs
    if [ -d "$leaf" ]; then
        echo "$BASHPID" > "$leaf/cgroup.procs" || { echo "cannot move into $leaf"; exit 1; }
    fi
    exec setpriv --reuid="$uid" --regid="$gid" --init-groups \
        env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" TMPDIR=/tmp \
        PALISADE_BIN=$P/palisade PALISADE_PROBE=$P/palisade-probe "$@"
)

as_root() {
    env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root TMPDIR=/tmp \
        PALISADE_BIN=$P/palisade PALISADE_PROBE=$P/palisade-probe "$@"
}

# The kernel's own Landlock ABI, asked directly (landlock_create_ruleset with the VERSION flag).
kernel_abi() {
    python3 -c 'import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1))'
}

# expect_text FILE TEXT...: each TEXT is in FILE (which is printed first).
expect_text() {
    local f=$1 rc=0
    shift
    cat "$f"
    for t in "$@"; do
        grep -qF -- "$t" "$f" || { echo "MISSING: $t"; rc=1; }
    done
    return $rc
}

# The report of a plain run names cgroup v2 and the kernel's Landlock ABI.
check_report() {
    local who=$1 abi
    abi=$(kernel_abi)
    echo "kernel Landlock ABI: $abi"
    $who $P/palisade run --json -q -- /bin/true > /tmp/report.json || return 1
    python3 - "$abi" /tmp/report.json <<'EOF'
import json, sys
abi, report = sys.argv[1], json.load(open(sys.argv[2]))
layers = {l["name"]: l for l in report["layers"]}
cg, ll = layers["cgroup-limits"], layers["landlock"]
print("cgroup:", report["cgroup"], "|", cg)
print("landlock_abi:", report["landlock_abi"], "|", ll)
assert cg["enforced"] and cg["detail"].startswith("cgroup v2"), "cgroup ceilings are not on the v2 backend"
assert report["landlock_abi"] == int(abi) and ll["enforced"] and ll["detail"].startswith(f"ABI {abi}:"), \
    f"the report does not give the kernel's Landlock ABI {abi}"
EOF
}

# Refused with the doctor's explanation: exit status 125-127, the sysctl named, nothing run.
check_refused() {
    local who=$1
    $who $P/palisade run -- /bin/sh -c 'echo RAN' > /tmp/run.out 2> /tmp/run.err
    local rc=$?
    echo "palisade run exit status: $rc"
    cat /tmp/run.out
    [ "$rc" -ge 125 ] && [ "$rc" -le 127 ] || { echo "expected 125-127"; return 1; }
    ! grep -q RAN /tmp/run.out || { echo "the payload ran"; return 1; }
    expect_text /tmp/run.err "max_user_namespaces"
}

check_doctor_says_no_userns() {
    local who=$1
    $who $P/palisade doctor > /tmp/doctor.out 2>&1
    local rc=$?
    echo "palisade doctor exit status: $rc"
    [ "$rc" != 0 ] || { cat /tmp/doctor.out; echo "doctor passed on a host without user namespaces"; return 1; }
    expect_text /tmp/doctor.out "user.max_user_namespaces = 0" "sysctl -w user.max_user_namespaces"
}

check_doctor_landlock() {
    local who=$1 abi
    abi=$(kernel_abi)
    $who $P/palisade doctor > /tmp/doctor.out 2>&1
    local rc=$?
    echo "palisade doctor exit status: $rc; kernel Landlock ABI: $abi"
    expect_text /tmp/doctor.out "ABI $abi" || return 1
    [ "$rc" = 0 ]
}

# Root's writable bind of a tmpfs directory on a kernel before 6.3 (no idmapped tmpfs): refused
# with the reason, nothing run.
check_idmap_refused() {
    mkdir -p /run/rw-test
    as_root $P/palisade run -q --rw /run/rw-test -- /bin/sh -c 'echo RAN' > /tmp/run.out 2> /tmp/run.err
    local rc=$?
    echo "palisade run exit status: $rc"
    cat /tmp/run.out
    [ "$rc" = 125 ] || { echo "expected 125"; return 1; }
    ! grep -q RAN /tmp/run.out || { echo "the payload ran"; return 1; }
    expect_text /tmp/run.err "idmapped mount" "tmpfs on Linux 6.3+"
}

tmp_on_ext4() {
    busybox insmod "/lib/modules/$(uname -r)/loop.ko" || return 1
    truncate -s 3G /run/tmp.img && mkfs.ext4 -q /run/tmp.img && mount -o loop /run/tmp.img /tmp \
        && chmod 1777 /tmp && findmnt /tmp
}

# The test binaries of a suite, root then user, one step each.
suite() {
    local t
    for t in "$@"; do
        step "root:$t" as_root "$T/$t" --quiet --include-ignored # with the tests that need root
    done
    step "delegate" $P/palisade cgroup-delegate --user "$TEST_USER"
    for t in "$@"; do
        step "user:$t" as_user "$T/$t" --quiet
    done
}

# The runner's check of its retry: a guest that dies before it says a word, as a kernel that
# crashes while it boots does.
[ "$config" = selftest-noboot ] && echo c > /proc/sysrq-trigger
say "boot $(uname -r) config=$config"
case "$config" in
cgroup-v2)
    step "root:report" check_report as_root
    suite palisade_cgroup v2_kernel stale_kernel exec_kernel limits library boundary cli
    # A session's execs in cgroups of their own (the run's processes moved into a leaf first):
    # the server's OOM tests (and a file written into a full session), on the v2 kernel.
    step "root:server-oom" as_root "$T/server" --quiet _oom full_session
    step "user:server-oom" as_user "$T/server" --quiet _oom full_session
    step "user:report" check_report as_user
    # Removed cgroups giving back their pages: written on a disk file system (a tmpfs's pages,
    # as this guest's root file system's, cannot be given back without swap).
    step "tmp-on-ext4" tmp_on_ext4
    step "root:held_kernel" as_root "$T/held_kernel" --quiet --include-ignored
    # The hierarchy with `memory_localevents`: a kill is counted only in the victim's own cgroup,
    # so a run's (a session's) total must add its execs' and its leaf's, as on v1. Last: the
    # flag is the whole hierarchy's.
    step "root:localevents" mount -o remount,memory_localevents /sys/fs/cgroup
    step "root:v2_kernel-localevents" as_root "$T/v2_kernel" --quiet --include-ignored
    step "root:server-oom-localevents" as_root "$T/server" --quiet _oom full_session
    ;;
no-userns)
    sysctl -q -w user.max_user_namespaces=0
    step "root:refused" check_refused as_root
    step "root:doctor" check_doctor_says_no_userns as_root
    step "user:refused" check_refused as_user
    step "user:doctor" check_doctor_says_no_userns as_user
    ;;
debian12)
    # /tmp on ext4, as on a Debian 12 host (its /tmp is the root file system, not a tmpfs): root's
    # writable binds need idmapped mounts, which tmpfs has only from Linux 6.3.
    step "tmp-on-ext4" tmp_on_ext4
    step "root:doctor" check_doctor_landlock as_root
    step "root:rw-on-old-tmpfs-refused" check_idmap_refused
    step "root:report" check_report as_root
    suite boundary limits library cli
    step "user:report" check_report as_user
    ;;
selftest-fail)
    step "false" false
    ;;
selftest-crash)
    say "step crash"
    echo c > /proc/sysrq-trigger
    ;;
*)
    say "step config"
    echo "unknown configuration '$config'" > "$out"
    say "result config 1 0"
    ;;
esac
say done
off
