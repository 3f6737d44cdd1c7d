#![forbid(unsafe_code)]
//! palisade: run code nobody has read behind a boundary the kernel enforces.
//!
//! ```no_run
//! use palisade::Sandbox;
//!
//! let out = Sandbox::builder()
//!     .command(["python3", "-c", "import os; print(os.getcwd())"])
//!     .env("MODE", "fast")
//!     .output()
//!     .unwrap();
//! assert_eq!(out.report.status, palisade::Status::Ok);
//! assert_eq!(out.stdout, b"/workspace\n");
//! ```

mod report;
mod sandbox;

pub use palisade_linux::SetupError;
pub use palisade_policy as policy;
pub use report::{Layer, Report, Status, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SANDBOX_ERROR};
pub use sandbox::{Builder, Output, Sandbox};
