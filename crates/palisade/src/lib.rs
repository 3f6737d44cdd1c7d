#![forbid(unsafe_code)]
#![warn(missing_docs)]
//! palisade: run code nobody has read behind a boundary the kernel enforces.
//!
//! ```
//! use palisade::Sandbox;
//!
//! let out = Sandbox::builder()
//!     .command(["sh", "-c", "echo $MODE; pwd"])
//!     .env("MODE", "fast")
//!     .output()
//!     .unwrap();
//! assert_eq!(out.report.status, palisade::Status::Ok);
//! assert_eq!(out.stdout, b"fast\n/workspace\n");
//! ```

mod builder;
pub mod doctor;
mod report;
mod sandbox;
pub mod workspace;

pub use builder::Builder;
pub use palisade_cgroup::{exec_memory_ceiling, MemoryReservation, ReserveError};
pub use palisade_linux::SetupError;
pub use palisade_net::{
    set_max_connections_in_process, Decision as NetDecision, Event as NetEvent, NetLog,
    Reason as NetReason, Via as NetVia, MAX_CONNECTIONS_IN_PROCESS,
};
pub use palisade_policy as policy;
pub use report::{
    Layer, Report, Status, EXIT_CANNOT_EXECUTE, EXIT_LIMIT, EXIT_NOT_FOUND, EXIT_SANDBOX_ERROR,
};
pub use sandbox::{
    in_files_fit, Chunk, Engine, ExecCgroup, FileIn, Io, NetNotify, Output, Run, RunKiller,
    Sandbox, Stdin, Stream, Template, WarmPython, WorkspaceOptions, MAX_FILES_IN,
};

/// The engine hook of a program that can serve as palisade's init program (docs/engine.md).
pub mod engine {
    pub use palisade_linux::engine::{run_if_init, InitProgram, INIT_PROGRAM_ENV};
}

/// For a session's agent (a program inside the sandbox that starts others): its programs enter
/// the cgroups of their exec before they start ([`Run::exec_cgroup`]).
pub mod agent {
    pub use palisade_linux::host::{give_large_buffers_back, join_cgroups_before_exec, Joined};
}

/// A front end's own terminal and signals (the CLI's): raw mode restored on drop, and signals
/// forwarded to the sandbox instead of taken with their usual effect. A server uses neither.
pub mod term {
    pub use palisade_linux::host::{
        copy_winsize, dup_fd, open_directory, replace_file_at, ForwardedSignals, RawTerminal,
        SignalSource,
    };
}
