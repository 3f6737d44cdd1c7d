//! A change set as a unified diff in git's format, which `git apply` takes: `diff --git`
//! headers, new and deleted file modes, mode changes, renames found by contents, symbolic links
//! as their targets (mode 120000), text hunks with three lines of context. A binary file (a NUL
//! byte in its first 8000 bytes, as git judges) or one past [`MAX_TEXT`] is summarized in git's
//! words, `Binary files … differ`, which `git apply` does not apply. The old side is the project
//! as it is now; entries in conflict are named in [`DiffOutput::warnings`].
//!
//! The bytes written are the files' own (what `git apply` needs): a caller that shows them on a
//! terminal escapes them first (the command line does).

use super::*;
use std::collections::HashMap;
use std::io::Write;

/// Largest file shown as text.
pub const MAX_TEXT: u64 = 8 << 20;
/// Most differing lines the line diff works through before it shows a changed stretch as one
/// removal and one addition (still a correct patch, bounded work: memory grows with its square).
const MAX_EDITS: isize = 2000;
const CONTEXT: usize = 3;

/// What [`ChangeSet::diff`] wrote.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffOutput {
    /// Files in the diff.
    pub files: u64,
    /// Of which summarized as binary.
    pub binary: u64,
    /// Entries the diff cannot show, and entries in conflict.
    pub warnings: Vec<String>,
}

/// Git's C-style quoting of a path when it holds bytes that need it.
fn quote(prefix: &str, p: &[u8]) -> String {
    let needs = p
        .iter()
        .any(|&b| b < 0x20 || b == 0x7f || b == b'"' || b == b'\\' || b >= 0x80);
    let mut s = String::new();
    if !needs {
        s.push_str(prefix);
        s.push_str(&String::from_utf8_lossy(p));
        return s;
    }
    s.push('"');
    s.push_str(prefix);
    for &b in p {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s.push('"');
    s
}

/// Git's file mode for a file's permission bits: executable or not.
fn git_mode(kind: EntryKind, mode: u32) -> &'static str {
    match kind {
        EntryKind::Symlink => "120000",
        _ if mode & 0o111 != 0 => "100755",
        _ => "100644",
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Del,
    Ins,
}

/// Lines with their terminators (the last one may lack it).
fn lines(b: &[u8]) -> Vec<&[u8]> {
    b.split_inclusive(|&c| c == b'\n').collect()
}

/// Myers' O(ND) diff of two line lists; `None` past [`MAX_EDITS`] edits.
fn myers(a: &[&[u8]], b: &[&[u8]]) -> Option<Vec<Op>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = n + m;
    let off = max + 1;
    let mut v = vec![0isize; (2 * max + 3) as usize];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'outer: for d in 0..=max {
        if d > MAX_EDITS {
            return None;
        }
        trace.push(v[(off - d - 1) as usize..=(off + d + 1) as usize].to_vec());
        let mut k = -d;
        while k <= d {
            let i = (off + k) as usize;
            let mut x = if k == -d || (k != d && v[i - 1] < v[i + 1]) {
                v[i + 1]
            } else {
                v[i - 1] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[i] = x;
            if x >= n && y >= m {
                found = Some(d);
                break 'outer;
            }
            k += 2;
        }
    }
    let (mut x, mut y) = (n, m);
    let mut ops = Vec::new();
    for d in (0..=found?).rev() {
        let snap = &trace[d as usize];
        let get = |k: isize| snap[(k + d + 1) as usize];
        let k = x - y;
        let prev_k = if k == -d || (k != d && get(k - 1) < get(k + 1)) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = get(prev_k);
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            ops.push(Op::Eq);
            x -= 1;
            y -= 1;
        }
        if d > 0 {
            ops.push(if x == prev_x { Op::Ins } else { Op::Del });
            x = prev_x;
            y = prev_y;
        }
    }
    ops.reverse();
    Some(ops)
}

/// The edit script: the common start and end, Myers in between (or all of it replaced).
fn edits(a: &[&[u8]], b: &[&[u8]]) -> Vec<Op> {
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let mid = myers(am, bm).unwrap_or_else(|| {
        let mut v = vec![Op::Del; am.len()];
        v.extend(std::iter::repeat_n(Op::Ins, bm.len()));
        v
    });
    let mut ops = vec![Op::Eq; pre];
    ops.extend(mid);
    ops.extend(std::iter::repeat_n(Op::Eq, suf));
    ops
}

