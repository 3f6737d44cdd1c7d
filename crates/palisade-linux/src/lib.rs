//! palisade's Linux backend: namespaces, the filesystem view, Landlock, seccomp, capabilities,
//! descriptors and the in-sandbox init. All of palisade's `unsafe` code lives in this crate,
//! behind [`spawn`].
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

mod child;
pub mod engine;
mod error;
pub mod fs;
pub mod host;
pub mod landlock;
pub mod output;
pub mod plan;
pub mod seccomp;
mod spawn;
mod sys;
mod warm;
pub mod wire;
mod zygote;

pub use child::Step;
pub use engine::{run_if_init, Engine, InitProgram};
pub use error::SetupError;
pub use landlock::LandlockState;
pub use output::{OutputQueue, Received, Stream};
pub use plan::{Extras, Ids, SockRole, SockSpec};
pub use spawn::{
    namespaces_error, spawn, spawn_with, Attempt, BeforeStart, CpuWatch, DeniedCall, IdLease,
    Killer, LimitHit, Outcome, Running, Stdin, Termination, Watch, NAMESPACES, ROOT_MAPPED_ID,
    ROOT_MAPPED_IDS,
};
pub use warm::WarmPython;
pub use zygote::Template;
