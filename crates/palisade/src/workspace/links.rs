//! Where a symbolic link leads: the rule every link palisade writes into a project obeys
//! (docs/workspace.md, "Links").
//!
//! Apply never follows a link, but host tools will, and the kernel resolves a target one
//! component at a time: a `..` climbs from the directory reached so far, which after a name that
//! is itself a link is wherever that link led, not what the words say (`web/shared-link/..` is
//! the parent of `shared`; `b/..` with `b -> ..` is the parent of the project). Words cannot
//! say where such a `..` lands, so a link palisade writes has every `..` first, no more of them
//! than the directories above it, then names only ([`words`]). Its leading `..` climb real
//! directories (the directories of an entry's path are opened without following links, so a
//! link's path is its physical place), and names only go down: into a directory of the project,
//! or into another link. If every link on the way obeys the same rule, the resolution never
//! leaves the project, by induction over the links followed.
//!
//! Links palisade writes obey it by their words, whatever is applied before or after them. The
//! project's own links need not; [`Judge`] follows a target over the project as it will be after
//! the apply (the host's tree with the change set's entries in place), through every link on the
//! way, the project's and the change set's (at most 40, as the kernel), and refuses it if any of
//! them breaks the rule at its own place. A name that is not there, or not a directory, ends the
//! walk: what follows it are names, which can only go down.

use super::*;
use std::collections::HashMap;

/// Most links followed from one target (the kernel's own bound, `MAXSYMLINKS`).
pub(super) const MAX_HOPS: usize = 40;
/// Components looked up over all the links judged in one capture or apply: each is at most an
/// `openat` and an `fstatat` in the project.
const MAX_STEPS: u64 = 1 << 22;
/// Bytes of paths and targets kept of a change set's links and directories to follow them.
const MAX_TREE_BYTES: usize = 64 << 20;

/// What is wrong with a target's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    Empty,
    Absolute,
    AboveRoot,
    UpAfterName,
}

impl Fault {
    fn text(self) -> &'static str {
        match self {
            Fault::Empty => "an empty target",
            Fault::Absolute => "an absolute path",
            Fault::AboveRoot => "above its root",
            Fault::UpAfterName => {
                "a `..` after a name, which climbs from wherever that name leads (a link there can \
                 lead anywhere): write the target with every `..` first"
            }
        }
    }

    /// Why a link to `t` is refused, for its own words.
    pub(super) fn own(self, t: &[u8]) -> String {
        let shown = palisade_policy::untrusted::escape(t, 120);
        match self {
            Fault::Empty => "a symbolic link with an empty target".into(),
            Fault::UpAfterName => format!("a symbolic link to `{shown}`: {}", self.text()),
            _ => format!(
                "a symbolic link out of the project (to `{shown}`, {})",
                self.text()
            ),
        }
    }
}

/// A link target's words under the rule, for a link with `depth` directories above it: how many
/// `..` it starts with and the names after them (`.` and empty components are no-ops).
pub(super) fn words(depth: usize, t: &[u8]) -> Result<(usize, Vec<&[u8]>), Fault> {
    if t.is_empty() {
        return Err(Fault::Empty);
    }
    if t[0] == b'/' {
        return Err(Fault::Absolute);
    }
    let mut ups = 0;
    let mut names = Vec::new();
    for c in t.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." if !names.is_empty() => return Err(Fault::UpAfterName),
            b".." => {
                ups += 1;
                if ups > depth {
                    return Err(Fault::AboveRoot);
                }
            }
            _ => names.push(c),
        }
    }
    Ok((ups, names))
}

/// What a path of the change set will be once applied, where that may differ from the
/// project's entry there.
enum Node {
    /// A directory; `fresh` when what the project has under it goes (a replaced directory).
    Dir {
        fresh: bool,
    },
    Link(Vec<u8>),
    /// Gone, or not a directory or a link.
    Other,
}

/// The change set's entries that decide where a link leads (links, new and replaced
/// directories, what is deleted or changes kind), by path; other paths are the project's.
#[derive(Default)]
pub(super) struct Tree {
    nodes: HashMap<Vec<u8>, Node>,
    bytes: usize,
    links: usize,
    full: bool,
}

