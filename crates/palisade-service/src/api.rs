//! Request and response types. Serde for the wire (unknown fields refused), schemars for the
//! OpenAPI document the HTTP front end serves, so the document is the types.

use crate::proto::Entry;
use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// File or stdin content: a UTF-8 string, or `{"base64": "..."}` for bytes.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(untagged)]
pub enum Content {
    /// UTF-8 text, as is.
    Text(String),
    /// Bytes, base64 encoded (standard alphabet, padded).
    Base64 {
        /// The bytes in base64.
        base64: String,
    },
}

impl Content {
    /// The bytes, or the error naming `field`.
    pub fn bytes(&self, field: &str) -> Result<Vec<u8>, crate::ServiceError> {
        match self {
            Content::Text(s) => Ok(s.as_bytes().to_vec()),
            Content::Base64 { base64 } => base64::engine::general_purpose::STANDARD
                .decode(base64)
                .map_err(|e| {
                    crate::ServiceError::invalid(
                        field,
                        base64.as_str(),
                        format!("standard base64 ({e})"),
                    )
                }),
        }
    }
}

/// Limits a request may ask for; each at most the server's ceiling, which is also the default.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock limit of the run (of each stage), in milliseconds.
    pub timeout_ms: Option<u64>,
    /// CPU time of all processes together, in milliseconds.
    pub cpu_time_ms: Option<u64>,
    /// Memory of the whole sandbox, in bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// stdout plus stderr, in bytes, of the run (of each stage).
    pub output_bytes: Option<u64>,
    /// Open files per process.
    pub open_files: Option<u64>,
    /// Largest file a process may write, in bytes.
    pub file_size_bytes: Option<u64>,
    /// Size of `/tmp`, in bytes.
    pub tmp_bytes: Option<u64>,
    /// Size of the working directory's tmpfs, in bytes.
    pub scratch_bytes: Option<u64>,
    /// CPU share, in CPUs (0.5 = half a CPU).
    pub cpus: Option<f64>,
}

/// Limits of the compile stage.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StageLimits {
    /// Wall-clock limit of the stage, in milliseconds (at most the ceiling's timeout).
    pub timeout_ms: Option<u64>,
    /// stdout plus stderr of the stage, in bytes.
    pub output_bytes: Option<u64>,
}

/// `POST /v1/run`: one program in a fresh sandbox.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The program and its arguments (looked up in the sandbox's `PATH`). Either this or
    /// `language` and `code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The language of `code`: see `GET /v1/languages` for those this server has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Source code, written to the language's main file in the working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Extra arguments for the program built from `code`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<Content>,
    /// Files written into the working directory before the run: relative path → content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Content>,
    /// Files read back after the run (relative paths; regular files only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetch: Vec<String>,
    /// Variables set inside (name → value). Nothing of the server's own environment is passed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Limits of the run, within the server's ceiling.
    #[serde(default)]
    pub limits: Limits,
    /// Limits of the compile stage (compiled languages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<StageLimits>,
    /// Egress allow rules, each one of the server's own allow rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_net: Vec<String>,
}

/// How a run ended, in one vocabulary for every front end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Exit code 0.
    Ok,
    /// A non-zero exit code.
    Exit,
    /// Killed by a signal (not by palisade).
    Signal,
    /// Killed at the wall-clock limit.
    Timeout,
    /// Killed when the CPU time was used up.
    CpuTimeout,
    /// Killed by the OOM killer at the memory ceiling.
    Oom,
    /// Killed at the output cap.
    OutputLimit,
    /// Refused before it started: the request asked for more than the server allows.
    PolicyDenied,
    /// palisade failed; the program's result is unknown (or it never ran).
    SandboxError,
}

impl RunStatus {
    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Exit => "exit",
            RunStatus::Signal => "signal",
            RunStatus::Timeout => "timeout",
            RunStatus::CpuTimeout => "cpu-timeout",
            RunStatus::Oom => "oom",
            RunStatus::OutputLimit => "output-limit",
            RunStatus::PolicyDenied => "policy-denied",
            RunStatus::SandboxError => "sandbox-error",
        }
    }

    /// Every status, for metrics.
    pub const ALL: [RunStatus; 9] = [
        RunStatus::Ok,
        RunStatus::Exit,
        RunStatus::Signal,
        RunStatus::Timeout,
        RunStatus::CpuTimeout,
        RunStatus::Oom,
        RunStatus::OutputLimit,
        RunStatus::PolicyDenied,
        RunStatus::SandboxError,
    ];
}

