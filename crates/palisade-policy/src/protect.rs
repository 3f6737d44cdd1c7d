//! Protected paths: places under a host scratch directory from which code could act after the
//! run — git's repository and hooks, a shell rc file, a virtual environment, an editor's or agent's
//! task and hook configuration — kept read-only inside even though the rest of the scratch
//! directory is writable (docs/policy.md, "Protected paths").
//!
//! The list is a second line, not a wall: a project holds more files that host tools load or run
//! later without asking than any list names. What it covers is one entry or more for each kind of
//! mechanism (git config, hooks and their indirections; shell start-up files; direnv; editor, IDE
//! and agent settings; Python and Node environments and settings; debugger start-up files; the
//! places a home directory starts programs from). [`git`] reads a repository's own files for the
//! places they point at (`gitdir:`, `commondir`, `core.hooksPath`, includes, scripts named in
//! commands), which the planner protects too.

use crate::PolicyError;
use serde::{Deserialize, Serialize};

/// Protected by default, relative to the scratch directory, with what each would run.
///
/// Not listed, on purpose: `Makefile`, `justfile`, `package.json` scripts, `build.rs`, tests and
/// the rest of the source (run when someone chooses to run them, and what a workload exists to
/// change); `.env` (data that many programs read; direnv loads it only when a protected `.envrc`
/// says so); `node_modules`, `target`, `__pycache__` and other build output (ordinary builds
/// write them); `.cargo` (cargo keeps its cache there, so a build would create it on every run,
/// and a project's cargo settings run no more than its `build.rs` already does).
pub const DEFAULT_PROTECTED: &[(&str, &str)] = &[
    // git: the repository as a whole, then its parts, which stay protected when `.git` is
    // unprotected so that code can commit.
    (
        ".git",
        "the repository: its config, hooks, commondir, worktree and submodule repositories; read-only as a whole (--unprotect .git to commit inside: the entries below stay protected)",
    ),
    (
        ".git/config",
        "core.fsmonitor, core.sshCommand, aliases with `!` and filters run commands",
    ),
    (
        ".git/config.worktree",
        "per-worktree config, read on top of .git/config",
    ),
    (
        ".git/hooks",
        "git runs hook scripts on commit, checkout, merge, push",
    ),
    (
        ".git/commondir",
        "moves the repository's config and hooks to another directory",
    ),
    (
        ".git/worktrees",
        "linked worktrees' commondir and config.worktree",
    ),
    (
        ".git/modules",
        "submodules' repositories, each with a config and hooks",
    ),
    (
        ".gitconfig",
        "git's user config when the scratch is a home directory: read in every repository",
    ),
    (
        ".config/git",
        "git's user config (XDG) when the scratch is a home directory",
    ),
    (".husky", "hook scripts husky has git run on commit"),
    (
        ".pre-commit-config.yaml",
        "commands the pre-commit hook runs on commit",
    ),
    ("lefthook.yml", "commands the lefthook hook runs on commit"),
    // Shells and what a login starts.
    (".envrc", "direnv runs it on entering the directory"),
    (
        ".direnv",
        "direnv's layouts: an environment whose bin/ it puts first on PATH",
    ),
    ("mise.toml", "mise runs its hooks and env scripts on entering"),
    (
        ".bashrc",
        "bash runs it (the scratch directory is $HOME inside; it may be a home on the host)",
    ),
    (".bash_profile", "bash login shells run it"),
    (".bash_login", "bash login shells run it"),
    (".bash_logout", "bash login shells run it on exit"),
    (".profile", "login shells run it"),
    (".zshrc", "zsh runs it"),
    (".zshenv", "zsh runs it for every shell"),
    (".zprofile", "zsh login shells run it"),
    (".zlogin", "zsh login shells run it"),
    (".config/fish", "fish runs its config.fish"),
    (
        ".ssh",
        "authorized_keys lets a key log in; config's ProxyCommand and LocalCommand run on ssh",
    ),
    (".config/systemd", "user units systemd starts at login"),
    (".config/autostart", "programs the desktop starts at login"),
    (
        ".local/bin",
        "first on PATH in many distributions' .profile: a program there shadows git, ls, …",
    ),
    // Editors, IDEs and agents.
    (
        ".vscode",
        "tasks.json and settings run commands in the editor",
    ),
    (".idea", "run configurations and startup tasks"),
    (
        ".devcontainer",
        "the container definition an editor builds and runs",
    ),
    (".zed", "Zed's tasks and language-server settings"),
    (".helix", "Helix's language-server commands"),
    (".exrc", "Vim and Neovim run it with 'exrc' set"),
    (".nvim.lua", "Neovim runs it with 'exrc' set"),
    (".claude", "Claude Code's settings and hooks run commands"),
    (".mcp.json", "MCP servers an agent starts"),
    (".cursor", "Cursor's rules and MCP servers"),
    (".codex", "Codex CLI's configuration"),
    (".gemini", "Gemini CLI's settings and MCP servers"),
    (".continue", "Continue's configuration and MCP servers"),
    (".aider.conf.yml", "aider runs its lint-cmd and test-cmd"),
    // Python.
    (
        ".venv",
        "a virtual environment: a .pth file in it runs at every start of its python, which editors start on their own",
    ),
    ("venv", "a virtual environment, as .venv"),
    (
        "sitecustomize.py",
        "imported at every Python start when the project is on sys.path",
    ),
    (
        "usercustomize.py",
        "imported at every Python start when the project is on sys.path",
    ),
    (
        ".local/lib",
        "the user site-packages when the scratch is a home directory: .pth files and usercustomize run at every Python start",
    ),
    (
        ".config/pip",
        "pip.conf: the index the next pip install takes packages (and their setup code) from",
    ),
    (".pip", "pip.conf, older place"),
    (".pythonrc.py", "the usual PYTHONSTARTUP file"),
    (".pythonrc", "the usual PYTHONSTARTUP file"),
    (".pdbrc", "pdb runs its commands when debugging here"),
    // Node.
    (
        ".npmrc",
        "npm's script-shell, node-options (--require) and registry",
    ),
    (".yarnrc", "yarn 1's settings, yarn-path among them"),
    (
        ".yarnrc.yml",
        "yarnPath: the script yarn runs in place of itself; plugins",
    ),
    (
        ".yarn/releases",
        "the yarn release yarnPath names, run by every yarn command",
    ),
    (".yarn/plugins", "yarn plugins, loaded by every yarn command"),
    (".pnpmfile.cjs", "pnpm runs its hooks on install"),
    (
        "bunfig.toml",
        "scripts bun preloads before every run and test",
    ),
    // Debuggers.
    (
        ".gdbinit",
        "gdb runs it (here when auto-load allows, in a home always)",
    ),
    (".config/gdb", "gdb's gdbinit (XDG)"),
    (".lldbinit", "lldb runs it"),
];

