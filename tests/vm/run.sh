#!/usr/bin/env bash
# The KVM guest matrix: boots Debian kernels in QEMU with an initramfs made of this host's programs
# and our test binaries, runs each configuration's tests inside, and fails unless every step of
# every configuration passed and the guest said it was done. See docs/vm-matrix.md.
#
# Usage: tests/vm/run.sh [--config NAME]... [--selftest] [--emulate | --or-emulate | --skip-without-kvm] [--list]
#   --config NAME       run only this configuration (repeatable); default: all of them, then the
#                       runner's own check (--selftest)
#   --selftest          only the runner's own check: a failing step, a crashed guest and a guest
#                       that dies before it speaks must each fail their configuration, for the
#                       right reason (the last after three boots)
#   --emulate           emulate the CPU (QEMU's TCG) instead of KVM: slow, about 5-10 times longer
#   --or-emulate        KVM where it can run Debian's kernels, otherwise emulate (and say so)
#   --skip-without-kvm  no KVM: print that the matrix was SKIPPED and exit 0
#   --list              print the configurations and exit
# Needs root (KVM, the kernel packages) and qemu-system-x86; `.ci/setup` installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=${PALISADE_VM_DIR:-$root/target/vm}

# name | kernel package (Debian meta package) | extra kernel command line | what it shows
CONFIGS=(
    "cgroup-v2|linux-image-6.12-cloud-amd64|cgroup_no_v1=all|cgroup v2 only (systemd hosts): every limits test on the v2 backend, as root and as a user with a delegated subtree"
    "debian12|linux-image-cloud-amd64||Debian 12's own 6.1 kernel: its Landlock ABI detected and reported, the boundary tests pass"
    "no-userns|linux-image-6.12-cloud-amd64|cgroup_no_v1=all|user.max_user_namespaces=0: palisade run refuses with the doctor's explanation, and palisade doctor says so"
)
# For these the runner must fail the configuration, and for the reason given after the last |.
SELFTESTS=(
    "selftest-fail|linux-image-6.12-cloud-amd64||a step that fails must fail the configuration|step false failed with status 1"
    "selftest-crash|linux-image-6.12-cloud-amd64||a guest that dies before it is done must fail the configuration|step crash started but never finished"
    "selftest-noboot|linux-image-6.12-cloud-amd64||a guest that dies before our init speaks is booted three times, then fails the configuration|the guest printed nothing on the results port"
)
TIMEOUT=${PALISADE_VM_TIMEOUT:-900}

die() { echo "tests/vm/run.sh: $*" >&2; exit 1; }

want=() selftest=0 accel=kvm
while [ $# -gt 0 ]; do
    case "$1" in
    --config) [ $# -ge 2 ] || die "--config needs a name (see --list)"; want+=("$2"); shift ;;
    --selftest) selftest=1 ;;
    --emulate) accel=tcg ;;
    --or-emulate) accel=auto ;;
    --skip-without-kvm) accel=skip ;;
    --list)
        for c in "${CONFIGS[@]}" "${SELFTESTS[@]}"; do IFS='|' read -r n k x d _ <<< "$c"; printf '%-15s %-30s %s\n' "$n" "$k" "$d"; done
        exit 0 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (accepted: --config NAME, --selftest, --emulate, --or-emulate, --skip-without-kvm, --list)" ;;
    esac
    shift
done

pick=()
if [ "$selftest" = 1 ]; then
    pick=("${SELFTESTS[@]}")
elif [ "${#want[@]}" -eq 0 ]; then
    pick=("${CONFIGS[@]}" "${SELFTESTS[@]}")
else
    for w in "${want[@]}"; do
        found=
        for c in "${CONFIGS[@]}" "${SELFTESTS[@]}"; do [ "${c%%|*}" = "$w" ] && found=$c; done
        [ -n "$found" ] || die "unknown configuration '$w' (accepted: $(for c in "${CONFIGS[@]}" "${SELFTESTS[@]}"; do printf '%s ' "${c%%|*}"; done))"
        # Once each: two guests of one name would share its directory.
        for c in "${pick[@]}"; do [ "$c" = "$found" ] && continue 2; done
        pick+=("$found")
    done
fi

[ "$(id -u)" = 0 ] || die "run as root (it opens /dev/kvm and unpacks kernel packages)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: apt-get install qemu-system-x86 (or run .ci/setup)"
# Why KVM cannot run the guests here, if it cannot: no device, or a KVM that runs only guests
# built for it (PVM, the kvm_pvm module: virtualization without VMX/SVM, seen on cloud VMs; a stock
# kernel stops in its decompressor with "KVM internal error ... emulation failure").
no_kvm=
if ! { [ -c /dev/kvm ] && : 2>/dev/null < /dev/kvm > /dev/kvm; }; then
    no_kvm="/dev/kvm is missing or cannot be opened: load kvm_intel or kvm_amd, or enable nested virtualization"