/// Bytes a program wrote, or a file read back.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Data {
    /// The bytes: as text when they are UTF-8, else base64.
    pub data: String,
    /// `utf-8` or `base64`.
    pub encoding: String,
    /// Number of bytes.
    pub bytes: u64,
    /// Bytes past the cap were discarded.
    pub truncated: bool,
}

impl Data {
    /// Encodes `b`: as text when it is UTF-8 whose JSON string is at most twice its size, else
    /// base64 (a third larger). Control bytes cost six bytes each in a JSON string (`\u0001`):
    /// output of them as text would make a reply six times its output.
    pub fn new(b: Vec<u8>, truncated: bool) -> Data {
        let bytes = b.len() as u64;
        let text: Result<String, Vec<u8>> = if json_escaped_len(&b) <= 2 * b.len() {
            String::from_utf8(b).map_err(|e| e.into_bytes())
        } else {
            Err(b)
        };
        match text {
            Ok(s) => Data {
                data: s,
                encoding: "utf-8".into(),
                bytes,
                truncated,
            },
            Err(b) => Data {
                data: base64::engine::general_purpose::STANDARD.encode(b),
                encoding: "base64".into(),
                bytes,
                truncated,
            },
        }
    }

    /// The bytes back.
    pub fn decode(&self) -> Vec<u8> {
        if self.encoding == "base64" {
            base64::engine::general_purpose::STANDARD
                .decode(&self.data)
                .unwrap_or_default()
        } else {
            self.data.as_bytes().to_vec()
        }
    }
}

/// The length of `b` as the body of a JSON string (serde_json's escapes).
pub fn json_escaped_len(b: &[u8]) -> usize {
    b.iter()
        .map(|&c| match c {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// One stage (compile or run) of a run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Stage {
    /// How the stage ended.
    pub status: RunStatus,
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    /// Wall-clock time of the stage, in milliseconds.
    pub wall_time_ms: f64,
    /// CPU time (user and system) of the program and of the processes it waited for, in
    /// milliseconds (processes it left running and that were killed at its end are not in it);
    /// `null` when unknown.
    #[serde(default)]
    pub cpu_time_ms: Option<f64>,
    /// In a session: OOM kills the session's cgroup counted while this exec ran. The cgroup is
    /// the session's, so with other execs running at the same time a kill counted here may have
    /// been of one of theirs. `null` outside sessions.
    #[serde(default)]
    pub oom_kills: Option<u64>,
    /// Standard output.
    pub stdout: Data,
    /// Standard error.
    pub stderr: Data,
    /// The output was cut (`output-limit`) because the server held its budget of bytes for
    /// replies (`--max-held`), not at this stage's own cap; retry later.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_by_server: bool,
}

/// palisade's report of a run, kept as the run made it and written out once, with the answer.
/// A server answers every request with one: made into a tree of JSON values first, then written
/// and dropped, it cost more instructions than the rest of the request's handling.
#[derive(Debug, Clone)]
pub struct RunReport(std::sync::Arc<palisade::Report>);

impl RunReport {
    pub fn new(report: palisade::Report) -> RunReport {
        RunReport(std::sync::Arc::new(report))
    }

    /// The report itself.
    pub fn get(&self) -> &palisade::Report {
        &self.0
    }

    /// The report as JSON values, for a reader that looks its fields up by name.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(&*self.0).unwrap_or(serde_json::Value::Null)
    }
}

impl Serialize for RunReport {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The answer to `POST /v1/run` (and one line of a batch).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunResult {
    /// How the run ended. `sandbox-error` is never the program's result.
    pub status: RunStatus,
    /// The program's exit code.
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Wall-clock time of the program (the run stage), in milliseconds.
    pub wall_time_ms: f64,
    /// Standard output of the program.
    pub stdout: Data,
    /// Standard error of the program.
    pub stderr: Data,
    /// The compile stage, for compiled languages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile: Option<Stage>,
    /// Files read back: path → content.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Data>,
    /// Files that could not be read back: path → why (`not-found`, `symlink`, `not-regular`,
    /// `too-large`, `busy`: the server held its budget of bytes for replies, `--max-held`;
    /// `oom`: the OOM killer took the sandbox's agent before they could be read,
    /// or `not-fetched`: the sandbox was gone before they could be read for another reason).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub file_errors: BTreeMap<String, String>,
    /// What failed, for `sandbox-error` and `policy-denied`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ServiceError>,
    /// palisade's full report of the sandbox (docs/report): layers, resources, denied calls and
    /// connections.
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub report: Option<RunReport>,
    /// The output was cut (`output-limit`) because the server held its budget of bytes for
    /// replies (`--max-held`), not at the run's own cap; retry later.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cut_by_server: bool,
}

/// `POST /v1/run/batch`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The runs; each line of the answer names its index here.
    pub runs: Vec<RunRequest>,
    /// How many of them run at once (at most the server's concurrency).
    #[serde(default)]
    pub concurrency: Option<usize>,
}

/// One NDJSON line of a batch's answer, in order of completion.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BatchLine {
    /// Index of the run in the request.
    pub index: usize,
    /// Its result.
    pub result: RunResult,
}

