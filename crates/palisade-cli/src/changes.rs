//! `palisade changes`, `diff`, `apply`, `discard`: thin over `palisade::workspace`
//! (docs/workspace.md). Everything a change set holds came from sandboxed code: its paths, link
//! targets and reasons are printed escaped; a diff's lines are written as they are only when
//! stdout is not a terminal (for `git apply`), escaped otherwise.

use anyhow::Context;
use palisade::policy::untrusted::Untrusted;
use palisade::workspace::{decode_path, encode_path, ApplyOptions, Change, Store, WorkspaceError};
use std::io::{IsTerminal, Write};

/// Exit status when an apply was refused as a whole (held entries, conflicts): nothing changed.
const EXIT_HELD: i32 = 1;

#[derive(clap::Args, Debug)]
pub struct ChangesArgs {
    /// The change set's id (from the run's summary or report).
    #[arg(required_unless_present = "list")]
    id: Option<String>,
    /// List the change sets kept, oldest first, with their age and size.
    #[arg(long, conflicts_with = "id")]
    list: bool,
    /// Print JSON: the change set's record and every entry (or the list).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The change set's id.
    id: String,
    /// Show only these paths (relative to the project) and what is under them.
    #[arg(value_name = "PATH")]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// The change set's id.
    id: String,
    /// Apply only these paths and what is under them. Naming a protected or risky path (or one
    /// inside it) is what allows it.
    #[arg(value_name = "PATH")]
    paths: Vec<String>,
    /// Leave these paths (and what is under them) out (repeatable).
    #[arg(long, value_name = "PATH")]
    exclude: Vec<String>,
    /// Overwrite files that changed in the project since the run began.
    #[arg(long)]
    force: bool,
    /// Apply files that host tools run or load later without asking (rc files, hooks,
    /// environments, package-manager and editor settings) without naming each.
    #[arg(long = "include-risky")]
    include_risky: bool,
}

#[derive(clap::Args, Debug)]
pub struct DiscardArgs {
    /// The change set's id.
    id: String,
}

/// The store: `PALISADE_CHANGES_DIR`, else the default place.
pub fn store() -> anyhow::Result<Store> {
    if let Some(d) = std::env::var_os("PALISADE_CHANGES_DIR").filter(|d| !d.is_empty()) {
        let d = std::path::PathBuf::from(d);
        anyhow::ensure!(
            d.is_absolute(),
            "PALISADE_CHANGES_DIR `{}`: give an absolute path",
            d.display()
        );
        return Ok(Store::new(d));
    }
    Store::default_dir().map(Store::new).context(
        "no HOME to keep change sets under: set PALISADE_CHANGES_DIR to an absolute directory",
    )
}

/// The process's exit status for a subcommand's result, its error printed.
pub fn exit(r: anyhow::Result<i32>) -> i32 {
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("palisade: error: {e:#}");
            if e.downcast_ref::<WorkspaceError>()
                .is_some_and(|w| matches!(w, WorkspaceError::Held { .. }))
            {
                EXIT_HELD
            } else {
                palisade::EXIT_SANDBOX_ERROR
            }
        }
    }
}

/// A path as the user typed it, in the change set's form: relative, no `./`, no trailing `/`.
fn arg_path(p: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let t = p.trim_start_matches("./").trim_end_matches('/');
    encode_path(std::ffi::OsStr::new(t).as_bytes())
}

/// A change set's path for people: decoded, then escaped.
fn shown(p: &str) -> String {
    Untrusted::new(&decode_path(p).unwrap_or_else(|| p.as_bytes().to_vec())).to_string()
}