elif [ -d /sys/module/kvm_pvm ] && [ ! -d /sys/module/kvm_intel ] && [ ! -d /sys/module/kvm_amd ]; then
    no_kvm="this host's /dev/kvm is PVM (module kvm_pvm), which runs only kernels built as PVM guests; Debian's kernels stop in their first instructions under it"
fi
if [ -n "$no_kvm" ]; then
    case "$accel" in
    kvm) die "$no_kvm. Pass --emulate (slow) or --or-emulate to run the guests under QEMU's emulator, or --skip-without-kvm" ;;
    skip) echo "==== VM MATRIX SKIPPED (--skip-without-kvm): $no_kvm; nothing was tested in a guest ===="; exit 0 ;;
    auto) echo "==== no KVM for these guests ($no_kvm): EMULATING the CPU; slower, same tests ====" ; accel=tcg ;;
    esac
fi
case "$accel" in auto|skip) accel=kvm ;; esac
id palisade-test >/dev/null 2>&1 || die "user palisade-test is missing: run .ci/setup"
mkdir -p "$work/kernels"

# Kernel: the newest version a Debian meta package depends on, unpacked once into the cache.
# Called in the main shell only (below, into `vmlinuz_of`), never by the guests' parallel jobs.
kernel() {
    local meta=$1 pkg dir
    pkg=$(apt-cache depends --no-recommends --no-suggests "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
    [ -n "$pkg" ] || die "apt does not know $meta (run apt-get update)"
    dir=$work/kernels/$pkg
    if ! ls "$dir"/boot/vmlinuz-* >/dev/null 2>&1; then
        rm -rf "$dir" "$work/kernels/dl" && mkdir -p "$work/kernels/dl"
        (cd "$work/kernels/dl" && apt-get download -q "$pkg" >&2 2>/dev/null) || die "apt-get download $pkg failed"
        dpkg-deb -x "$work/kernels/dl/"*.deb "$dir"
        rm -rf "$work/kernels/dl"
    fi
    ls "$dir"/boot/vmlinuz-*[0-9a-z]
}

# The initramfs: the host's programs, our binaries (debug info stripped) and the guest script.
echo "== building the test binaries"
cargo build --quiet --bins
cargo test --quiet --no-run --message-format=json -p palisade -p palisade-cli -p palisade-cgroup 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' > "$work/tests.txt"
tree=$work/tree
rm -rf "$tree" && mkdir -p "$tree/opt/palisade/tests" "$tree/proc" "$tree/sys" "$tree/tmp" "$tree/run" "$tree/root"
install -m 755 tests/vm/guest.sh "$tree/init"
strip --strip-debug -o "$tree/opt/palisade/palisade" target/debug/palisade
strip --strip-debug -o "$tree/opt/palisade/palisade-probe" target/debug/palisade-probe
while read -r name exe; do
    strip --strip-debug -o "$tree/opt/palisade/tests/$name" "$exe"
done < "$work/tests.txt"
chmod -R a+rX "$tree/opt"
# The loop driver (a module in Debian's kernels), for the configurations whose /tmp is ext4.
declare -A vmlinuz_of=()
for c in "${pick[@]}"; do
    IFS='|' read -r _ meta _ <<< "$c"
    if [ -z "${vmlinuz_of[$meta]:-}" ]; then
        vmlinuz_of[$meta]=$(kernel "$meta") || die "no kernel for $meta"
        [ -f "${vmlinuz_of[$meta]}" ] || die "no kernel for $meta: '${vmlinuz_of[$meta]}' is not a file"
    fi
    kdir=$(dirname "$(dirname "${vmlinuz_of[$meta]}")")
    for ko in "$kdir"/lib/modules/*/kernel/drivers/block/loop.ko*; do
        [ -e "$ko" ] || continue
        ver=$(basename "$(dirname "$(dirname "$(dirname "$(dirname "$ko")")")")")
        mkdir -p "$tree/usr/lib/modules/$ver"
        case "$ko" in
        *.xz) xz -dc "$ko" > "$tree/usr/lib/modules/$ver/loop.ko" ;;
        *.zst) zstd -dcq "$ko" > "$tree/usr/lib/modules/$ver/loop.ko" ;;
        *) cp "$ko" "$tree/usr/lib/modules/$ver/loop.ko" ;;
        esac
    done
done
echo "== building the initramfs"
python3 tests/vm/mkroot.py "$work/initramfs.cpio" --tree "$tree" \
    --package bash --package dash --package coreutils --package util-linux --package mount --package procps \
    --package libc-bin --package grep --package sed --package busybox-static --package e2fsprogs --package findutils --package iproute2 --package hostname \
    --package python3-minimal --package python3.11-minimal --package libpython3.11-minimal \
    --package libpython3.11-stdlib \
    --package gcc --package gcc-12 --package cpp --package cpp-12 --package binutils \
    --package binutils-x86-64-linux-gnu --package libgcc-12-dev --package libc6-dev \
    --package linux-libc-dev --package libcrypt-dev --package git \
    --file /etc/passwd --file /etc/group --file /etc/nsswitch.conf --file /etc/hosts \
    --file /etc/ld.so.conf --file /etc/ld.so.conf.d --file /etc/ld.so.cache --file /etc/alternatives --file /usr/bin/cc

# One configuration: boot, wait for the guest to power off, read its results port.
results=()
failed=0
run_config() {
    local name=$1 meta=$2 extra=$3 vmlinuz dir rc=0 t0
    vmlinuz=${vmlinuz_of[$meta]}
    dir=$work/$name && rm -rf "$dir" && mkdir -p "$dir"
    echo "== $name: $(basename "$vmlinuz") ($accel)"
    t0=$SECONDS
    timeout --foreground "$TIMEOUT" qemu-system-x86_64 -nodefaults -no-reboot -display none \
        -accel "$accel" $([ "$accel" = kvm ] && echo -cpu host,-arch-capabilities) -machine q35 -smp 2 -m 4096 \
        -kernel "$vmlinuz" -initrd "$work/initramfs.cpio" \
        -append "console=ttyS0 panic=-1 loglevel=4 palisade_vm=$name $extra" \
        -serial "file:$dir/console.log" -serial "file:$dir/results.log" || rc=$?
    local secs=$((SECONDS - t0))
    [ "$rc" = 124 ] && echo "   the guest did not finish within ${TIMEOUT}s" >> "$dir/runner.log"
    python3 - "$name" "$dir" "$rc" "$secs" <<'EOF'
import os, sys
name, d, rc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
steps, done, boot, cur, out = [], False, None, None, {}
for line in open(os.path.join(d, "results.log"), errors="replace") if os.path.exists(os.path.join(d, "results.log")) else []:
    line = line.rstrip("\r\n")
    if line.startswith("@@pvm "):
        w = line.split()
        if w[1] == "boot":
            boot = " ".join(w[2:])
        elif w[1] == "step":
            cur = w[2]
            out[cur] = []
        elif w[1] == "result":
            steps.append((w[2], int(w[3]), w[4]))
            cur = None
        elif w[1] == "done":
            done = True
    elif cur is not None:
        out[cur].append(line)
bad = [s for s in steps if s[1] != 0]
started = set(out) - {s[0] for s in steps}
problems = []
if rc not in (0,):
    problems.append(f"qemu exited with status {rc}" + (" (timed out)" if rc == 124 else ""))
if boot is None:
    problems.append("the guest printed nothing on the results port")
if not steps:
    problems.append("no step ran")
for s in started:
    problems.append(f"step {s} started but never finished")
if not done:
    problems.append("the guest never said it was done (crashed, hung or powered off early)")
for s in bad:
    problems.append(f"step {s[0]} failed with status {s[1]}")
with open(os.path.join(d, "summary.txt"), "w") as f:
    f.write(f"{name}\t{'PASS' if not problems else 'FAIL'}\t{secs}s\t{boot or '-'}\n")
    for s in steps:
        f.write(f"  {s[0]}\t{'ok' if s[1] == 0 else 'FAILED (' + str(s[1]) + ')'}\t{s[2]}s\n")
    for p in problems:
        f.write(f"  PROBLEM: {p}\n")
print(open(os.path.join(d, "summary.txt")).read(), end="")
for s in bad:
    print(f"---- output of {s[0]} (last 60 lines; all of it in {d}/results.log)")
    print("\n".join(out.get(s[0], [])[-60:]))
for s in started:
    print(f"---- output of unfinished step {s} (last 60 lines)")
    print("\n".join(out.get(s, [])[-60:]))
if problems:
    print(f"---- guest console (last 30 lines of {d}/console.log)")
    try:
        print("\n".join(open(os.path.join(d, "console.log"), errors="replace").read().splitlines()[-30:]))
    except OSError:
        print("(no console log)")
# 3: the guest died before our init said a word (a kernel that crashed while it booted).
sys.exit(0 if not problems else 3 if boot is None and rc != 124 else 1)
EOF
}

# A configuration with its boots: an emulated kernel now and then dies while it boots, before it
# runs our init (QEMU's multi-threaded emulator and the kernel patching its own code: an "int3"
# Oops in early boot). No test ran then, so the guest is booted again, at most twice, and the
# runner says so; a guest that reached our init is never booted again, whatever happened to it
# after that. Its output goes to $work/NAME.out, its status and boot count to $work/NAME.rc.
config_with_boots() {
    local name=$1 meta=$2 extra=$3 attempt rc
    for attempt in 1 2 3; do
        rc=0
        run_config "$name" "$meta" "$extra" || rc=$?
        [ "$rc" = 3 ] && [ "$attempt" -lt 3 ] || break
        mv "$work/$name/console.log" "$work/$name-console.attempt$attempt.log"
        echo "== $name: the guest's kernel died before it ran our init (no test ran; attempt $attempt of 3, its console is in $work/$name-console.attempt$attempt.log): booting it again"
    done
    echo "$rc $attempt" > "$work/$name.rc"
}

# The guests run side by side, PALISADE_VM_JOBS at a time (default 2: each guest has 2 CPUs and
# 4 GiB, and an emulated guest keeps about 1.6 host CPUs busy, so more than two gain little on a
# small machine), in the order listed; their output is shown in that order once all are done.
jobs_max=${PALISADE_VM_JOBS:-2}
[[ "$jobs_max" =~ ^[1-9][0-9]*$ ]] || die "PALISADE_VM_JOBS must be a whole number of guests, 1 or more, not '$jobs_max'"
echo "== running ${#pick[@]} configurations, $jobs_max at a time"
running=0
for c in "${pick[@]}"; do
    IFS='|' read -r name meta extra _ <<< "$c"
    # Nothing of an earlier run of it may stand in for this one's results.
    rm -rf "$work/$name" "$work/$name.rc" "$work/$name.out"
    if [ "$running" -ge "$jobs_max" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "== $name: started ($(date +%T))"
    config_with_boots "$name" "$meta" "$extra" > "$work/$name.out" 2>&1 &
    running=$((running + 1))
done
wait || true
for c in "${pick[@]}"; do
    IFS='|' read -r name meta extra desc why <<< "$c"
    cat "$work/$name.out"
    rc=1 attempt=0
    [ -s "$work/$name.rc" ] && read -r rc attempt < "$work/$name.rc"
    if [ "$rc" = 0 ]; then r=PASS; else r=FAIL; fi
    results+=("$name $r")
    if [ ! -f "$work/$name/summary.txt" ]; then
        echo "$name: the runner's job for it ended without a summary (status $rc)"; failed=1
    elif [ -n "$why" ]; then
        # The runner is right only if it failed each of these, after a boot, for the named reason.
        if [ "$r" = PASS ]; then
            echo "SELFTEST: configuration $name passed but must fail"; failed=1
        elif ! grep -qF "PROBLEM: $why" "$work/$name/summary.txt"; then
            echo "SELFTEST: configuration $name failed, but not (only) because: $why"; failed=1
        elif [ "$name" = selftest-noboot ]; then
            [ "$attempt" = 3 ] || { echo "SELFTEST: configuration $name was booted $attempt times, not 3"; failed=1; }
        elif grep -q $'\t-$' <(head -1 "$work/$name/summary.txt"); then
            echo "SELFTEST: configuration $name failed before its guest booted, not because: $why"; failed=1
        fi
    else
        [ "$r" = PASS ] || failed=1
    fi
done

{
    echo "| configuration | kernel | CPU | result | time |"
    echo "|---|---|---|---|---|"
    for c in "${pick[@]}"; do
        IFS='|' read -r name meta extra desc <<< "$c"
        r=FAIL secs=- boot=-
        [ -f "$work/$name/summary.txt" ] && IFS=$'\t' read -r _ r secs boot < "$work/$name/summary.txt"
        echo "| $name | ${boot%% config=*} | $([ "$accel" = kvm ] && echo KVM || echo emulated) | $r | $secs |"
    done
} > "$work/results.md"
echo "== VM matrix (the selftest-* rows must FAIL: they check the runner)"
cat "$work/results.md"
[ "$failed" = 0 ] && echo "== VM matrix: every configuration passed, and the runner failed every broken guest"
exit $failed