/// The default list as owned strings.
pub fn defaults() -> Vec<String> {
    DEFAULT_PROTECTED
        .iter()
        .map(|(p, _)| (*p).to_owned())
        .collect()
}

/// A path relative to the scratch directory: no leading `/`, no `.` or `..` components, no empty
/// components, at most 16 deep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProtectedPath(String);

impl ProtectedPath {
    /// Validates a path.
    ///
    /// ```
    /// use palisade_policy::protect::ProtectedPath;
    /// assert_eq!(ProtectedPath::new(".git/hooks/").unwrap().as_str(), ".git/hooks");
    /// assert!(ProtectedPath::new("/etc").is_err());
    /// assert!(ProtectedPath::new("../x").is_err());
    /// ```
    pub fn new(s: &str) -> Result<ProtectedPath, PolicyError> {
        Self::check(s).map(|t| ProtectedPath(t.to_owned()))
    }

    /// [`ProtectedPath::new`] without the copy: the path as it would be kept (without a trailing
    /// `/`), or why it is refused.
    pub fn check(s: &str) -> Result<&str, PolicyError> {
        const EXPECTED: &str =
            "a path relative to the scratch directory, e.g. `.git/hooks` (no leading `/`, no `.` or `..`)";
        let t = s.trim_end_matches('/');
        // Counted as they come, without a list: every policy check runs this for each of the
        // ~60 default paths.
        let mut depth = 0;
        let bad_component = t.split('/').any(|c| {
            depth += 1;
            depth > 16 || c.is_empty() || c == "." || c == ".."
        });
        if t.is_empty() || s.starts_with('/') || t.contains('\0') || bad_component {
            return Err(PolicyError::invalid("protect", s, EXPECTED));
        }
        Ok(t)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ProtectedPath {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, PolicyError> {
        ProtectedPath::new(&s)
    }
}

impl From<ProtectedPath> for String {
    fn from(p: ProtectedPath) -> String {
        p.0
    }
}

/// A repository's own files, read for the places they make git go: pure parsers (the planner
/// reads the files, bounded and without following a link, and protects what these find).
pub mod git {
    use std::path::Path;

    /// Most bytes of a `.git` file or a `commondir` read (a path: `PATH_MAX` and a prefix).
    pub const MAX_POINTER: usize = 4200;
    /// Most bytes of a config file or `.gitmodules` read; a longer one is refused.
    pub const MAX_CONFIG: usize = 1 << 20;
    /// Most config files read for one repository, includes among them (git itself stops at a
    /// depth of 10 includes).
    pub const MAX_CONFIGS: usize = 32;

    /// The last part of config keys whose value is a command git runs (or whose section is
    /// `alias` or `pager`): a word of it that names a file in the worktree makes that file run.
    const COMMAND_NAMES: &[&str] = &[
        "fsmonitor",
        "sshcommand",
        "editor",
        "pager",
        "askpass",
        "external",
        "program",
        "helper",
        "command",
        "textconv",
        "clean",
        "smudge",
        "process",
        "driver",
        "cmd",
        "uploadpack",
        "receivepack",
    ];

    /// The target of a `.git` file (`gitdir: PATH`), as git reads it; `None` if it is not one.
    ///
    /// ```
    /// use palisade_policy::protect::git::gitfile_target;
    /// assert_eq!(gitfile_target(b"gitdir: ../.git/modules/a\n").as_deref(), Some("../.git/modules/a"));
    /// assert_eq!(gitfile_target(b"ref: HEAD\n"), None);
    /// ```
    pub fn gitfile_target(b: &[u8]) -> Option<String> {
        let rest = b.strip_prefix(b"gitdir: ")?;
        pointer(rest)
    }

    /// The path in a `commondir` file (its content, without the line end).
    pub fn commondir_target(b: &[u8]) -> Option<String> {
        pointer(b)
    }

    fn pointer(b: &[u8]) -> Option<String> {
        let mut end = b.len();
        while end > 0 && matches!(b[end - 1], b'\n' | b'\r') {
            end -= 1;
        }
        let s = std::str::from_utf8(&b[..end]).ok()?;
        (!s.is_empty() && !s.contains(['\n', '\0'])).then(|| s.to_owned())
    }

    /// Every `(key, value)` of a git config file, in order. The key is `section.name` or
    /// `section.subsection.name`, with the section and the name lowercased as git compares them;
    /// a key without `=` has the value `true`. Follows git's own reader (comments, quotes,
    /// escapes, line continuations, `[section "sub"]` and `[section.sub]` headers, a key after the
    /// header on the same line). A line git would reject is skipped (git then refuses the whole
    /// file, so nothing in it runs).
    ///
    /// ```
    /// use palisade_policy::protect::git::config_entries;
    /// let e = config_entries("[core]\n\thooksPath = \".hooks\" # mine\n[remote \"Up\"] url = x\n");
    /// assert_eq!(e, [("core.hookspath".into(), ".hooks".into()), ("remote.Up.url".into(), "x".into())]);
    /// ```
    pub fn config_entries(text: &str) -> Vec<(String, String)> {
        let c: Vec<char> = text.replace("\r\n", "\n").chars().collect();
        let mut out = Vec::new();
        let mut section: Option<String> = None;
        let mut i = 0;
        let to_eol = |i: &mut usize| {
            while *i < c.len() && c[*i] != '\n' {
                *i += 1;
            }
        };
        while i < c.len() {
            let ch = c[i];
            if ch.is_whitespace() {
                i += 1;
            } else if ch == '#' || ch == ';' {
                to_eol(&mut i);
            } else if ch == '[' {
                i += 1;
                section = header(&c, &mut i);
                if section.is_none() {
                    to_eol(&mut i);
                }
            } else if ch.is_ascii_alphabetic() {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '-') {
                    i += 1;
                }
                let name: String = c[start..i].iter().collect::<String>().to_lowercase();
                while i < c.len() && (c[i] == ' ' || c[i] == '\t') {
                    i += 1;
                }
                let value = if i >= c.len() || c[i] == '\n' {
                    Some("true".to_owned())
                } else if c[i] == '=' {
                    i += 1;
                    value(&c, &mut i)
                } else {
                    None
                };
                match (&section, value) {
                    (Some(s), Some(v)) => out.push((format!("{s}.{name}"), v)),
                    _ => to_eol(&mut i),
                }
            } else {
                to_eol(&mut i);
            }
        }
        out
    }

    /// After `[`: the section (`name` or `name.subsection`), `None` if malformed.
    fn header(c: &[char], i: &mut usize) -> Option<String> {
        let mut name = String::new();
        while *i < c.len() {
            let ch = c[*i];
            *i += 1;
            if ch == ']' {
                return (!name.is_empty()).then_some(name);
            }
            if ch == ' ' || ch == '\t' {
                while *i < c.len() && (c[*i] == ' ' || c[*i] == '\t') {
                    *i += 1;
                }
                if c.get(*i) != Some(&'"') || name.is_empty() {
                    return None;
                }
                *i += 1;
                let mut sub = String::new();
                loop {
                    match c.get(*i) {
                        None | Some('\n') => return None,
                        Some('"') => break,
                        Some('\\') => {
                            *i += 1;
                            match c.get(*i) {
                                None | Some('\n') => return None,
                                Some(&e) => sub.push(e),
                            }
                        }
                        Some(&o) => sub.push(o),
                    }
                    *i += 1;
                }
                *i += 1;
                return (c.get(*i) == Some(&']')).then(|| {
                    *i += 1;
                    format!("{name}.{sub}")
                });
            }
            if !(ch.is_ascii_alphanumeric() || ch == '-' || ch == '.') {
                return None;
            }
            name.push(ch.to_ascii_lowercase());
        }
        None
    }

    /// After `=`: the value up to the end of the line, as git reads it; `None` if malformed.
    fn value(c: &[char], i: &mut usize) -> Option<String> {
        let mut v = String::new();
        let (mut quote, mut comment, mut space) = (false, false, 0usize);
        loop {
            let Some(&ch) = c.get(*i) else {
                return (!quote).then_some(v);
            };
            *i += 1;
            if ch == '\n' {
                if quote {
                    // Unclosed: the caller skips to this line's end, not the next one's.
                    *i -= 1;
                    return None;
                }
                return Some(v);
            }
            if comment {
                continue;
            }
            if ch.is_whitespace() && !quote {
                if !v.is_empty() {
                    space += 1;
                }
                continue;
            }
            if !quote && (ch == '#' || ch == ';') {
                comment = true;
                continue;
            }
            for _ in 0..std::mem::take(&mut space) {
                v.push(' ');
            }
            match ch {
                '\\' => {
                    let e = c.get(*i).copied();
                    *i += 1;
                    match e {
                        Some('\n') => {}
                        Some('t') => v.push('\t'),
                        Some('b') => v.push('\u{8}'),
                        Some('n') => v.push('\n'),
                        Some(e @ ('\\' | '"')) => v.push(e),
                        _ => return None,
                    }
                }
                '"' => quote = !quote,
                o => v.push(o),
            }
        }
    }

    /// What a repository's config names: hook directories, included config files, and the
    /// words of its commands that are paths (`tools/fsmonitor.sh`, `./ssh-wrapper`).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Refs {
        pub hooks_paths: Vec<String>,
        pub includes: Vec<String>,
        pub commands: Vec<String>,
    }