impl Tree {
    /// Adds an entry that will be applied.
    pub(super) fn add(&mut self, e: &Entry) {
        let node = match (e.kind, &e.change) {
            (EntryKind::Symlink, _) => Node::Link(
                e.target
                    .as_deref()
                    .and_then(decode_path)
                    .unwrap_or_default(),
            ),
            (EntryKind::Dir, Change::Added) => Node::Dir { fresh: false },
            (EntryKind::Dir, Change::Replaced) => Node::Dir { fresh: true },
            (_, Change::Deleted | Change::Replaced) => Node::Other,
            (k, Change::Modified) if e.base.is_some_and(|b| b.kind != k) => Node::Other,
            _ => return,
        };
        let Some(path) = decode_path(&e.path) else {
            return;
        };
        self.bytes += path.len()
            + 64
            + if let Node::Link(t) = &node {
                t.len()
            } else {
                0
            };
        if self.bytes > MAX_TREE_BYTES {
            self.full = true;
            self.nodes.clear();
            return;
        }
        if self.full {
            return;
        }
        self.links += usize::from(matches!(node, Node::Link(_)));
        self.nodes.insert(path, node);
    }

    /// Whether any entry is a link.
    pub(super) fn has_links(&self) -> bool {
        self.links > 0 || self.full
    }
}

/// What [`Judge::judge`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every link on the way obeys the rule.
    Inside,
    /// Why not.
    Out(String),
    /// Why it could not be followed (a bound, a directory of the project that cannot be read).
    Unchecked(String),
}

/// The lookup of one name.
enum Found {
    /// A directory, with the project's own where it has one (and it counts).
    Dir(Option<Dir>),
    Link(Vec<u8>),
    /// Nothing there, or not a directory: the walk ends.
    End,
}

/// Follows link targets over the project (`root`) with `tree` applied, never following a link
/// in the project itself: each directory is opened with `O_NOFOLLOW`, each link read with
/// `readlinkat`.
pub(super) struct Judge<'a> {
    root: &'a Dir,
    tree: &'a Tree,
    steps: u64,
}

/// The directories walked down so far: names from the root and the project's directory there,
/// if it has one that counts.
type Pos = Vec<(Vec<u8>, Option<Dir>)>;

impl<'a> Judge<'a> {
    pub(super) fn new(root: &'a Dir, tree: &'a Tree) -> Judge<'a> {
        Judge {
            root,
            tree,
            steps: 0,
        }
    }

    /// Where the link at `path` (bytes, relative to the project) with target `target` leads.
    pub(super) fn judge(&mut self, path: &[u8], target: &[u8]) -> Verdict {
        if self.tree.full {
            return Verdict::Unchecked(format!(
                "the change set has more than {} MiB of links and directories to follow: apply it in parts",
                MAX_TREE_BYTES >> 20
            ));
        }
        match self.walk(path, target) {
            Ok(v) => v,
            Err(e) => Verdict::Unchecked(format!(
                "`{}` in the project could not be read: {e}",
                palisade_policy::untrusted::escape(path, 200)
            )),
        }
    }

    fn walk(&mut self, path: &[u8], target: &[u8]) -> io::Result<Verdict> {
        let comps: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        let mut pos: Pos = Vec::new();
        for c in &comps[..comps.len() - 1] {
            match self.lookup(&pos, c)? {
                Found::Dir(h) => pos.push((c.to_vec(), h)),
                // Not a directory once applied: the link is not made (apply holds it for that).
                _ => return Ok(Verdict::Inside),
            }
        }
        let mut todo: Vec<Vec<u8>> = Vec::new();
        let mut via: Option<(Vec<u8>, Vec<u8>)> = None;
        let mut t = target.to_vec();
        let mut hops = 0;
        loop {
            // `t` is the target of a link in the directory `pos`.
            let (ups, names) = match words(pos.len(), &t) {
                Ok(w) => w,
                Err(f) => {
                    return Ok(Verdict::Out(match &via {
                        None => f.own(&t),
                        Some((at, _)) => format!(
                            "a symbolic link out of the project (to `{}`): it leads through `{}`, a link to `{}`, {}",
                            palisade_policy::untrusted::escape(target, 120),
                            palisade_policy::untrusted::escape(at, 200),
                            palisade_policy::untrusted::escape(&t, 120),
                            f.text()
                        ),
                    }))
                }
            };
            pos.truncate(pos.len() - ups);
            todo.extend(names.iter().rev().map(|n| n.to_vec()));
            loop {
                let Some(name) = todo.pop() else {
                    return Ok(Verdict::Inside);
                };
                if self.steps >= MAX_STEPS {
                    return Ok(Verdict::Unchecked(format!(
                        "more than {MAX_STEPS} steps to follow the change set's links: apply it in parts"
                    )));
                }
                self.steps += 1;
                match self.lookup(&pos, &name)? {
                    Found::Dir(h) => pos.push((name, h)),
                    Found::Link(next) => {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Ok(Verdict::Out(format!(
                                "a symbolic link to `{}` that goes through more than {MAX_HOPS} links",
                                palisade_policy::untrusted::escape(target, 120)
                            )));
                        }
                        let mut at = join_pos(&pos);
                        if !at.is_empty() {
                            at.push(b'/');
                        }
                        at.extend_from_slice(&name);
                        via = Some((at, next.clone()));
                        t = next;
                        break;
                    }
                    Found::End => return Ok(Verdict::Inside),
                }
            }
        }
    }

    /// The entry `name` in the directory `pos`, as it will be after the apply.
    fn lookup(&self, pos: &Pos, name: &[u8]) -> io::Result<Found> {
        let host = match pos.last() {
            None => Some(self.root),
            Some((_, h)) => h.as_ref(),
        };
        let mut key = join_pos(pos);
        if !key.is_empty() {
            key.push(b'/');
        }
        key.extend_from_slice(name);
        match self.tree.nodes.get(&key) {
            Some(Node::Dir { fresh: true }) => return Ok(Found::Dir(None)),
            Some(Node::Dir { fresh: false }) => {
                let d = match host {
                    Some(h) if h.stat(name)?.is_some_and(|s| s.kind == Kind::Dir) => {
                        Some(h.open_dir(name)?)
                    }
                    _ => None,
                };
                return Ok(Found::Dir(d));
            }
            Some(Node::Link(t)) => return Ok(Found::Link(t.clone())),
            Some(Node::Other) => return Ok(Found::End),
            None => {}
        }
        let Some(h) = host else {
            return Ok(Found::End);
        };
        Ok(match h.stat(name)?.map(|s| s.kind) {
            Some(Kind::Dir) => Found::Dir(Some(h.open_dir(name)?)),
            Some(Kind::Symlink) => Found::Link(h.readlink(name, MAX_PATH)?),
            _ => Found::End,
        })
    }
}

