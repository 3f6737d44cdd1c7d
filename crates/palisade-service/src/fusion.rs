//! SandboxFusion compatibility (`POST /run_code`): its request and its response shape, so that
//! clients written for it (veRL's reward path and tools) work with the URL pointed at palisade.
//! Field names and status values follow SandboxFusion's `RunCodeRequest`/`RunCodeResponse`:
//! `status` is `Success`, `Failed` or `SandboxError`; each stage's `status` is `Finished`,
//! `TimeLimitExceeded` or `Error`; a program killed by a signal has a negative `return_code`, as
//! Python's subprocess reports it.
//!
//! Differences, on purpose: unknown fields and paths that are absolute or hold `..` are refused
//! (4xx naming the field) instead of ignored or followed; limits above the server's ceiling are
//! refused; the full palisade report comes along under `palisade`.

use crate::api::{self, Content, RunRequest, RunResult, RunStatus, Stage};
use crate::ServiceError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// SandboxFusion's `RunCodeRequest`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(non_snake_case)]
pub struct RunCodeRequest {
    /// Seconds for the compile stage (compiled languages).
    #[serde(default = "ten")]
    pub compile_timeout: f64,
    /// Seconds for the run.
    #[serde(default = "ten")]
    pub run_timeout: f64,
    /// Memory in MiB; -1: the server's default.
    #[serde(default = "minus_one")]
    pub memory_limit_MB: i64,
    /// The code.
    pub code: String,
    /// Standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The language (`python`, `cpp`, `nodejs`, `go`, `rust`, `bash`, …).
    pub language: String,
    /// Files to write first: relative path → base64 content (`null` entries are skipped).
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    /// Files to read back after the run (relative paths).
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Extra arguments for the program.
    #[serde(default)]
    pub args: Vec<String>,
}

fn ten() -> f64 {
    10.0
}
fn minus_one() -> i64 {
    -1
}

/// SandboxFusion's `CommandRunResult`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct CommandRunResult {
    /// `Finished`, `TimeLimitExceeded` or `Error`.
    pub status: String,
    /// Seconds.
    pub execution_time: Option<f64>,
    /// The exit code; negative for a signal; null on a timeout.
    pub return_code: Option<i32>,
    /// Standard output (invalid UTF-8 replaced).
    pub stdout: Option<String>,
    /// Standard error.
    pub stderr: Option<String>,
}

/// palisade's own part of a `/run_code` answer: the status in palisade's vocabulary, what failed,
/// the files not read back, and the report, written as the run made it (not first made into JSON
/// values: veRL's reward path sends every generated program here).
#[derive(Debug, Clone, Serialize)]
pub struct PalisadeResult {
    pub status: RunStatus,
    pub error: Option<crate::ServiceError>,
    pub file_errors: BTreeMap<String, String>,
    pub report: Option<crate::api::RunReport>,
}

/// SandboxFusion's `RunCodeResponse`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunCodeResponse {
    /// `Success`, `Failed` or `SandboxError`.
    pub status: String,
    /// What went wrong, for `SandboxError`.
    pub message: String,
    /// The compile stage.
    pub compile_result: Option<CommandRunResult>,
    /// The run stage (absent when the compile failed).
    pub run_result: Option<CommandRunResult>,
    /// Always null here.
    pub executor_pod_name: Option<String>,
    /// Files fetched back: path → base64.
    pub files: BTreeMap<String, String>,
    /// palisade's own result (status in palisade's vocabulary, the report).
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub palisade: Option<PalisadeResult>,
}

/// Translates the request, checking what SandboxFusion would not.
pub fn to_run(r: &RunCodeRequest, langs: &[crate::lang::Lang]) -> Result<RunRequest, ServiceError> {
    let secs = |field: &str, v: f64| -> Result<u64, ServiceError> {
        if !v.is_finite() || v <= 0.0 || v > 7.0 * 24.0 * 3600.0 {
            return Err(ServiceError::invalid(
                field,
                v.to_string(),
                "a positive number of seconds",
            ));
        }
        Ok(((v * 1000.0).ceil() as u64).max(1))
    };
    let run_ms = secs("run_timeout", r.run_timeout)?;
    let compile_ms = secs("compile_timeout", r.compile_timeout)?;
    let memory = match r.memory_limit_MB {
        -1 => None,
        m if m > 0 => Some((m as u64).saturating_mul(1 << 20)),
        m => {
            return Err(ServiceError::invalid(
                "memory_limit_MB",
                m.to_string(),
                "a positive number of MiB, or -1 for the server's default",
            ))
        }
    };
    let mut files = BTreeMap::new();
    for (p, c) in &r.files {
        if let Some(c) = c {
            files.insert(p.clone(), Content::Base64 { base64: c.clone() });
        }
    }
    Ok(RunRequest {
        language: Some(r.language.clone()),
        code: Some(r.code.clone()),
        args: r.args.clone(),
        stdin: r.stdin.clone().filter(|s| !s.is_empty()).map(Content::Text),
        files,
        fetch: r.fetch_files.clone(),
        limits: api::Limits {
            timeout_ms: Some(run_ms),
            memory_bytes: memory,
            ..Default::default()
        },
        // SandboxFusion sends a compile timeout for every language; only a compiled one has the stage.
        compile: crate::lang::find(langs, &r.language)
            .is_some_and(|l| l.compile.is_some())
            .then_some(api::StageLimits {
                timeout_ms: Some(compile_ms),
                output_bytes: None,
            }),
        ..Default::default()
    })
}

