#!/usr/bin/env python3
"""Builds the guest's initramfs (a newc cpio archive) from the host's installed Debian packages.

The guest runs the host's own programs: every file of the named packages (less documentation),
every shared library any included program loads (by `ldd`), and a tree of our own files (the init,
the test binaries) laid over them. Paths are written as the host resolves them, so Debian's
merged /usr (`/bin -> usr/bin`) comes out the same in the guest.

Usage: mkroot.py OUT --tree DIR [--package NAME]... [--file PATH]...
"""

import argparse
import os
import stat
import subprocess
import sys

SKIP_PREFIXES = (
    "/usr/share/doc/",
    "/usr/share/man/",
    "/usr/share/info/",
    "/usr/share/locale/",
    "/usr/share/lintian/",
    "/usr/share/bash-completion/",
    "/usr/share/zsh/",
)


def canonical(path):
    """The path with its directories resolved, but not its last component (a symlink stays one)."""
    d, b = os.path.split(path)
    return os.path.join(os.path.realpath(d), b)


def package_files(name):
    out = subprocess.run(["dpkg", "-L", name], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mkroot: package {name} is not installed (dpkg -L: {out.stderr.strip()})")
    return [p for p in out.stdout.splitlines() if p.startswith("/") and not p.startswith(SKIP_PREFIXES)]


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def libraries(path):
    """The shared objects `path` loads, as the host's loader finds them."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" ", 1)[0]
        else:
            target = line.split(" ", 1)[0]
        if target.startswith("/"):
            libs.append(target)
    return libs


class Archive:
    def __init__(self, out):
        self.f = open(out, "wb")
        self.ino = 1

    def entry(self, name, mode, data=b"", rdev=(0, 0), mtime=0):
        name_b = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, mtime, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0]
        self.ino += 1
        self.f.write(b"070701" + b"".join(b"%08x" % v for v in fields))
        self.f.write(name_b)
        self.pad()
        self.f.write(data)
        self.pad()

    def pad(self):
        self.f.write(b"\0" * (-self.f.tell() % 4))

    def close(self):
        self.entry("TRAILER!!!", 0)
        self.f.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tree", required=True, help="our own files, laid over the host's")
    ap.add_argument("--package", action="append", default=[])
    ap.add_argument("--file", action="append", default=[], help="a host file or directory (whole)")
    a = ap.parse_args()

    # guest path -> host source path (None for a directory made from its host counterpart).
    host = set()
    for p in a.package:
        host.update(package_files(p))
    for p in a.file:
        if os.path.isdir(p) and not os.path.islink(p):
            for root, dirs, files in os.walk(p):
                host.update(os.path.join(root, x) for x in dirs + files)
        host.add(p)
    entries = {}
    for p in host:
        c = canonical(p)
        if os.path.lexists(c):
            entries[c] = c
    tree = {}
    for root, dirs, files in os.walk(a.tree):
        for x in dirs + files:
            full = os.path.join(root, x)
            tree["/" + os.path.relpath(full, a.tree)] = full

    # Libraries of every program, ours and the host's, until nothing new turns up.
    todo = [src for src in list(entries.values()) + list(tree.values()) if os.path.isfile(src) and not os.path.islink(src) and is_elf(src)]
    seen = set()
    while todo:
        exe = todo.pop()
        for lib in libraries(exe):
            for p in (lib, os.path.realpath(lib)):
                c = canonical(p)
                if c not in entries and os.path.lexists(c):
                    entries[c] = c
                    if c not in seen:
                        seen.add(c)
                        todo.append(os.path.realpath(c))

    # Merged /usr: the top-level links, so that /bin/sh and /lib64/ld-linux… resolve.
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            entries[top] = top

    # Every parent directory, then everything in path order (a parent before its children).
    for p in list(entries) + list(tree):
        d = os.path.dirname(p)
        while d != "/" and d not in entries:
            entries[d] = d if os.path.isdir(d) and not os.path.islink(d) else None
            d = os.path.dirname(d)
    for p, src in tree.items():
        if entries.get(p) and os.path.islink(entries[p]) != os.path.islink(src):
            # A directory of ours over the host's merged-/usr link (`/lib`) would hide the link's
            # whole target in the guest: write it under the link's target instead.
            sys.exit(f"mkroot: {src} would replace the host's {entries[p]} (a symlink or not); use the resolved path")
        entries[p] = src

    arc = Archive(a.out)
    arc.entry("dev", stat.S_IFDIR | 0o755)
    arc.entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
    total = 0
    linked = {}
    for p in sorted(entries):
        if p == "/dev":
            continue
        src = entries[p]
        name = p.lstrip("/")
        if src is None:
            arc.entry(name, stat.S_IFDIR | 0o755)
            continue
        st = os.lstat(src)
        if stat.S_ISLNK(st.st_mode):
            arc.entry(name, st.st_mode, os.readlink(src).encode(), mtime=int(st.st_mtime))
        elif stat.S_ISDIR(st.st_mode):
            arc.entry(name, st.st_mode, mtime=int(st.st_mtime))
        elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in linked:
            # A hard link (git's many commands are one program): a symlink to the first copy.
            arc.entry(name, stat.S_IFLNK | 0o777, linked[(st.st_dev, st.st_ino)].encode())
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1:
                linked[(st.st_dev, st.st_ino)] = p
            with open(src, "rb") as f:
                data = f.read()
            total += len(data)
            arc.entry(name, st.st_mode, data, mtime=int(st.st_mtime))
    arc.close()
    print(f"mkroot: {len(entries)} entries, {total >> 20} MiB of file data -> {a.out}")


if __name__ == "__main__":
    main()