    /// The [`Refs`] of a config file's text.
    ///
    /// ```
    /// use palisade_policy::protect::git::config_refs;
    /// let r = config_refs("[core]\nhooksPath = .githooks\nfsmonitor = \"sh tools/fsmon.sh\"\n[include]\npath = ../shared.inc\n");
    /// assert_eq!(r.hooks_paths, [".githooks"]);
    /// assert_eq!(r.commands, ["tools/fsmon.sh"]);
    /// assert_eq!(r.includes, ["../shared.inc"]);
    /// ```
    pub fn config_refs(text: &str) -> Refs {
        let mut r = Refs::default();
        for (k, v) in config_entries(text) {
            let section = k.split('.').next().unwrap_or("");
            let name = k.rsplit('.').next().unwrap_or("");
            let parts = k.split('.').count();
            if k == "core.hookspath" {
                r.hooks_paths.push(v);
            } else if (section == "include" && parts == 2 || section == "includeif")
                && name == "path"
            {
                r.includes.push(v);
            } else if (section == "alias" && v.starts_with('!'))
                || (section == "pager" && parts == 2)
                || (section != "alias" && COMMAND_NAMES.contains(&name))
            {
                r.commands.extend(command_paths(&v));
            }
        }
        r
    }

    /// The words of a shell command (after a leading `!`) that look like paths to a file: a `/`
    /// in them, and not an option, an assignment or a URL.
    fn command_paths(cmd: &str) -> Vec<String> {
        let cmd = cmd.strip_prefix('!').unwrap_or(cmd);
        let mut words = Vec::new();
        let mut w = String::new();
        let mut quote: Option<char> = None;
        let mut it = cmd.chars();
        while let Some(ch) = it.next() {
            match (quote, ch) {
                (Some(q), ch) if ch == q => quote = None,
                (Some('"'), '\\') => w.extend(it.next()),
                (Some(_), ch) => w.push(ch),
                (None, '\'' | '"') => quote = Some(ch),
                (None, '\\') => w.extend(it.next()),
                (None, ch) if ch.is_whitespace() || ";|&()<>`".contains(ch) => {
                    words.push(std::mem::take(&mut w))
                }
                (None, ch) => w.push(ch),
            }
        }
        words.push(w);
        words
            .into_iter()
            .filter(|w| {
                w.contains('/') && !w.starts_with('-') && !w.contains('=') && !w.contains("://")
            })
            .collect()
    }