/// A language this server runs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Language {
    /// Its name in requests.
    pub name: String,
    /// The compiler or interpreter used.
    pub tool: String,
    /// Compiled first (a compile stage).
    pub compiled: bool,
}

/// `POST /v1/sandboxes`: a session, a sandbox that lives across calls.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Seconds the session lives at most (at most the server's session TTL).
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Seconds without a call after which it is destroyed.
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    /// Limits of the whole session (memory, pids, cpu time… hold across all its execs together).
    #[serde(default)]
    pub limits: Limits,
    /// Egress allow rules, each one of the server's own.
    #[serde(default)]
    pub allow_net: Vec<String>,
    /// Variables set for every exec.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free labels, returned as given.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A second create with the same key returns the first session instead of a new one.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// A host directory to work on (absolute, at or under one of the server's
    /// `--workspace-root`s): seen at `/workspace` through a copy-on-write overlay, never written
    /// while the session lives. When the session ends its changes are kept as a change set
    /// (`GET /v1/changes`), to review and apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// A session as `GET /v1/sandboxes/{id}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    /// Its id.
    pub id: String,
    /// Labels, as given.
    pub labels: BTreeMap<String, String>,
    /// Seconds since it was created.
    pub age_s: f64,
    /// Seconds until its TTL.
    pub expires_in_s: f64,
    /// Idle timeout, in seconds.
    pub idle_timeout_s: u64,
    /// Execs started so far.
    pub execs: u64,
    /// Execs running now.
    pub running: Vec<u64>,
    /// The idempotency key it was created with.
    pub idempotency_key: Option<String>,
    /// The host directory it works on, when it was created on a workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Standard input (for a background exec, more can be sent later).
    #[serde(default)]
    pub stdin: Option<Content>,
    /// Variables for this exec, on top of the session's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory, relative to the session's.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Wall-clock limit, in milliseconds (at most the ceiling's timeout).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// stdout plus stderr kept, in bytes (at most the ceiling's output limit).
    #[serde(default)]
    pub output_bytes: Option<u64>,
    /// `sync` (default: answer when it ends), `stream` (NDJSON events as it runs), `sse`
    /// (server-sent events), or `background` (answer at once with the exec id).
    #[serde(default)]
    pub mode: Option<String>,
}

/// An exec's state (`GET /v1/sandboxes/{id}/exec/{exec}`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExecInfo {
    /// The exec's id in its session.
    pub id: u64,
    /// Still running.
    pub running: bool,
    /// The result once it ended.
    pub result: Option<Stage>,
}

/// One event of a streamed exec.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The exec started.
    Start {
        /// Its id.
        id: u64,
    },
    /// Bytes on stdout.
    Stdout {
        /// The bytes.
        data: Data,
    },
    /// Bytes on stderr.
    Stderr {
        /// The bytes.
        data: Data,
    },
    /// The end (the stage's stdout and stderr are empty here: they came as events).
    Exit {
        /// How it ended.
        result: Stage,
    },
}

