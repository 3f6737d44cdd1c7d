//! Protected paths: places under a host scratch directory from which code could act after the
//! run — a git hook, a shell rc file, an editor's or agent's task and hook configuration — kept
//! read-only inside even though the rest of the scratch directory is writable (docs/policy.md).

use crate::PolicyError;
use serde::{Deserialize, Serialize};

/// Protected by default, relative to the scratch directory, with what each would run.
pub const DEFAULT_PROTECTED: &[(&str, &str)] = &[
    (
        ".git/hooks",
        "git runs hook scripts on commit, checkout, merge, push",
    ),
    (
        ".git/config",
        "core.fsmonitor, core.sshCommand, aliases with `!` and filters run commands",
    ),
    (".envrc", "direnv runs it on entering the directory"),
    (
        ".bashrc",
        "bash runs it (the scratch directory is $HOME inside; it may be a home on the host)",
    ),
    (".bash_profile", "bash login shells run it"),
    (".bash_login", "bash login shells run it"),
    (".profile", "login shells run it"),
    (".zshrc", "zsh runs it"),
    (".zshenv", "zsh runs it for every shell"),
    (".zprofile", "zsh login shells run it"),
    (".config/fish", "fish runs its config.fish"),
    (
        ".vscode",
        "tasks.json and settings run commands in the editor",
    ),
    (".idea", "run configurations and startup tasks"),
    (
        ".devcontainer",
        "the container definition an editor builds and runs",
    ),
    (".claude", "Claude Code's settings and hooks run commands"),
    (".mcp.json", "MCP servers an agent starts"),
    (".cursor", "Cursor's rules and MCP servers"),
    (".codex", "Codex CLI's configuration"),
    (".gemini", "Gemini CLI's settings and MCP servers"),
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
        const EXPECTED: &str =
            "a path relative to the scratch directory, e.g. `.git/hooks` (no leading `/`, no `.` or `..`)";
        let t = s.trim_end_matches('/');
        let comps: Vec<&str> = t.split('/').collect();
        if t.is_empty()
            || s.starts_with('/')
            || t.contains('\0')
            || comps.len() > 16
            || comps
                .iter()
                .any(|c| c.is_empty() || *c == "." || *c == "..")
        {
            return Err(PolicyError::invalid("protect", s, EXPECTED));
        }
        Ok(ProtectedPath(t.to_owned()))
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