impl crate::Service {
    /// `POST /run_code`.
    /// The answer holds the run's bytes against the server's budget (see [`crate::budget`]).
    pub async fn run_code(
        &self,
        req: RunCodeRequest,
    ) -> Result<crate::budget::Charged<RunCodeResponse>, ServiceError> {
        let run = to_run(&req, &self.inner.langs)?;
        let r = self.run(run).await?;
        let answer = from_run(&r);
        Ok(crate::budget::Charged::new(answer, r.into_parts().1))
    }
}

fn stage(s: &Stage) -> CommandRunResult {
    let text = |d: &api::Data| String::from_utf8_lossy(&d.decode()).into_owned();
    let (status, code) = match s.status {
        RunStatus::Ok | RunStatus::Exit => ("Finished", s.exit_code),
        RunStatus::Signal => ("Finished", s.signal.map(|x| -x)),
        // Killed by palisade at the memory ceiling or the output cap: as SIGKILL.
        RunStatus::Oom | RunStatus::OutputLimit => ("Finished", Some(-9)),
        RunStatus::Timeout | RunStatus::CpuTimeout => ("TimeLimitExceeded", None),
        RunStatus::PolicyDenied | RunStatus::SandboxError => ("Error", None),
    };
    CommandRunResult {
        status: status.into(),
        execution_time: Some(s.wall_time_ms / 1000.0),
        return_code: code,
        stdout: Some(text(&s.stdout)),
        stderr: Some(text(&s.stderr)),
    }
}

/// Translates a result into SandboxFusion's response.
pub fn from_run(r: &RunResult) -> RunCodeResponse {
    let compile_result = r.compile.as_ref().map(stage);
    let compile_ok = r.compile.as_ref().is_none_or(|c| c.status == RunStatus::Ok);
    let run_result = if r.status == RunStatus::SandboxError || !compile_ok {
        None
    } else {
        Some(stage(&Stage {
            status: r.status,
            exit_code: r.exit_code,
            signal: r.signal,
            wall_time_ms: r.wall_time_ms,
            cpu_time_ms: None,
            oom_kills: None,
            cut_by_server: r.cut_by_server,
            stdout: r.stdout.clone(),
            stderr: r.stderr.clone(),
        }))
    };
    let (status, message) = match r.status {
        RunStatus::SandboxError | RunStatus::PolicyDenied => (
            "SandboxError",
            r.error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_else(|| "sandbox error".into()),
        ),
        RunStatus::Ok if compile_ok => ("Success", String::new()),
        _ => ("Failed", String::new()),
    };
    let files = r
        .files
        .iter()
        .map(|(k, v)| {
            use base64::Engine;
            (
                k.clone(),
                base64::engine::general_purpose::STANDARD.encode(v.decode()),
            )
        })
        .collect();
    RunCodeResponse {
        status: status.into(),
        message,
        compile_result,
        run_result,
        executor_pod_name: None,
        files,
        palisade: Some(PalisadeResult {
            status: r.status,
            error: r.error.clone(),
            file_errors: r.file_errors.clone(),
            report: r.report.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_translates_and_bad_values_are_named() {
        let r: RunCodeRequest = serde_json::from_str(r#"{"code":"print(1)","language":"python","stdin":"","files":{"a.txt":"aGk=","skip":null},"fetch_files":["out"]}"#).unwrap();
        let run = to_run(&r, crate::lang::ALL).unwrap();
        assert_eq!(run.compile, None);
        assert_eq!(run.limits.timeout_ms, Some(10_000));
        assert_eq!(run.stdin, None);
        assert_eq!(run.files.len(), 1);
        let bad: RunCodeRequest =
            serde_json::from_str(r#"{"code":"","language":"python","run_timeout":-1}"#).unwrap();
        assert_eq!(
            to_run(&bad, crate::lang::ALL).unwrap_err().field.as_deref(),
            Some("run_timeout")
        );
        let bad: RunCodeRequest =
            serde_json::from_str(r#"{"code":"","language":"python","memory_limit_MB":0}"#).unwrap();
        assert_eq!(
            to_run(&bad, crate::lang::ALL).unwrap_err().field.as_deref(),
            Some("memory_limit_MB")
        );
        assert!(serde_json::from_str::<RunCodeRequest>(
            r#"{"code":"","language":"python","nope":1}"#
        )
        .is_err());
    }

    #[test]
    fn statuses_map_to_sandboxfusions() {
        let st = |status, code, signal| Stage {
            status,
            exit_code: code,
            signal,
            wall_time_ms: 1500.0,
            cpu_time_ms: None,
            oom_kills: None,
            cut_by_server: false,
            stdout: api::Data::new(b"x".to_vec(), false),
            stderr: api::Data::default(),
        };
        assert_eq!(
            stage(&st(RunStatus::Ok, Some(0), None)).return_code,
            Some(0)
        );
        assert_eq!(
            stage(&st(RunStatus::Signal, None, Some(11))).return_code,
            Some(-11)
        );
        let t = stage(&st(RunStatus::Timeout, None, None));
        assert_eq!(
            (t.status.as_str(), t.return_code),
            ("TimeLimitExceeded", None)
        );
        assert_eq!(t.execution_time, Some(1.5));
    }
}
