//! A tar archive to unpack in a sandbox (`PUT /v1/sandboxes/{id}/archive`), checked whole by the
//! server before any of it is sent, so that a bad entry late in it leaves nothing half unpacked.
//! The agent then unpacks it as it reads it from its socket ([`crate::agent`]), checking each
//! entry again with [`entry`]: it never holds the archive, whose bytes would count against the
//! session's memory twice (once in the agent, once as the files).
//!
//! What is unpacked: regular files and directories, with relative names (`./a/b` is `a/b`) that
//! [`proto::check_path`] accepts under the target directory; at most [`MAX_ENTRIES`] entries. An
//! entry of any other kind (a link, a device, a fifo), an absolute name, a `..` component, a name
//! that is not UTF-8, a name that is both a file and a directory, or one under a name the archive
//! has as a file, refuses the whole archive.

use crate::proto;
use std::collections::HashMap;

/// Most entries in an archive, either way (unpacked, or made by the agent).
pub const MAX_ENTRIES: usize = 100_000;

/// What one file or directory costs in the session's memory beside its content: the kernel's
/// inode and dentry for it in the scratch tmpfs (~1 KiB measured on Linux 6.18: 30,000 empty
/// directories took 29 MiB), with a margin of four for other kernels (the VM matrix's 6.12 guest
/// had a session's agent killed with 2 KiB held for each).
pub const ENTRY_COST: u64 = 4096;

/// The memory a file of `len` bytes at `path` takes in a tmpfs, at most: its content in whole
/// pages, and an entry's cost ([`ENTRY_COST`], with its name) for it and each directory above it
/// (which may have to be made).
pub fn file_cost(path: &str, len: u64) -> u64 {
    const PAGE: u64 = 4096;
    let names: u64 = path
        .split('/')
        .filter(|c| !c.is_empty())
        .map(|c| ENTRY_COST + c.len() as u64)
        .sum();
    len.div_ceil(PAGE)
        .saturating_mul(PAGE)
        .saturating_add(names)
}

/// What one entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A regular file, with its permission bits.
    File(u32),
}

/// Why an archive or an entry is refused: a stable code (`invalid`, `too-large`) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub &'static str, pub String);

/// The entry's relative path (`None` for the archive's own `./`) and kind, or why it is refused.
pub fn entry<R: std::io::Read>(e: &tar::Entry<'_, R>) -> Result<Option<(String, Kind)>, Refused> {
    let raw = e.path_bytes();
    let name = std::str::from_utf8(&raw)
        .map_err(|_| Refused("invalid", "an entry name that is not UTF-8".into()))?;
    // `./a/b` is `a/b`; `..`, absolute names and NUL bytes are refused.
    let comps: Vec<&str> = name
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if name.starts_with('/') || comps.contains(&"..") {
        return Err(Refused(
            "invalid",
            format!("entry `{}`: {}", name.escape_debug(), proto::PATH_EXPECTED),
        ));
    }
    if comps.is_empty() {
        return Ok(None);
    }
    let rel = comps.join("/");
    proto::check_path(&rel)
        .map_err(|m| Refused("invalid", format!("entry `{}`: {m}", name.escape_debug())))?;
    let kind = match e.header().entry_type() {
        tar::EntryType::Directory => Kind::Dir,
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            Kind::File(e.header().mode().unwrap_or(0o644) & 0o777)
        }
        other => {
            return Err(Refused(
                "invalid",
                format!(
                    "entry `{rel}` is a {other:?}: only regular files and directories are unpacked"
                ),
            ))
        }
    };
    Ok(Some((rel, kind)))
}

