//! The agent's wire format: what the server and `palisade __agent` (the sandbox's payload) say to
//! each other over the unix stream socket that is the agent's fd 0.
//!
//! A frame is `u32 header length | u32 data length | header (JSON) | data (raw bytes)`, both
//! lengths big-endian. The header is small and bounded ([`MAX_HEADER`]); the data carries file
//! contents and is bounded by whoever reads it (the server by the request's own limits, the agent
//! by [`MAX_DATA`]). Descriptors (an exec's pipes) travel as `SCM_RIGHTS` with the first bytes of
//! the reply frame they belong to.
//!
//! Paths are relative to the sandbox's working directory (`/workspace`), checked on both sides by
//! [`check_path`]: no absolute path, no `.` or `..` component, no NUL, bounded length and depth.
//! The agent resolves them one component at a time without following any symlink, so a path
//! the code replaced with a link fails instead of leading elsewhere (and the agent runs inside the
//! boundary in any case: it can reach nothing the code could not).

use serde::{Deserialize, Serialize};

/// Largest frame header.
pub const MAX_HEADER: usize = 64 << 10;
/// Largest data part the agent accepts (a file written into the sandbox).
pub const MAX_DATA: usize = 1 << 30;
/// Most data in one [`Event::Part`] (and in the [`Event::Ok`] that ends a read).
pub const PART: usize = 128 << 10;
/// Longest relative path, and most components.
pub const MAX_PATH: usize = 4095;
/// Most path components.
pub const MAX_DEPTH: usize = 64;
/// Where the agent (the server's own executable) is bound inside the sandbox.
pub const AGENT_PATH: &str = "/.palisade/agent";
/// The hidden subcommand that makes the `palisade` binary act as the agent.
pub const AGENT_ARG: &str = "__agent";

/// What the server asks the agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Write the frame's data to `path` (parents created), replacing a regular file there.
    Write { id: u64, path: String, mode: u32 },
    /// Create a directory (and its parents).
    Mkdir { id: u64, path: String },
    /// Read a regular file, at most `max` bytes (a larger one is refused). With `len`: only up
    /// to `len` bytes from `offset` (a piece of a file streamed out), and the answer says which
    /// file it read ([`FileId`]), so that the pieces are known to be of one file.
    Read {
        id: u64,
        path: String,
        max: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        len: Option<u64>,
    },
    /// List a directory.
    List { id: u64, path: String },
    /// Remove a file, or a directory with everything under it when `recursive`.
    Remove {
        id: u64,
        path: String,
        recursive: bool,
    },
    /// Start a program in its own process group with fresh pipes; the reply carries the stdin
    /// write end and the stdout and stderr read ends, then an [`Event::Exit`] comes when it ends.
    Exec {
        id: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// Relative working directory; empty: the sandbox's working directory.
        cwd: String,
        /// The frame carries descriptors of the exec's cgroup (files opened by the server for
        /// writing): the program's process writes `0` into each before its exec, to enter it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        join: bool,
    },
    /// Send `signal` to the process group of the exec `exec`.
    Signal { id: u64, exec: u64, signal: i32 },
    /// A tar archive of the directory `path` (empty: the working directory), made a piece at
    /// a time: its regular files and directories; anything else is skipped and counted, never
    /// followed. The answer carries the archive's first `len` bytes at most, and `skipped` once
    /// its end is among them; until then the agent keeps the archive open as `id` for
    /// [`Request::TarMore`] (a few at most: the one asked for longest ago is dropped first).
    /// `strict`: an entry that would be skipped fails the archive instead. `max`: see below.
    TarOut {
        id: u64,
        path: String,
        len: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        strict: bool,
        /// The most bytes the whole archive may have (headers and its end included): one that
        /// would be larger fails `too-large`.
        max: u64,
    },
    /// The next `len` bytes at most of the archive `cursor` ([`Request::TarOut`]'s id).
    TarMore { id: u64, cursor: u64, len: u64 },
    /// Closes the archive `cursor` before its end.
    TarDrop { id: u64, cursor: u64 },
    /// Unpacks the tar archive in the frame's data under `path` (created): regular files and
    /// directories only. The server checks the archive whole first (`crate::archive`); the
    /// agent unpacks it as it reads it from the socket, checking each entry again.
    TarIn { id: u64, path: String },
}

impl Request {
    /// The request's id.
    pub fn id(&self) -> u64 {
        match self {
            Request::Write { id, .. }
            | Request::Mkdir { id, .. }
            | Request::Read { id, .. }
            | Request::List { id, .. }
            | Request::Remove { id, .. }
            | Request::Exec { id, .. }
            | Request::Signal { id, .. }
            | Request::TarOut { id, .. }
            | Request::TarMore { id, .. }
            | Request::TarDrop { id, .. }
            | Request::TarIn { id, .. } => *id,
        }
    }
}