/// `POST /v1/sandboxes/{id}/exec/{exec}/signal`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal number (e.g. 15 for SIGTERM, 9 for SIGKILL) or name (`SIGTERM`, `TERM`).
    pub signal: serde_json::Value,
}

/// A directory listing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Listing {
    /// The directory, relative to the working directory.
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<Entry>,
    /// Whether entries were left out: a listing holds the first entries by name that fit in the
    /// agent's reply (64 KiB of JSON, some 1500 entries of 20-byte names; 100 000 names read at
    /// most); list a subdirectory, or fetch an archive, for the rest.
    #[serde(default)]
    pub truncated: bool,
}

/// The error body of every 4xx/5xx answer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: crate::ServiceError,
}

/// `POST /v1/sandboxes/{id}/contexts`: a context of the code interpreter, a persistent
/// interpreter whose variables live from one cell to the next.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextRequest {
    /// The language of its cells: `python` (the only one so far).
    #[serde(default)]
    pub language: Option<String>,
    /// Its working directory, relative to the session's.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables for its interpreter, on top of the session's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A context of the code interpreter.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ContextInfo {
    /// Its id (`default` for the one cells run in when they name none).
    pub id: String,
    /// The language of its cells.
    pub language: String,
    /// Its working directory, relative to the session's (empty: the session's).
    pub cwd: String,
    /// Cells evaluated in it so far.
    pub cells: u64,
    /// Whether its interpreter is running (one starts at the next cell otherwise).
    pub alive: bool,
}

/// `POST /v1/sandboxes/{id}/run_code`: one cell for the code interpreter.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CellRequest {
    /// The source of the cell (at most 1 MiB). The value of its last expression is returned.
    pub code: String,
    /// The context to run it in (default: the session's `default` context, made on first use).
    #[serde(default)]
    pub context: Option<String>,
    /// The language: `python`.
    #[serde(default)]
    pub language: Option<String>,
    /// Wall-clock limit of the cell, in milliseconds (at most the ceiling's timeout); past it the
    /// interpreter is killed and the context starts afresh at its next cell.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// stdout plus stderr kept, in bytes (default 1 MiB, at most the ceiling's output limit);
    /// also the most kept of the value and of the traceback.
    #[serde(default)]
    pub output_bytes: Option<u64>,
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CellStatus {
    /// It ran to its end.
    Ok,
    /// It raised: see `error`.
    Error,
    /// It ran past its timeout; the interpreter was killed (the context's state is lost).
    Timeout,
    /// The interpreter ended during the cell (exit, signal, memory ceiling); the state is lost.
    Exited,
}

/// An error a cell raised.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CellError {
    /// The exception's type name (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The formatted traceback, from the cell's own frames.
    pub traceback: String,
}

/// The answer to `POST /v1/sandboxes/{id}/run_code`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CellResult {
    /// The context it ran in.
    pub context: String,
    /// Its number in the context's current interpreter (1 after a fresh start).
    pub execution_count: u64,
    /// How it ended.
    pub status: CellStatus,
    /// What it (and the processes it started) wrote to stdout.
    pub stdout: Data,
    /// What it wrote to stderr.
    pub stderr: Data,
    /// `repr()` of its last expression, when that was an expression whose value is not `None`.
    pub value: Option<String>,
    /// The error it raised.
    pub error: Option<CellError>,
    /// Wall-clock time of the cell, in milliseconds.
    pub wall_time_ms: f64,
    /// A new interpreter was started for this cell (the first, or after a timeout or an exit).
    pub restarted: bool,
}

/// An entry of a change set that an apply held back.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct HeldChange {
    /// Its path in the project, in the form `changes` shows (empty: the change set as a whole).
    pub path: String,
    /// What holds it: `refused` (never applied), `conflict` (changed in the project since the
    /// session began; `force` overrides), `protected` (applied only when named in `paths`),
    /// `risky` (`include_risky`, or named), `other`.
    pub kind: String,
    /// Why.
    pub reason: String,
}