fn push_line(out: &mut Vec<u8>, sign: u8, line: &[u8]) {
    out.push(sign);
    out.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        out.extend_from_slice(b"\n\\ No newline at end of file\n");
    }
}

fn range(start: usize, len: usize) -> String {
    // An empty range names the line before it.
    let s = if len == 0 { start } else { start + 1 };
    if len == 1 {
        format!("{s}")
    } else {
        format!("{s},{len}")
    }
}

/// The hunks turning `a` into `b`.
fn hunks(a: &[u8], b: &[u8]) -> Vec<u8> {
    let (la, lb) = (lines(a), lines(b));
    let ops = edits(&la, &lb);
    // Positions (in a and b) before each op.
    let mut pos = Vec::with_capacity(ops.len() + 1);
    let (mut i, mut j) = (0usize, 0usize);
    for op in &ops {
        pos.push((i, j));
        match op {
            Op::Eq => {
                i += 1;
                j += 1;
            }
            Op::Del => i += 1,
            Op::Ins => j += 1,
        }
    }
    pos.push((i, j));
    let mut out = Vec::new();
    let mut at = 0;
    while at < ops.len() {
        let Some(first) = ops[at..].iter().position(|o| *o != Op::Eq).map(|x| x + at) else {
            break;
        };
        // Extend the hunk while the next change is within two contexts.
        let start = first.saturating_sub(CONTEXT);
        let mut end = first;
        loop {
            while end < ops.len() && ops[end] != Op::Eq {
                end += 1;
            }
            let next = ops[end..]
                .iter()
                .position(|o| *o != Op::Eq)
                .map(|x| x + end);
            match next {
                Some(nx) if nx - end <= 2 * CONTEXT => end = nx,
                _ => break,
            }
        }
        let stop = (end + CONTEXT).min(ops.len());
        let (a0, b0) = pos[start];
        let (a1, b1) = pos[stop];
        out.extend_from_slice(
            format!("@@ -{} +{} @@\n", range(a0, a1 - a0), range(b0, b1 - b0)).as_bytes(),
        );
        for k in start..stop {
            let (x, y) = pos[k];
            match ops[k] {
                Op::Eq => push_line(&mut out, b' ', la[x]),
                Op::Del => push_line(&mut out, b'-', la[x]),
                Op::Ins => push_line(&mut out, b'+', lb[y]),
            }
        }
        at = stop;
    }
    out
}

fn is_binary(b: &[u8]) -> bool {
    b[..b.len().min(8000)].contains(&0)
}

/// One side of a file diff: its path, git mode and contents (`None`: absent).
struct Side<'a> {
    path: &'a [u8],
    mode: &'static str,
    body: Option<Vec<u8>>,
    /// Too large to show as text.
    large: bool,
}

/// Writes the diff of one file (old and new sides) in git's format.
fn file_diff(
    out: &mut dyn Write,
    old: &Side,
    new: &Side,
    stats: &mut DiffOutput,
) -> io::Result<()> {
    let path = if new.body.is_some() {
        new.path
    } else {
        old.path
    };
    let (a, b) = (quote("a/", old.path), quote("b/", path));
    let mut h = format!("diff --git {a} {b}\n");
    match (&old.body, &new.body) {
        (None, Some(_)) => h.push_str(&format!("new file mode {}\n", new.mode)),
        (Some(_), None) => h.push_str(&format!("deleted file mode {}\n", old.mode)),
        _ if old.mode != new.mode => {
            h.push_str(&format!("old mode {}\nnew mode {}\n", old.mode, new.mode))
        }
        _ => {}
    }
    let empty = Vec::new();
    let (ob, nb) = (
        old.body.as_ref().unwrap_or(&empty),
        new.body.as_ref().unwrap_or(&empty),
    );
    stats.files += 1;
    if old.large || new.large || is_binary(ob) || is_binary(nb) {
        stats.binary += 1;
        let an = if old.body.is_some() {
            a
        } else {
            "/dev/null".into()
        };
        let bn = if new.body.is_some() {
            b
        } else {
            "/dev/null".into()
        };
        h.push_str(&format!("Binary files {an} and {bn} differ\n"));
        return out.write_all(h.as_bytes());
    }
    if ob != nb {
        let an = if old.body.is_some() {
            a
        } else {
            "/dev/null".into()
        };
        let bn = if new.body.is_some() {
            b
        } else {
            "/dev/null".into()
        };
        h.push_str(&format!("--- {an}\n+++ {bn}\n"));
        out.write_all(h.as_bytes())?;
        return out.write_all(&hunks(ob, nb));
    }
    out.write_all(h.as_bytes())
}

