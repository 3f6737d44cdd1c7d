use std::path::PathBuf;
use thiserror::Error;

/// Why a sandbox could not be set up or started. None of these is the payload's own result.
///
/// Messages name policy fields as a policy file does (`filesystem.rw`, `layers.allow_degraded`),
/// and a setting to change as "add `VALUE` to FIELD", so that a front end with names of its own
/// (the command line's options) can say the same in its words.
#[derive(Debug, Error)]
pub enum SetupError {
    #[error(transparent)]
    Policy(#[from] palisade_policy::PolicyError),
    #[error("{field} `{}`: {source}", path.display())]
    HostPath {
        field: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{field} `{}` is not a directory", path.display())]
    NotADirectory { field: &'static str, path: PathBuf },
    #[error("{field} `{}` is not writable by uid {uid}; choose a directory you can write", path.display())]
    NotWritable {
        field: &'static str,
        path: PathBuf,
        uid: u32,
    },
    #[error("host device `{}` is missing; palisade binds it into the sandbox's /dev", path.display())]
    MissingHostDevice { path: PathBuf },
    #[error("`{program}` has no `/` and the sandbox's PATH has no absolute directory to search")]
    NoSearchPath { program: String },
    #[error("{op} failed: {source}")]
    Supervisor {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("could not create the sandbox's namespaces: {source}; {hint}")]
    Namespaces {
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("could not write the user namespace map ({file}): {source}")]
    IdMap {
        file: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("could not prepare {what} `{}`: {source}{hint}", path.display())]
    HostMount {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("the kernel cannot enforce Landlock, the filesystem's second wall ({source}): {hint}; or add `landlock` to layers.allow_degraded to run with the mount view as the only filesystem wall")]
    LandlockUnavailable {
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("protected path `{path}` in the scratch directory is a {kind}, which palisade cannot keep read-only (a mount over it would follow it); replace it with a regular file or directory, or add `{path}` to filesystem.unprotect")]
    ProtectedUnsupported { path: String, kind: &'static str },
    #[error("sandbox setup failed at step \"{what}\": {source}")]
    Child {
        /// Which step of init's setup (docs/setup-order.md).
        step: crate::child::Step,
        /// That step in words, with the path or value involved.
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{program}`: {source}")]
    Exec {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox's init ended before the payload started")]
    InitVanished,
}

impl SetupError {
    /// A stable code for the kind of failure, for reports and API clients (the message is for
    /// people): `policy`, `host-path`, `namespaces`, `setup-step`, `exec`, ….
    pub fn kind(&self) -> &'static str {
        match self {
            SetupError::Policy(_) => "policy",
            SetupError::HostPath { .. }
            | SetupError::NotADirectory { .. }
            | SetupError::NotWritable { .. } => "host-path",
            SetupError::MissingHostDevice { .. } => "host-device",
            SetupError::NoSearchPath { .. } => "no-search-path",
            SetupError::Supervisor { .. } => "supervisor",
            SetupError::Namespaces { .. } => "namespaces",
            SetupError::IdMap { .. } => "id-map",
            SetupError::HostMount { .. } => "host-mount",
            SetupError::LandlockUnavailable { .. } => "landlock-unavailable",
            SetupError::ProtectedUnsupported { .. } => "protected-path",
            SetupError::Child { .. } => "setup-step",
            SetupError::Exec { .. } => "exec",
            SetupError::InitVanished => "init-vanished",
        }
    }

    /// The setup step that failed, when it was one of init's.
    pub fn step(&self) -> Option<crate::child::Step> {
        match self {
            SetupError::Child { step, .. } => Some(*step),
            _ => None,
        }
    }
}