fn join_pos(pos: &Pos) -> Vec<u8> {
    let mut p = Vec::new();
    for (i, (n, _)) in pos.iter().enumerate() {
        if i > 0 {
            p.push(b'/');
        }
        p.extend_from_slice(n);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scratch project directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir()
                .join(format!("palisade-links-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(p.join("proj")).unwrap();
            Scratch(p)
        }
        fn proj(&self) -> PathBuf {
            self.0.join("proj")
        }
        fn root(&self) -> Dir {
            Dir::open_path(&self.proj().canonicalize().unwrap()).unwrap()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn entry(path: &str, change: Change, kind: EntryKind, target: Option<&str>) -> Entry {
        Entry {
            path: path.into(),
            change,
            kind,
            mode: None,
            size: 0,
            offset: None,
            sha256: None,
            target: target.map(str::to_owned),
            base: None,
            refused: None,
            conflict: None,
            protected: None,
            risky: None,
        }
    }

    fn link(path: &str, target: &str) -> Entry {
        entry(path, Change::Added, EntryKind::Symlink, Some(target))
    }

    fn dir(path: &str) -> Entry {
        entry(path, Change::Added, EntryKind::Dir, None)
    }

    /// The verdict on each link of `entries`, in the project `s` with them applied.
    fn verdicts(s: &Scratch, entries: &[Entry]) -> Vec<(String, Verdict)> {
        let mut tree = Tree::default();
        for e in entries {
            tree.add(e);
        }
        let root = s.root();
        let mut j = Judge::new(&root, &tree);
        entries
            .iter()
            .filter(|e| e.kind == EntryKind::Symlink)
            .map(|e| {
                let t = decode_path(e.target.as_deref().unwrap()).unwrap();
                (e.path.clone(), j.judge(e.path.as_bytes(), &t))
            })
            .collect()
    }

    fn out(v: &Verdict, what: &str) -> bool {
        matches!(v, Verdict::Out(why) if why.contains(what))
    }

    #[test]
    fn words_allow_leading_dots_within_the_depth_then_names() {
        assert_eq!(words(0, b"a/b").unwrap(), (0, vec![&b"a"[..], b"b"]));
        assert_eq!(words(1, b"../lib").unwrap(), (1, vec![&b"lib"[..]]));
        assert_eq!(words(2, b"./.././/../x/").unwrap(), (2, vec![&b"x"[..]]));
        assert_eq!(words(1, b"..").unwrap(), (1, vec![]));
        assert_eq!(words(0, b"../x"), Err(Fault::AboveRoot));
        assert_eq!(words(3, b"/etc"), Err(Fault::Absolute));
        assert_eq!(words(3, b""), Err(Fault::Empty));
        assert_eq!(words(3, b"b/.."), Err(Fault::UpAfterName));
        assert_eq!(words(3, b"a/./../b"), Err(Fault::UpAfterName));
        assert_eq!(words(3, b"../a/../b"), Err(Fault::UpAfterName));
    }

    #[test]
    fn links_within_the_project_are_inside() {
        let s = Scratch::new("inside");
        let p = s.proj();
        std::fs::create_dir_all(p.join("lib")).unwrap();
        std::fs::create_dir_all(p.join("src")).unwrap();
        std::fs::create_dir_all(p.join("shared")).unwrap();
        std::fs::create_dir_all(p.join("web")).unwrap();
        symlink("../shared", p.join("web/shared-link")).unwrap();
        let v = verdicts(
            &s,
            &[
                link("src/lib", "../lib"),
                link("current", "v2"),
                dir("v2"),
                link("v2/x", "../src/lib/y"),
                link("cx", "current/x"),
                link("s", "web/shared-link/file"),
                link("dangling", "no/such/thing"),
                link("dot", "./src"),
            ],
        );
        for (p, v) in &v {
            assert_eq!(*v, Verdict::Inside, "{p}");
        }
    }

    #[test]
    fn a_dot_dot_after_a_link_is_refused_by_its_words() {
        let s = Scratch::new("updot");
        let p = s.proj();
        std::fs::create_dir_all(p.join("web")).unwrap();
        std::fs::create_dir_all(p.join("shared")).unwrap();
        symlink("../shared", p.join("web/shared-link")).unwrap();
        let v = verdicts(
            &s,
            &[
                dir("d1"),
                link("d1/a", "b/.."),
                link("d1/b", ".."),
                link("x", "web/shared-link/../../etc/passwd"),
            ],
        );
        assert!(out(&v[0].1, "a `..` after a name"), "{v:?}");
        assert_eq!(v[1].1, Verdict::Inside);
        assert!(out(&v[2].1, "a `..` after a name"), "{v:?}");
    }

    #[test]
    fn a_link_through_a_project_link_out_of_it_is_refused() {
        let s = Scratch::new("host");
        let p = s.proj();
        std::fs::create_dir_all(p.join(".venv/bin")).unwrap();
        symlink("/usr/bin/python3", p.join(".venv/bin/python")).unwrap();
        symlink(s.0.as_os_str(), p.join("ext")).unwrap();
        symlink("../../..", p.join(".venv/bin/up")).unwrap();
        let v = verdicts(
            &s,
            &[
                link("py", ".venv/bin/python"),
                link("x", "ext/outside.txt"),
                link("y", ".venv/bin/up/z"),
                // A new link chained through one of the change set's own, which leads out.
                link("l1", "ext"),
                link("l2", "l1/outside.txt"),
            ],
        );
        assert!(out(&v[0].1, "through `.venv/bin/python`"), "{v:?}");
        assert!(out(&v[0].1, "an absolute path"), "{v:?}");
        assert!(out(&v[1].1, "through `ext`"), "{v:?}");
        assert!(out(&v[2].1, "above its root"), "{v:?}");
        assert!(out(&v[3].1, "through `ext`"), "{v:?}");
        assert!(out(&v[4].1, "through `ext`"), "{v:?}");
    }

    #[test]
    fn the_change_set_decides_what_it_replaces() {
        let s = Scratch::new("replace");
        let p = s.proj();
        std::fs::create_dir_all(p.join("d")).unwrap();
        symlink("/etc", p.join("d/out")).unwrap();
        symlink("/etc", p.join("gone")).unwrap();
        // `d` replaced by a new directory: the project's `d/out` is not there after the apply.
        // `gone` deleted. `in` replaced (the project's link) by a link inside.
        symlink("/etc", p.join("in")).unwrap();
        let mut repl = entry("in", Change::Modified, EntryKind::Symlink, Some("d"));
        repl.base = Some(BaseState {
            kind: EntryKind::Symlink,
            mode: 0o777,
            size: 4,
            dev: 0,
            ino: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        });
        let v = verdicts(
            &s,
            &[
                entry("d", Change::Replaced, EntryKind::Dir, None),
                entry("gone", Change::Deleted, EntryKind::None, None),
                repl,
                link("a", "d/out/passwd"),
                link("b", "gone/passwd"),
                link("c", "in/out"),
            ],
        );
        for (p, v) in &v {
            assert_eq!(*v, Verdict::Inside, "{p}");
        }
        // Without the replacement, `d/out` is the project's link out.
        let v = verdicts(&s, &[link("a", "d/out/passwd")]);
        assert!(out(&v[0].1, "through `d/out`"), "{v:?}");
    }

    #[test]
    fn a_loop_is_refused_and_work_is_bounded() {
        let s = Scratch::new("loop");
        let v = verdicts(&s, &[link("a", "b"), link("b", "a")]);
        assert!(out(&v[0].1, "more than 40 links"), "{v:?}");
        let mut tree = Tree::default();
        tree.add(&link("a", "b"));
        let root = s.root();
        let mut j = Judge::new(&root, &tree);
        j.steps = MAX_STEPS;
        assert!(matches!(j.judge(b"a", b"b"), Verdict::Unchecked(_)));
    }
}