/// The project's files under `comps` (a directory the change removes), for their deletions.
fn project_files(
    root: &Dir,
    comps: &[Vec<u8>],
    out: &mut Vec<(Vec<u8>, EntryKind, u32)>,
    limit: usize,
) -> io::Result<()> {
    let mut d = root.reopen()?;
    for c in comps {
        d = d.open_dir(c)?;
    }
    let base = comps.join(&b'/');
    walk_files(&d, &base, out, limit, 0)
}

fn walk_files(
    d: &Dir,
    rel: &[u8],
    out: &mut Vec<(Vec<u8>, EntryKind, u32)>,
    limit: usize,
    depth: usize,
) -> io::Result<()> {
    let mut names = d.names(limit)?;
    names.sort();
    for n in names {
        if out.len() >= limit || depth > 256 {
            return Err(io::Error::other("too many files to show"));
        }
        let mut p = rel.to_vec();
        p.push(b'/');
        p.extend_from_slice(&n);
        let Some(st) = d.stat(&n)? else { continue };
        match st.kind {
            Kind::Dir => walk_files(&d.open_dir(&n)?, &p, out, limit, depth + 1)?,
            Kind::File => out.push((p, EntryKind::File, st.mode)),
            Kind::Symlink => out.push((p, EntryKind::Symlink, st.mode)),
            _ => {}
        }
    }
    Ok(())
}

/// Reads the project's entry at `comps`: a file's bytes (at most [`MAX_TEXT`]: `(None, true)`
/// past it) or a link's target.
fn project_body(root: &Dir, comps: &[Vec<u8>]) -> io::Result<(Option<Vec<u8>>, bool)> {
    let (name, parents) = comps
        .split_last()
        .ok_or_else(|| io::Error::other("no path"))?;
    let mut d = root.reopen()?;
    for c in parents {
        d = d.open_dir(c)?;
    }
    let Some(st) = d.stat(name)? else {
        return Ok((None, false));
    };
    match st.kind {
        Kind::Symlink => Ok((Some(d.readlink(name, MAX_PATH)?), false)),
        Kind::File if st.size > MAX_TEXT => Ok((None, true)),
        Kind::File => {
            let mut b = Vec::new();
            d.open_file(name)?.take(MAX_TEXT + 1).read_to_end(&mut b)?;
            Ok((Some(b), false))
        }
        _ => Ok((None, false)),
    }
}