    /// The `submodule.NAME.path` values of a `.gitmodules` file.
    pub fn submodule_paths(text: &str) -> Vec<String> {
        config_entries(text)
            .into_iter()
            .filter(|(k, _)| {
                k.starts_with("submodule.") && k.ends_with(".path") && k.split('.').count() >= 3
            })
            .map(|(_, v)| v)
            .collect()
    }

    /// Where a path named in a repository's file lands.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Place {
        /// Under the scratch directory, relative to it, normalized.
        Inside(String),
        /// Not followed, and why (outside the scratch directory, the home directory, …).
        NotFollowed(&'static str),
    }

    /// Where `target`, named by a file in the directory `base` (relative to the scratch directory
    /// `scratch`; `""` for the scratch itself), lands, by its text alone: an absolute path must
    /// lie under `scratch`; `..` may climb back out of `base` but not out of the scratch, and not
    /// through a name of `target` itself (that name might be a link the host would follow).
    ///
    /// ```
    /// use palisade_policy::protect::git::{place, Place};
    /// use std::path::Path;
    /// let s = Path::new("/p");
    /// assert_eq!(place(s, ".git/worktrees/w", "../.."), Place::Inside(".git".into()));
    /// assert_eq!(place(s, "", "/p/.hooks/"), Place::Inside(".hooks".into()));
    /// assert!(matches!(place(s, "", "/elsewhere/.git"), Place::NotFollowed(_)));
    /// assert!(matches!(place(s, "", "~/.githooks"), Place::NotFollowed(_)));
    /// ```
    pub fn place(scratch: &Path, base: &str, target: &str) -> Place {
        const OUTSIDE: &str = "outside the scratch directory";
        if target.starts_with('~') || target.starts_with("%(prefix)") {
            return Place::NotFollowed("in a home directory or git's installation");
        }
        let (mut comps, tail): (Vec<&str>, &str) = if target.starts_with('/') {
            match Path::new(target).strip_prefix(scratch) {
                Ok(rest) => match rest.to_str() {
                    Some(r) => (Vec::new(), r),
                    None => return Place::NotFollowed("not UTF-8"),
                },
                Err(_) => return Place::NotFollowed(OUTSIDE),
            }
        } else {
            (base.split('/').filter(|c| !c.is_empty()).collect(), target)
        };
        // How many of `comps` are still the base's (directories the planner walked without
        // following a link); `..` may only take those away.
        let mut of_base = comps.len();
        for comp in tail.split('/') {
            match comp {
                "" | "." => {}
                ".." if comps.len() > of_base => {
                    return Place::NotFollowed(
                        "`..` after a name of its own, which a link could redirect",
                    )
                }
                ".." => {
                    if comps.pop().is_none() {
                        return Place::NotFollowed(OUTSIDE);
                    }
                    of_base -= 1;
                }
                c => comps.push(c),
            }
        }
        if comps.is_empty() {
            return Place::NotFollowed("the scratch directory itself");
        }
        Place::Inside(comps.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::git::*;
    use super::*;
    use std::path::Path;

    #[test]
    fn the_defaults_are_valid_and_each_once() {
        let all = defaults();
        for (i, p) in all.iter().enumerate() {
            assert_eq!(ProtectedPath::new(p).unwrap().as_str(), p);
            assert!(!all[..i].contains(p), "{p} twice");
        }
        for (p, why) in DEFAULT_PROTECTED {
            assert!(!why.is_empty(), "{p} has no reason");
        }
    }

    /// The same text as `git config -f FILE --list` reads it (checked with git 2.47): comments,
    /// quotes, escapes, a continued line, both header forms, a key on the header's line, a key
    /// without a value, CRLF line ends; a malformed line is skipped.
    #[test]
    fn config_entries_read_as_git_does() {
        let text = "# top\n[core]\n\tbare = false ; trailing\n\tHooksPath = \" a b \"\\\n/c # x\n\
                    [Remote \"Or\\\"ig\"] url = u\r\n[branch.Main]\n\tremote\n\
                    [alias]\n\tx = !sh -c 'echo \\\"hi\\\"'\n\tbad = \"open\n\tok = 1\n[broken\nk = v\n";
        let e = config_entries(text);
        let want: Vec<(String, String)> = [
            ("core.bare", "false"),
            ("core.hookspath", " a b /c"),
            ("remote.Or\"ig.url", "u"),
            ("branch.main.remote", "true"),
            ("alias.x", "!sh -c 'echo \"hi\"'"),
            ("alias.ok", "1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(e, want);
    }

    #[test]
    fn config_refs_find_hook_dirs_includes_and_scripts() {
        let text = r#"
[core]
    hooksPath = .githooks
    fsmonitor = "tools/fsmon.sh --flag"
    sshCommand = ssh -F ./ssh/config
    pager = less
[include]
    path = ../shared.gitconfig
[includeIf "gitdir:/x/"]
    path = conf/extra.inc
[alias]
    st = status
    up = "!./scripts/up.sh && git push"
[filter "lfs"]
    clean = git-lfs clean -- %f
    smudge = bin/smudge --url=https://x/y
[remote "origin"]
    url = https://example.org/a/b.git
    uploadpack = ../bin/upload
"#;
        let r = config_refs(text);
        assert_eq!(
            r,
            Refs {
                hooks_paths: vec![".githooks".into()],
                includes: vec!["../shared.gitconfig".into(), "conf/extra.inc".into()],
                commands: [
                    "tools/fsmon.sh",
                    "./ssh/config",
                    "./scripts/up.sh",
                    "bin/smudge",
                    "../bin/upload"
                ]
                .map(String::from)
                .to_vec(),
            }
        );
    }

    #[test]
    fn pointers_and_submodules() {
        assert_eq!(
            gitfile_target(b"gitdir: /r/.git/worktrees/w\r\n").as_deref(),
            Some("/r/.git/worktrees/w")
        );
        assert_eq!(gitfile_target(b"gitdir: \n"), None);
        assert_eq!(gitfile_target(b"gitdir: a\nb"), None);
        assert_eq!(commondir_target(b"../..\n").as_deref(), Some("../.."));
        assert_eq!(
            submodule_paths(
                "[submodule \"a\"]\n\tpath = libs/a\n\turl = x\n[submodule \"b\"]\npath=b\n"
            ),
            ["libs/a", "b"]
        );
    }

    #[test]
    fn places_are_decided_by_text_alone() {
        let s = Path::new("/home/u/proj");
        let cases: &[(&str, &str, Place)] = &[
            ("", ".githooks", Place::Inside(".githooks".into())),
            ("", "./a//b/", Place::Inside("a/b".into())),
            (".git", "../.cache/g", Place::Inside(".cache/g".into())),
            (".git/worktrees/w", "../..", Place::Inside(".git".into())),
            ("", "/home/u/proj/x", Place::Inside("x".into())),
            (
                "",
                "..",
                Place::NotFollowed("outside the scratch directory"),
            ),
            (
                ".git",
                "../../x",
                Place::NotFollowed("outside the scratch directory"),
            ),
            (
                "",
                "/home/u/project2/x",
                Place::NotFollowed("outside the scratch directory"),
            ),
            (
                "",
                "/home/u/proj/../x",
                Place::NotFollowed("outside the scratch directory"),
            ),
            (
                "",
                "a/../b",
                Place::NotFollowed("`..` after a name of its own, which a link could redirect"),
            ),
            (
                "",
                "~/.githooks",
                Place::NotFollowed("in a home directory or git's installation"),
            ),
            ("", ".", Place::NotFollowed("the scratch directory itself")),
        ];
        for (base, target, want) in cases {
            assert_eq!(&place(s, base, target), want, "{base} + {target}");
        }
    }
}
