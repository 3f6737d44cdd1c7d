//! Languages: where the code goes, how it is compiled and run. A language is offered only when its
//! tool is installed where the sandbox sees it (the system directories of its `PATH`).

use crate::api;

/// One language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lang {
    /// Its name in requests (`python`, `cpp`, …).
    pub name: &'static str,
    /// Other names accepted for it (SandboxFusion's `nodejs`, …).
    pub aliases: &'static [&'static str],
    /// The file the code is written to.
    pub file: &'static str,
    /// The compile command, for compiled languages.
    pub compile: Option<&'static [&'static str]>,
    /// The run command.
    pub run: &'static [&'static str],
    /// The tool that must be installed.
    pub tool: &'static str,
}

/// Every language palisade knows; [`available`] keeps those whose tool is here.
pub const ALL: &[Lang] = &[
    Lang {
        name: "python",
        aliases: &["python3", "py"],
        file: "main.py",
        compile: None,
        run: &["python3", "main.py"],
        tool: "python3",
    },
    Lang {
        name: "javascript",
        aliases: &["nodejs", "node", "js"],
        file: "main.js",
        compile: None,
        run: &["node", "main.js"],
        tool: "node",
    },
    Lang {
        name: "bash",
        aliases: &["shell"],
        file: "main.sh",
        compile: None,
        run: &["bash", "main.sh"],
        tool: "bash",
    },
    Lang {
        name: "sh",
        aliases: &[],
        file: "main.sh",
        compile: None,
        run: &["sh", "main.sh"],
        tool: "sh",
    },
    Lang {
        name: "c",
        aliases: &[],
        file: "main.c",
        compile: Some(&["gcc", "-O2", "-o", "main", "main.c", "-lm"]),
        run: &["./main"],
        tool: "gcc",
    },
    Lang {
        name: "cpp",
        aliases: &["c++"],
        file: "main.cpp",
        compile: Some(&["g++", "-O2", "-o", "main", "main.cpp"]),
        run: &["./main"],
        tool: "g++",
    },
    Lang {
        name: "rust",
        aliases: &[],
        file: "main.rs",
        compile: Some(&["rustc", "-O", "-o", "main", "main.rs"]),
        run: &["./main"],
        tool: "rustc",
    },
    Lang {
        name: "go",
        aliases: &["golang"],
        file: "main.go",
        compile: Some(&["go", "build", "-o", "main", "main.go"]),
        run: &["./main"],
        tool: "go",
    },
];

/// The directories of the sandbox's `PATH` that are the host's own (the system directories are
/// bound read-only at the same place).
const SEARCH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// The languages whose tool is installed here.
pub fn available() -> Vec<Lang> {
    ALL.iter()
        .filter(|l| {
            SEARCH
                .iter()
                .any(|d| std::path::Path::new(d).join(l.tool).is_file())
        })
        .cloned()
        .collect()
}

/// The `python3` a run of the `python` language finds first in the sandbox's `PATH` (the warm
/// interpreter is that one).
pub fn python_path() -> std::path::PathBuf {
    SEARCH
        .iter()
        .map(|d| std::path::Path::new(d).join("python3"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| "/usr/bin/python3".into())
}

/// Finds `name` among `langs` (by name or alias).
pub fn find<'a>(langs: &'a [Lang], name: &str) -> Option<&'a Lang> {
    langs
        .iter()
        .find(|l| l.name == name || l.aliases.contains(&name))
}

/// What the API lists.
pub fn describe(langs: &[Lang]) -> Vec<api::Language> {
    langs
        .iter()
        .map(|l| api::Language {
            name: l.name.into(),
            tool: l.tool.into(),
            compiled: l.compile.is_some(),
        })
        .collect()
}

/// Names for an error message.
pub fn names(langs: &[Lang]) -> String {
    langs.iter().map(|l| l.name).collect::<Vec<_>>().join(", ")
}
