//! palisade's Linux backend: namespaces, the filesystem view, Landlock, seccomp, capabilities,
//! descriptors and the in-sandbox init. All of palisade's `unsafe` code lives in this crate,
//! behind [`spawn`], and within it in the private `sys` module: every other module denies
//! `unsafe` code (those with none at all forbid it), and the few documented exceptions, the
//! clones and the fork themselves, are listed in `sys`'s module docs.
//!
//! ```
//! use palisade_linux::{spawn, OutputQueue, Stdin, Termination, Watch};
//! use palisade_policy::Policy;
//!
//! let policy = Policy::new(["sh", "-c", "echo hello from inside"]).unwrap();
//! let running = spawn(&policy, Stdin::Null, None).unwrap();
//! let output = OutputQueue::new(usize::MAX).unwrap();
//! let watch = Watch { output: &output, cpu: None, terminal: None, signals: None, refusal_share: 1.0 };
//! let outcome = running.wait(watch).unwrap();
//! assert_eq!(outcome.termination, Termination::Exited(0));
//! assert_eq!(output.take_all().0, b"hello from inside\n");
//! ```

// Raw system calls live in `sys` only. A module that needs none forbids `unsafe` outright;
// one with a documented exception (see `sys`) denies it, allowing it on that one statement.
#[deny(unsafe_code)]
mod child;
#[deny(unsafe_code)]
pub mod engine;
#[forbid(unsafe_code)]
mod error;
#[forbid(unsafe_code)]
pub mod fs;
#[forbid(unsafe_code)]
pub mod host;
#[forbid(unsafe_code)]
pub mod landlock;
#[forbid(unsafe_code)]
pub mod output;
#[forbid(unsafe_code)]
pub mod plan;
#[deny(unsafe_code)]
pub mod pool;
#[forbid(unsafe_code)]
pub mod seccomp;
#[deny(unsafe_code)]
mod spawn;
mod sys;
#[deny(unsafe_code)]
mod warm;
#[forbid(unsafe_code)]
pub mod wire;
#[deny(unsafe_code)]
mod zygote;

pub use child::Step;
pub use engine::{run_if_init, Engine, InitProgram};
pub use error::SetupError;
pub use landlock::LandlockState;
pub use output::{OutputQueue, Received, Stream};
pub use plan::{in_files_fit, Extras, FileIn, Ids, SockRole, SockSpec, MAX_FILES_IN};
pub use spawn::{
    namespaces_error, spawn, spawn_with, Attempt, BeforeStart, CpuWatch, DeniedCall, IdLease,
    Killer, LimitHit, Outcome, Running, Stdin, Termination, Watch, NAMESPACES, ROOT_MAPPED_ID,
    ROOT_MAPPED_IDS,
};
pub use warm::WarmPython;
pub use zygote::{NetLease, Template};