/// A change set a workspace session of this server left (`GET /v1/changes`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChangeSetInfo {
    /// Its id.
    pub id: String,
    /// The session that made it.
    pub session: String,
    /// The project directory.
    pub dir: String,
    /// When it was made, seconds since the epoch.
    pub created: u64,
    /// Bytes of new contents.
    pub bytes: u64,
    /// How the session's sandbox ended (`status`, `exit_code`).
    #[schemars(with = "BTreeMap<String, serde_json::Value>")]
    pub run: serde_json::Value,
    /// Counts by kind of change, bytes, and the first paths (as in the report's `workspace`).
    #[schemars(with = "BTreeMap<String, serde_json::Value>")]
    pub summary: serde_json::Value,
    /// Set when the capture stopped at a bound: it cannot be applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// When and how much of it was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub applied: Option<serde_json::Value>,
}

/// `GET /v1/changes/{id}`: what `palisade changes ID --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChangeSetDoc {
    /// The change set's record (`meta.json`: the project directory, when the session began, how
    /// it ended, its protected paths, a summary, renames).
    #[schemars(with = "BTreeMap<String, serde_json::Value>")]
    pub change_set: serde_json::Value,
    /// Every changed path, a directory before what is in it: `path`, `change` (`added`,
    /// `modified`, `mode`, `deleted`, `replaced`), `kind`, `mode`, `size`, `sha256`, `target`,
    /// and `refused`, `conflict`, `protected`, `risky` when they hold it back (docs/workspace.md).
    #[schemars(with = "Vec<BTreeMap<String, serde_json::Value>>")]
    pub entries: Vec<serde_json::Value>,
}

/// `POST /v1/changes/{id}/diff`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffRequest {
    /// Only these paths and what is under them (relative to the project, as `changes` shows
    /// them); none: all.
    #[serde(default)]
    pub paths: Vec<String>,
}

/// A change set's diff.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DiffResult {
    /// The unified diff in git's format (`git apply` takes it); text when it is UTF-8.
    pub diff: Data,
    /// Files in it.
    pub files: u64,
    /// Of which summarized as binary (or over 8 MiB).
    pub binary: u64,
    /// What it cannot show (refused entries, special files, modes git cannot say) and entries in
    /// conflict.
    pub warnings: Vec<String>,
}

/// `POST /v1/changes/{id}/apply`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// Only these paths and what is under them (as `changes` shows them); none: all of it.
    /// Naming a protected or risky path (or one inside it) is what allows it.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Leave these paths and what is under them out.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Overwrite what changed in the project since the session began.
    #[serde(default)]
    pub force: bool,
    /// Apply files that host tools run or load later without asking (rc files, hooks,
    /// environments, package-manager and editor settings) without naming each.
    #[serde(default)]
    pub include_risky: bool,
}

/// What an apply did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AppliedResult {
    /// The change set.
    pub id: String,
    /// The project directory it was applied to.
    pub dir: String,
    /// Entries applied.
    pub entries: u64,
    /// Bytes written.
    pub bytes: u64,
    /// The first paths applied.
    pub first_paths: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::Data;

    /// Text stays text, whatever its lines; output of control bytes, which JSON would escape to
    /// six times their size, and bytes that are not UTF-8 go as base64; each decodes back.
    #[test]
    fn data_is_text_unless_its_json_would_be_more_than_twice_its_size() {
        for (b, enc) in [
            (b"hello\n".to_vec(), "utf-8"),
            (b"\n\n\n\n\t\"\\".to_vec(), "utf-8"),
            ("héllo wörld".as_bytes().to_vec(), "utf-8"),
            (vec![1u8; 4096], "base64"),
            (b"ab\x01\x02".to_vec(), "base64"),
            (vec![0xffu8, 0xfe], "base64"),
        ] {
            let d = Data::new(b.clone(), false);
            assert_eq!(d.encoding, enc, "{b:?}");
            assert_eq!(d.decode(), b);
            let json = serde_json::to_string(&d.data).unwrap();
            assert!(
                json.len() <= 2 * b.len() + 4,
                "{} for {}",
                json.len(),
                b.len()
            );
        }
    }
}