/// Checks the whole archive (see the module's text) without unpacking any of it; returns the
/// memory it takes once unpacked, at most: its files' content in whole pages, and an entry's
/// cost for each file and directory it names or makes ([`ENTRY_COST`]). Without the entries', an
/// archive of 30,000 empty directories took 29 MiB of a session's memory while it reserved none.
pub fn check(data: &[u8]) -> Result<u64, Refused> {
    let mut ar = tar::Archive::new(data);
    let entries = ar
        .entries()
        .map_err(|e| Refused("invalid", format!("not a tar archive: {e}")))?;
    // Each name: whether it is a directory.
    let mut kind: HashMap<String, bool> = HashMap::new();
    let mut n = 0;
    let mut content: u64 = 0;
    for e in entries {
        let e = e.map_err(|e| Refused("invalid", format!("a bad tar entry: {e}")))?;
        n += 1;
        if n > MAX_ENTRIES {
            return Err(Refused(
                "too-large",
                format!("more than {MAX_ENTRIES} entries"),
            ));
        }
        let Some((rel, k)) = entry(&e)? else {
            continue;
        };
        // The content must be there whole (the reader has skipped what it could not see).
        let start = e.raw_file_position() as usize;
        if k != Kind::Dir && start.saturating_add(e.size() as usize) > data.len() {
            return Err(Refused(
                "invalid",
                format!("entry `{rel}`: the archive ends inside its content"),
            ));
        }
        if k != Kind::Dir {
            content = content.saturating_add(e.size().div_ceil(4096).saturating_mul(4096));
        }
        let dir = k == Kind::Dir;
        if kind.insert(rel.clone(), dir).is_some_and(|d| d != dir) {
            return Err(Refused(
                "invalid",
                format!("entry `{rel}` is both a file and a directory in the archive"),
            ));
        }
    }
    // Every name once, and each directory above one (made if it is missing).
    let mut names: std::collections::HashSet<&str> = kind.keys().map(String::as_str).collect();
    for rel in kind.keys() {
        let mut at = 0;
        while let Some(i) = rel[at..].find('/') {
            names.insert(&rel[..at + i]);
            at += i + 1;
        }
    }
    let entries: u64 = names
        .iter()
        .map(|n| ENTRY_COST + n.rsplit('/').next().map_or(0, str::len) as u64)
        .sum();
    for rel in kind.keys() {
        let mut at = 0;
        while let Some(i) = rel[at..].find('/') {
            let up = &rel[..at + i];
            if kind.get(up) == Some(&false) {
                return Err(Refused(
                    "invalid",
                    format!("entry `{rel}` is under `{up}`, which the archive has as a file"),
                ));
            }
            at += i + 1;
        }
    }
    Ok(content.saturating_add(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o640);
            h.set_size(data.len() as u64);
            // Names the builder itself would refuse (`..`) go in raw.
            let field = &mut h.as_old_mut().name;
            field[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn archives_are_checked_whole() {
        use tar::EntryType::{Directory, Regular, Symlink};
        let ok = archive(&[
            ("./", Directory, b""),
            ("a/", Directory, b""),
            ("a/b", Regular, b"x"),
        ]);
        // A page for `a/b`'s byte; entries `a` and `a/b`.
        assert_eq!(check(&ok), Ok(4096 + 2 * ENTRY_COST + 2));
        // A directory made for `x/y` counts too.
        let deep = archive(&[("x/y", Regular, b"")]);
        assert_eq!(check(&deep), Ok(2 * ENTRY_COST + 2));
        assert_eq!(file_cost("p/q.txt", 4097), 8192 + 2 * ENTRY_COST + 1 + 5);
        for (bad, why) in [
            (archive(&[("../x", Regular, b"")]), "PATH"),
            (archive(&[("/etc/x", Regular, b"")]), "PATH"),
            (archive(&[("l", Symlink, b"")]), "Symlink"),
            (
                archive(&[("a", Regular, b""), ("a/", Directory, b"")]),
                "both",
            ),
            (
                archive(&[("a", Regular, b""), ("a/b", Regular, b"")]),
                "under",
            ),
        ] {
            let e = check(&bad).expect_err(why);
            assert_eq!(e.0, "invalid");
            let expect = if why == "PATH" { "relative path" } else { why };
            assert!(e.1.contains(expect), "{e:?}");
        }
        // Cut inside a file's content.
        let whole = archive(&[("f", Regular, &[7u8; 2048])]);
        assert!(check(&whole[..1024]).is_err());
        // Not an archive: a block whose checksum is wrong.
        assert!(check(&[b'x'; 1024]).is_err());
    }
}