/// What the agent answers, or tells on its own.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// The request `id` was done; `entries` for a list, the data part for a read, `pid` for an
    /// exec (whose three descriptors came with this frame).
    Ok {
        id: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        entries: Vec<Entry>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// For a tar: entries skipped (neither a regular file nor a directory).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skipped: Option<u64>,
        /// For a list: more entries than fit in one frame's header ([`MAX_HEADER`]); `entries`
        /// holds the first ones by name.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
        /// For an exec asked to `join`: whether its process entered every cgroup it was given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        joined: Option<bool>,
        /// For a read: the file it read, as it was when opened.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<FileId>,
    },
    /// The request `id` failed.
    Err {
        id: u64,
        /// A stable code: `not-found`, `symlink`, `not-regular`, `too-large`, `exists`,
        /// `not-directory`, `invalid`, `io`.
        code: String,
        message: String,
    },
    /// A piece of the data of request `id`'s answer (a file read back, an archive), sent before
    /// its [`Event::Ok`], which carries the last piece: the agent never holds a whole file.
    Part { id: u64 },
    /// The exec `id` ended.
    Exit {
        id: u64,
        code: Option<i32>,
        signal: Option<i32>,
        wall_ms: f64,
        /// CPU time (user and system) of the exec's program and of the descendants it waited
        /// for, in milliseconds, as the agent read it before reaping the program.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_ms: Option<f64>,
    },
}

impl Event {
    /// Request `id` was done, with nothing but data (if any) to tell.
    pub fn ok(id: u64) -> Event {
        Event::Ok {
            id,
            entries: Vec::new(),
            pid: None,
            skipped: None,
            truncated: false,
            joined: None,
            file: None,
        }
    }
}

/// Which file a read read, as it was when opened: its size, device and inode (a file replaced
/// between two pieces of a streamed read has another), and its change and modification times,
/// seconds and nanoseconds (a file written in place between two pieces has others: a write
/// moves both, and nothing the code can do sets the change time back).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileId {
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
    pub ctime: [i64; 2],
    pub mtime: [i64; 2],
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One directory entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The entry's name (not a path).
    pub name: String,
    /// `file`, `dir`, `symlink`, `fifo`, `socket`, `other`.
    pub kind: String,
    /// Size in bytes (regular files).
    pub size: u64,
}

/// Why a path is refused, for the error that names it.
pub const PATH_EXPECTED: &str = "a relative path under the working directory (e.g. `src/main.py`): no leading `/`, no `.` or `..` component, no NUL byte, at most 4095 bytes and 64 components";

/// Checks a relative path and returns its components.
///
/// ```
/// use palisade_service::proto::check_path;
/// assert_eq!(check_path("a//b/c.txt").unwrap(), vec!["a", "b", "c.txt"]);
/// assert!(check_path("../etc/passwd").is_err());
/// assert!(check_path("/etc/passwd").is_err());
/// assert!(check_path("a/./b").is_err());
/// ```
pub fn check_path(p: &str) -> Result<Vec<&str>, &'static str> {
    if p.is_empty() || p.starts_with('/') || p.contains('\0') || p.len() > MAX_PATH {
        return Err(PATH_EXPECTED);
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if comps.is_empty()
        || comps.len() > MAX_DEPTH
        || comps
            .iter()
            .any(|c| *c == "." || *c == ".." || c.len() > 255)
    {
        return Err(PATH_EXPECTED);
    }
    Ok(comps)
}

/// Encodes a frame.
pub fn encode<T: Serialize>(header: &T, data: &[u8]) -> Vec<u8> {
    let mut v = encode_head(header, data.len());
    v.extend_from_slice(data);
    v
}

/// A frame's lengths and header, for `len` bytes of data sent after it (not copied into it).
pub fn encode_head<T: Serialize>(header: &T, len: usize) -> Vec<u8> {
    let h = serde_json::to_vec(header).expect("protocol types serialize");
    let mut v = Vec::with_capacity(8 + h.len());
    v.extend_from_slice(&(h.len() as u32).to_be_bytes());
    v.extend_from_slice(&(len as u32).to_be_bytes());
    v.extend_from_slice(&h);
    v
}

/// A frame's two lengths, checked against the bounds: `Err` names what was too large.
pub fn lengths(prefix: &[u8; 8], max_data: usize) -> Result<(usize, usize), String> {
    let h = u32::from_be_bytes(prefix[..4].try_into().expect("4 bytes")) as usize;
    let d = u32::from_be_bytes(prefix[4..].try_into().expect("4 bytes")) as usize;
    if h == 0 || h > MAX_HEADER {
        return Err(format!("frame header of {h} bytes (at most {MAX_HEADER})"));
    }
    if d > max_data {
        return Err(format!("frame data of {d} bytes (at most {max_data})"));
    }
    Ok((h, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bounds_hold() {
        let r = Request::Read {
            id: 7,
            path: "a/b".into(),
            max: 10,
            offset: 3,
            len: Some(4),
        };
        let f = encode(&r, b"xyz");
        let (h, d) = lengths(f[..8].try_into().unwrap(), 3).unwrap();
        assert_eq!(d, 3);
        let back: Request = serde_json::from_slice(&f[8..8 + h]).unwrap();
        assert_eq!(back, r);
        assert_eq!(&f[8 + h..], b"xyz");
        assert!(lengths(f[..8].try_into().unwrap(), 2).is_err());
        let mut big = [0u8; 8];
        big[..4].copy_from_slice(&((MAX_HEADER + 1) as u32).to_be_bytes());
        assert!(lengths(&big, 0).is_err());
        assert!(lengths(&[0; 8], 0).is_err());
        // Unknown fields and operations are refused, not ignored.
        assert!(serde_json::from_str::<Request>(
            r#"{"op":"read","id":1,"path":"a","max":1,"x":1}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"chmod","id":1}"#).is_err());
    }

    #[test]
    fn paths() {
        for bad in ["", "/", "/a", "..", "a/../b", "./a", "a/.", "a\0b"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a/".repeat(65)).is_err());
        assert!(check_path(&"x".repeat(256)).is_err());
        assert_eq!(check_path("a/b/").unwrap(), vec!["a", "b"]);
    }
}