fn size(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn age(created: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let s = now.saturating_sub(created);
    match s {
        s if s >= 86400 => format!("{}d", s / 86400),
        s if s >= 3600 => format!("{}h", s / 3600),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

pub fn changes(a: ChangesArgs) -> anyhow::Result<i32> {
    let store = store()?;
    if a.list {
        let list = store.list()?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(0);
        }
        if list.is_empty() {
            println!("no change sets in {}", store.path().display());
        }
        for l in &list {
            println!(
                "{}  {:>4} old  {:>9}  {:>5} change(s)  run {}{}  {}",
                l.id,
                age(l.created),
                size(l.bytes),
                l.summary.entries,
                Untrusted::new(&l.run.status),
                match &l.applied {
                    Some(x) => format!(", applied {} ago", age(x.at)),
                    None => String::new(),
                },
                shown(&l.dir)
            );
        }
        return Ok(0);
    }
    let id = a.id.expect("clap requires it");
    let cs = store.get(&id)?;
    let m = cs.meta();
    let mut out = std::io::stdout().lock();
    if a.json {
        write!(
            out,
            "{{\"change_set\":{},\"entries\":[",
            serde_json::to_string(m)?
        )?;
        for (i, e) in cs.entries()?.enumerate() {
            let e = e?;
            write!(
                out,
                "{}{}",
                if i > 0 { "," } else { "" },
                serde_json::to_string(&e)?
            )?;
        }
        writeln!(out, "]}}")?;
        return Ok(0);
    }
    let s = &m.summary;
    writeln!(
        out,
        "change set {} · {} · run {}{} · {} change(s), {} of new contents{}",
        m.id,
        shown(&m.dir),
        Untrusted::new(&m.run.status),
        m.run
            .exit_code
            .map_or(String::new(), |c| format!(" (exit {c})")),
        s.entries,
        size(s.bytes),
        match &m.applied {
            Some(x) => format!(" · APPLIED {} ago ({} entries)", age(x.at), x.entries),
            None => String::new(),
        }
    )?;
    if let Some(why) = &m.incomplete {
        writeln!(out, "INCOMPLETE: {why}; it cannot be applied")?;
    }
    for e in cs.entries()? {
        let e = e?;
        let code = match e.change {
            Change::Added => "A",
            Change::Modified => "M",
            Change::Deleted => "D",
            Change::Mode => "m",
            Change::Replaced => "R",
        };
        let mut what = match (e.kind, &e.change) {
            (palisade::workspace::EntryKind::Symlink, _) => format!(
                "-> {}",
                Untrusted::new(
                    &e.target
                        .as_deref()
                        .and_then(decode_path)
                        .unwrap_or_default()
                )
            ),
            (palisade::workspace::EntryKind::Dir, Change::Mode) => {
                format!(
                    "dir, mode {:o} -> {:o}",
                    e.base.map_or(0, |b| b.mode),
                    e.mode.unwrap_or(0)
                )
            }
            (palisade::workspace::EntryKind::Dir, _) => "dir".to_owned(),
            (_, Change::Mode) => {
                format!(
                    "mode {:o} -> {:o}",
                    e.base.map_or(0, |b| b.mode),
                    e.mode.unwrap_or(0)
                )
            }
            (_, Change::Deleted) => String::new(),
            (k, _) => {
                let mut w = size(e.size);
                if let (Some(b), Some(mo)) = (e.base, e.mode) {
                    if b.mode != mo {
                        w.push_str(&format!(", mode {:o} -> {mo:o}", b.mode));
                    }
                }
                if k != palisade::workspace::EntryKind::File {
                    w = format!("{k:?}").to_lowercase();
                }
                w
            }
        };
        for (tag, v) in [
            ("REFUSED", &e.refused),
            ("CONFLICT", &e.conflict),
            ("protected", &e.protected),
            ("risky", &e.risky),
        ] {
            if let Some(v) = v {
                what.push_str(&format!("  [{tag}: {}]", Untrusted::new(v)));
            }
        }
        writeln!(out, "  {code} {}  {what}", shown(&e.path))?;
    }
    for r in &m.renames {
        writeln!(out, "  renamed {} -> {}", shown(&r.from), shown(&r.to))?;
    }
    let held = s.refused + s.conflicts + s.protected + s.risky;
    if held > 0 {
        writeln!(
            out,
            "{held} entr(y/ies) held back from a plain `palisade apply {}`: refused ones never apply; name protected and risky paths (or --include-risky); --force for conflicts",
            m.id
        )?;
    }
    Ok(0)
}

/// Writes a diff's bytes to a terminal with every control character but tab and newline
/// escaped, so that the code's bytes cannot drive the terminal.
struct Escaping<W: Write>(W);

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for line in buf.split_inclusive(|&b| b == b'\n') {
            let (body, nl) = match line.split_last() {
                Some((b'\n', rest)) => (rest, true),
                _ => (line, false),
            };
            for chunk in body.split(|&b| b == b'\t').enumerate() {
                if chunk.0 > 0 {
                    self.0.write_all(b"\t")?;
                }
                let s = palisade::policy::untrusted::escape(chunk.1, usize::MAX);
                self.0.write_all(s.as_bytes())?;
            }
            if nl {
                self.0.write_all(b"\n")?;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

pub fn diff(a: DiffArgs) -> anyhow::Result<i32> {
    let cs = store()?.get(&a.id)?;
    let paths: Vec<String> = a.paths.iter().map(|p| arg_path(p)).collect();
    let stdout = std::io::stdout();
    let tty = stdout.is_terminal();
    let mut raw = std::io::BufWriter::new(stdout.lock());
    let stats = if tty {
        let mut w = Escaping(&mut raw);
        cs.diff(&paths, &mut w)?
    } else {
        cs.diff(&paths, &mut raw)?
    };
    raw.flush()?;
    for w in &stats.warnings {
        eprintln!("palisade: diff: {w}");
    }
    if stats.binary > 0 {
        eprintln!(
            "palisade: diff: {} binary or large file(s) summarized, not shown (git apply does not take those)",
            stats.binary
        );
    }
    Ok(0)
}

pub fn apply(a: ApplyArgs) -> anyhow::Result<i32> {
    let cs = store()?.get(&a.id)?;
    let o = ApplyOptions {
        paths: a.paths.iter().map(|p| arg_path(p)).collect(),
        exclude: a.exclude.iter().map(|p| arg_path(p)).collect(),
        force: a.force,
        include_risky: a.include_risky,
    };
    let done = cs.apply(&o)?;
    println!(
        "applied {} entr(y/ies), {} written, to {}",
        done.entries,
        size(done.bytes),
        Untrusted::new(cs.project_dir().as_os_str().as_encoded_bytes())
    );
    Ok(0)
}

pub fn discard(a: DiscardArgs) -> anyhow::Result<i32> {
    store()?.discard(&a.id)?;
    println!("discarded {}", a.id);
    Ok(0)
}