impl ChangeSet {
    /// Writes the change set (or the entries at or under `paths`) to `out` as a unified diff in
    /// git's format.
    pub fn diff(
        &self,
        paths: &[String],
        out: &mut dyn Write,
    ) -> Result<DiffOutput, WorkspaceError> {
        let project = self.project_dir();
        let root = Dir::open_path(&project).map_err(|e| WorkspaceError::BaseMoved {
            dir: project.clone(),
            why: e.to_string(),
        })?;
        let data = self.data()?;
        let mut stats = DiffOutput::default();
        let wanted = |p: &str| paths.is_empty() || paths.iter().any(|x| is_under(p, x));
        let renamed_to: HashMap<&str, &str> = self
            .meta
            .renames
            .iter()
            .filter(|r| wanted(&r.from) && wanted(&r.to))
            .map(|r| (r.to.as_str(), r.from.as_str()))
            .collect();
        let renamed_from: std::collections::HashSet<&str> = renamed_to.values().copied().collect();
        let io = |e: io::Error| self.damaged(format!("writing the diff: {e}"));
        for e in self.entries()? {
            let e = e?;
            if !wanted(&e.path) {
                continue;
            }
            let comps = path_components(&e.path).expect("checked when read");
            let path = decode_path(&e.path).expect("checked when read");
            if let Some(c) = &e.conflict {
                stats.warnings.push(format!(
                    "{}: {c}",
                    palisade_policy::untrusted::escape(&path, 200)
                ));
            }
            if let Some(r) = &e.refused {
                stats.warnings.push(format!(
                    "{}: refused, not in the diff: {r}",
                    palisade_policy::untrusted::escape(&path, 200)
                ));
                continue;
            }
            if renamed_from.contains(e.path.as_str()) {
                continue;
            }
            if let Some(from) = renamed_to.get(e.path.as_str()) {
                let fp = decode_path(from).unwrap_or_default();
                let mut h = format!("diff --git {} {}\n", quote("a/", &fp), quote("b/", &path));
                let old_mode = self.rename_base_mode(from)?;
                let new_mode = git_mode(e.kind, e.mode.unwrap_or(0o644));
                if old_mode != new_mode {
                    h.push_str(&format!("old mode {old_mode}\nnew mode {new_mode}\n"));
                }
                h.push_str(&format!(
                    "similarity index 100%\nrename from {}\nrename to {}\n",
                    quote("", &fp),
                    quote("", &path)
                ));
                out.write_all(h.as_bytes()).map_err(io)?;
                stats.files += 1;
                continue;
            }
            // What the project had there: a removed directory's files each go.
            let base_dir = e.base.is_some_and(|b| b.kind == EntryKind::Dir)
                && matches!(e.change, Change::Deleted | Change::Replaced);
            if base_dir {
                let mut files = Vec::new();
                match project_files(&root, &comps, &mut files, 100_000) {
                    Ok(()) => {
                        for (p, kind, mode) in files {
                            let pc: Vec<Vec<u8>> =
                                p.split(|&c| c == b'/').map(<[u8]>::to_vec).collect();
                            let (body, large) = project_body(&root, &pc)
                                .map_err(|x| self.damaged(x.to_string()))?;
                            let old = Side {
                                path: &p,
                                mode: git_mode(kind, mode),
                                body,
                                large,
                            };
                            let new = Side {
                                path: &p,
                                mode: "100644",
                                body: None,
                                large: false,
                            };
                            file_diff(out, &old, &new, &mut stats).map_err(io)?;
                        }
                    }
                    Err(x) => stats.warnings.push(format!(
                        "{}: the files it removes are not shown: {x}",
                        palisade_policy::untrusted::escape(&path, 200)
                    )),
                }
            }
            let old_side = |b: &BaseState| -> Result<Side<'_>, WorkspaceError> {
                let (body, large) =
                    project_body(&root, &comps).map_err(|x| self.damaged(x.to_string()))?;
                Ok(Side {
                    path: &path,
                    mode: git_mode(b.kind, b.mode),
                    body,
                    large,
                })
            };
            let new_body = match e.kind {
                EntryKind::File if e.change != Change::Mode => {
                    if e.size > MAX_TEXT {
                        (None, true)
                    } else {
                        (self.contents(&data, &e, MAX_TEXT)?, false)
                    }
                }
                EntryKind::Symlink => (e.target.as_deref().and_then(decode_path), false),
                _ => (None, false),
            };
            match (e.kind, e.change.clone()) {
                (EntryKind::Dir, Change::Replaced) => {
                    // A directory where a file or link was: that one goes first.
                    if let Some(b) = e.base.filter(|b| b.kind != EntryKind::Dir) {
                        let old = old_side(&b)?;
                        let gone = Side {
                            path: &path,
                            mode: old.mode,
                            body: None,
                            large: false,
                        };
                        file_diff(out, &old, &gone, &mut stats).map_err(io)?;
                    }
                }
                (EntryKind::Dir, _) => {}
                (EntryKind::None, Change::Deleted) => {
                    if let Some(b) = e.base.filter(|b| b.kind != EntryKind::Dir) {
                        let old = old_side(&b)?;
                        let new = Side {
                            path: &path,
                            mode: old.mode,
                            body: None,
                            large: false,
                        };
                        file_diff(out, &old, &new, &mut stats).map_err(io)?;
                    }
                }
                (EntryKind::File, Change::Mode) => {
                    let b = e.base.unwrap_or(BaseState {
                        kind: EntryKind::File,
                        mode: 0o644,
                        size: 0,
                        dev: 0,
                        ino: 0,
                        mtime_ns: 0,
                        ctime_ns: 0,
                    });
                    let (om, nm) = (
                        git_mode(b.kind, b.mode),
                        git_mode(e.kind, e.mode.unwrap_or(0o644)),
                    );
                    if om != nm {
                        let h = format!(
                            "diff --git {} {}\nold mode {om}\nnew mode {nm}\n",
                            quote("a/", &path),
                            quote("b/", &path)
                        );
                        out.write_all(h.as_bytes()).map_err(io)?;
                        stats.files += 1;
                    } else {
                        stats.warnings.push(format!(
                            "{}: mode {:o} to {:o}, which a git diff cannot show",
                            palisade_policy::untrusted::escape(&path, 200),
                            b.mode,
                            e.mode.unwrap_or(0)
                        ));
                    }
                }
                (EntryKind::File | EntryKind::Symlink, change) => {
                    let new = Side {
                        path: &path,
                        mode: git_mode(e.kind, e.mode.unwrap_or(0o644)),
                        body: new_body.0.or_else(|| (!new_body.1).then(Vec::new)),
                        large: new_body.1,
                    };
                    let kind_changed = e.base.is_some_and(|b| b.kind != e.kind);
                    match (change, e.base) {
                        (Change::Modified, Some(b)) if !kind_changed => {
                            let old = old_side(&b)?;
                            file_diff(out, &old, &new, &mut stats).map_err(io)?;
                        }
                        (_, Some(b)) if b.kind != EntryKind::Dir => {
                            // Another kind of file: git shows the old one deleted, the new added.
                            let old = old_side(&b)?;
                            let gone = Side {
                                path: &path,
                                mode: old.mode,
                                body: None,
                                large: false,
                            };
                            file_diff(out, &old, &gone, &mut stats).map_err(io)?;
                            let none = Side {
                                path: &path,
                                mode: new.mode,
                                body: None,
                                large: false,
                            };
                            file_diff(out, &none, &new, &mut stats).map_err(io)?;
                        }
                        _ => {
                            let none = Side {
                                path: &path,
                                mode: new.mode,
                                body: None,
                                large: false,
                            };
                            file_diff(out, &none, &new, &mut stats).map_err(io)?;
                        }
                    }
                }
                _ => stats.warnings.push(format!(
                    "{}: a {:?} is not shown in a diff",
                    palisade_policy::untrusted::escape(&path, 200),
                    e.kind
                )),
            }
        }
        Ok(stats)
    }

    /// The git mode of a renamed file's old path, from its deletion entry.
    fn rename_base_mode(&self, from: &str) -> Result<&'static str, WorkspaceError> {
        for e in self.entries()? {
            let e = e?;
            if e.path == from {
                if let Some(b) = e.base {
                    return Ok(git_mode(b.kind, b.mode));
                }
            }
        }
        Ok("100644")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hunks_have_context_and_mark_missing_newlines() {
        let a = b"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
        let b = b"1\n2\n3\n4\nfive\n6\n7\n8\n9\n10";
        let h = String::from_utf8(hunks(a, b)).unwrap();
        assert_eq!(
            h,
            "@@ -2,9 +2,9 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n 9\n-10\n+10\n\\ No newline at end of file\n"
        );
        assert_eq!(
            String::from_utf8(hunks(b"", b"x\n")).unwrap(),
            "@@ -0,0 +1 @@\n+x\n"
        );
        assert_eq!(
            String::from_utf8(hunks(b"x\n", b"")).unwrap(),
            "@@ -1 +0,0 @@\n-x\n"
        );
    }

    #[test]
    fn myers_finds_a_shortest_script() {
        let a: Vec<&[u8]> = vec![b"a", b"b", b"c", b"a", b"b", b"b", b"a"];
        let b: Vec<&[u8]> = vec![b"c", b"b", b"a", b"b", b"a", b"c"];
        let ops = myers(&a, &b).unwrap();
        let edits = ops.iter().filter(|o| **o != Op::Eq).count();
        assert_eq!(edits, 5);
        // Replaying the script gives b.
        let (mut i, mut j, mut got) = (0, 0, Vec::new());
        for o in ops {
            match o {
                Op::Eq => {
                    got.push(a[i]);
                    i += 1;
                    j += 1;
                }
                Op::Del => i += 1,
                Op::Ins => {
                    got.push(b[j]);
                    j += 1;
                }
            }
        }
        assert_eq!(got, b);
    }

    #[test]
    fn paths_are_quoted_as_git_quotes_them() {
        assert_eq!(quote("a/", b"src/x.rs"), "a/src/x.rs");
        assert_eq!(quote("b/", b"caf\xc3\xa9"), "\"b/caf\\303\\251\"");
        assert_eq!(quote("a/", b"t\"ab\tx"), "\"a/t\\\"ab\\tx\"");
        assert_eq!(quote("a/", b"esc\x1b[2J"), "\"a/esc\\033[2J\"");
    }
}
