//! palisade's Linux backend: namespaces, the filesystem view, Landlock, seccomp, capabilities,
//! descriptors and the in-sandbox init. All of palisade's `unsafe` code lives in this crate,
//! behind [`spawn`].
//!
//! ```
//! use palisade_linux::{spawn, Sinks, Stdin, Termination};
//! use palisade_policy::Policy;
//!
//! let policy = Policy::new(["sh", "-c", "echo hello from inside"]).unwrap();
//! let running = spawn(&policy, Stdin::Null, None).unwrap();
//! let (mut out, mut err) = (Vec::new(), Vec::new());
//! let sinks = Sinks { stdout: &mut out, stderr: &mut err, input: None, signals: None };
//! let outcome = running.wait(sinks, None).unwrap();
//! assert_eq!(outcome.termination, Termination::Exited(0));
//! assert_eq!(out, b"hello from inside\n");
//! ```

pub mod child;
mod error;
pub mod host;
pub mod landlock;
pub mod plan;
pub mod seccomp;
mod spawn;
pub mod sys;

pub use error::SetupError;
pub use landlock::LandlockState;
pub use plan::{Ids, SockRole, SockSpec};
pub use spawn::{
    namespaces_error, spawn, BeforeStart, CpuWatch, DeniedCall, LimitHit, Outcome, Running, Sinks,
    Stdin, Termination, NAMESPACES, ROOT_MAPPED_ID,
};
