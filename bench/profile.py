"""Where the CPU of a start goes: samples from `perf record -g` (software clock, every process the
command starts; kernel work done later in kernel threads, such as a network namespace's cleanup,
is not in them), each counted once under the first of the categories below that its stack
contains, in the order listed. Reads `perf script -F comm,ip,sym,dso` on stdin.

Usage: perf script -i FILE -F comm,ip,sym,dso | python3 bench/profile.py RUNS HZ
"""

import collections
import sys

# (category, substrings of a frame): a sample goes to the first category any of its frames
# matches, so the specific ones come first.
CATEGORIES = [
    ("network namespace: create", ["copy_net_ns"]),
    ("other namespaces: create", ["create_new_namespaces", "copy_namespaces"]),
    ("clone: copy the caller's page tables", ["dup_mmap"]),
    ("clone: the rest", ["copy_process"]),
    ("exit: tear down memory and namespaces", ["exit_mmap", "do_exit", "do_group_exit"]),
    ("exec (kernel)", ["bprm_execve", "do_execveat_common"]),
    ("cgroup: mkdir", ["cgroup_mkdir"]),
    ("cgroup: rmdir", ["cgroup_rmdir"]),
    ("cgroup: files read and written", ["kernfs_fop_write_iter", "kernfs_fop_read_iter", "kernfs_fop_open", "kernfs_iop_lookup"]),
    ("mount view: open_tree, move_mount, mount_setattr", ["sys_open_tree", "sys_move_mount", "sys_mount_setattr"]),
    ("mount(2): tmpfs, proc, devpts, remounts", ["__x64_sys_mount"]),
    ("pivot_root, umount", ["sys_pivot_root", "__x64_sys_umount"]),
    ("seccomp", ["do_seccomp", "__seccomp_filter"]),
    ("Landlock", ["landlock_"]),
    ("loopback up (ioctl)", ["devinet_ioctl", "inet_ioctl"]),
    ("page faults", ["exc_page_fault"]),
    ("open, openat2, close, stat", ["do_sys_openat2", "__x64_sys_close", "__x64_sys_statx", "newfstatat", "do_statx", "__fput"]),
    ("mmap, munmap, mprotect", ["ksys_mmap_pgoff", "__vm_munmap", "__x64_sys_munmap", "__x64_sys_mprotect"]),
    ("read, write (pipes, sockets, files)", ["ksys_read", "ksys_write", "sock_sendmsg", "sock_recvmsg"]),
    ("scheduler, wait", ["schedule", "finish_task_switch", "do_wait"]),
    ("other system calls", ["do_syscall_64"]),
    ("ld.so: loading and relocating", ["ld-linux"]),
    ("glibc start-up: cpuid probing", ["init_cpu_features", "handle_amd", "handle_intel"]),
    ("palisade's own code", ["palisade"]),
    ("libc and the rest of user space", [""]),
]


def main():
    runs, hz = float(sys.argv[1]), float(sys.argv[2])
    counts = collections.Counter()
    by_comm = collections.Counter()
    total = 0
    frames, comm = [], None

    def flush():
        nonlocal total
        if not frames:
            return
        total += 1
        by_comm[comm] += 1
        for name, keys in CATEGORIES:
            if any(k in f for f in frames for k in keys):
                counts[name] += 1
                return

    for line in sys.stdin:
        if not line.strip():
            flush()
            frames = []
        elif not line.startswith((" ", "\t")):
            comm = line.split()[0] if line.split() else "?"
        else:
            frames.append(line.strip())
    flush()
    ms = lambda n: n / hz / runs * 1000  # noqa: E731
    print(f"CPU per run: {ms(total):.2f} ms ({total} samples)")
    print("| where | ms per run | share |")
    print("|---|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {ms(n):.3f} | {100 * n / total:.1f} % |")
    print()
    print("by process: " + ", ".join(f"{c} {ms(n):.2f} ms" for c, n in by_comm.most_common()))


if __name__ == "__main__":
    main()
