//! The one error type of the service: a stable code, the field it is about, what was given and
//! what is accepted. Front ends map [`ServiceError::class`] to their own status (HTTP 4xx/5xx).

use serde::Serialize;

/// What kind of failure, for the front end's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Class {
    /// The request is malformed or names something unknown (HTTP 400).
    BadRequest,
    /// The request asks for more than the server's ceiling allows (HTTP 403).
    Denied,
    /// No such session or exec (HTTP 404).
    NotFound,
    /// The session is gone: past its TTL, idle timeout, or deleted (HTTP 410).
    Gone,
    /// The request conflicts with the state of the session (HTTP 409).
    Conflict,
    /// The body is larger than the server accepts (HTTP 413).
    TooLarge,
    /// The queue is full: try again later (HTTP 429 with Retry-After).
    Busy,
    /// The server is shutting down (HTTP 503).
    Unavailable,
    /// palisade failed on the server's side (HTTP 500).
    #[default]
    Internal,
}

/// An error a caller can act on.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    /// A stable code: `invalid-json`, `invalid`, `unknown-field`, `unknown-language`,
    /// `ceiling`, `not-allowed`, `not-found`, `gone`, `conflict`, `held`, `too-large`, `busy`,
    /// `shutting-down`, `file`, `internal`.
    pub code: &'static str,
    /// The request field it is about (`limits.memory_bytes`, `files["../x"]`), when one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What was given, when it can be shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What is accepted: the server's limit, or the allowed values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<String>,
    /// For people.
    pub message: String,
    /// Seconds to wait before trying again (`busy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// `held` (an apply of a change set refused as a whole): how many entries were held back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_count: Option<u64>,
    /// `held`: the first entries held back (at most 50), each with what holds it and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<crate::api::HeldChange>,
    #[serde(skip)]
    #[schemars(skip)]
    pub class: Class,
}

impl ServiceError {
    fn new(class: Class, code: &'static str, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            field: None,
            value: None,
            accepted: None,
            message: message.into(),
            retry_after: None,
            held_count: None,
            held: Vec::new(),
            class,
        }
    }

    /// A malformed value in `field`.
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<String>,
        accepted: impl Into<String>,
    ) -> ServiceError {
        let (field, value, accepted) = (field.into(), value.into(), accepted.into());
        let shown = crate::shorten(&value, 200);
        ServiceError {
            field: Some(field.clone()),
            value: Some(shown.clone()),
            accepted: Some(accepted.clone()),
            ..Self::new(
                Class::BadRequest,
                "invalid",
                format!("invalid {field} `{shown}`: expected {accepted}"),
            )
        }
    }

    /// The body is not JSON of the expected shape; `path` is where serde stopped.
    pub fn json(path: &str, err: &serde_json::Error) -> ServiceError {
        let msg = err.to_string();
        let code = if msg.starts_with("unknown field") {
            "unknown-field"
        } else {
            "invalid-json"
        };
        let field = (!path.is_empty() && path != ".").then(|| path.to_owned());
        ServiceError {
            field: field.clone(),
            ..Self::new(
                Class::BadRequest,
                code,
                match field {
                    Some(f) => format!("{f}: {msg}"),
                    None => msg,
                },
            )
        }
    }

    /// A value above the server's ceiling.
    pub fn ceiling(
        field: &str,
        asked: impl std::fmt::Display,
        limit: impl std::fmt::Display,
    ) -> ServiceError {
        ServiceError {
            field: Some(field.to_owned()),
            value: Some(asked.to_string()),
            accepted: Some(format!("at most {limit} (the server's ceiling)")),
            ..Self::new(
                Class::Denied,
                "ceiling",
                format!("{field} {asked} is above the server's ceiling of {limit}"),
            )
        }
    }

    /// Something the server's policy does not permit at all.
    pub fn not_allowed(
        field: &str,
        value: impl Into<String>,
        accepted: impl Into<String>,
    ) -> ServiceError {
        let (value, accepted) = (value.into(), accepted.into());
        ServiceError {
            field: Some(field.to_owned()),
            value: Some(crate::shorten(&value, 200)),
            accepted: Some(accepted.clone()),
            ..Self::new(
                Class::Denied,
                "not-allowed",
                format!(
                    "{field} `{}` is not permitted by the server's policy: {accepted}",
                    crate::shorten(&value, 200)
                ),
            )
        }
    }

    /// No such thing.
    pub fn not_found(field: &str, value: &str) -> ServiceError {
        ServiceError {
            field: Some(field.to_owned()),
            value: Some(crate::shorten(value, 200)),
            ..Self::new(
                Class::NotFound,
                "not-found",
                format!("no {field} `{}`", crate::shorten(value, 200)),
            )
        }
    }

    /// The session is over.
    pub fn gone(id: &str, why: &str) -> ServiceError {
        ServiceError {
            field: Some("session".into()),
            value: Some(id.to_owned()),
            ..Self::new(Class::Gone, "gone", format!("session {id} is gone: {why}"))
        }
    }

    /// A background exec whose result the session no longer keeps.
    pub fn result_dropped(exec: u64, why: &str) -> ServiceError {
        ServiceError {
            field: Some("exec".into()),
            value: Some(exec.to_string()),
            ..Self::new(
                Class::Gone,
                "gone",
                format!("the result of exec {exec} was dropped: {why}"),
            )
        }
    }

    /// A conflict with the current state.
    pub fn conflict(field: &str, message: impl Into<String>) -> ServiceError {
        ServiceError {
            field: Some(field.to_owned()),
            ..Self::new(Class::Conflict, "conflict", message)
        }
    }

    /// The body is too large.
    pub fn too_large(limit: usize) -> ServiceError {
        ServiceError {
            accepted: Some(format!("at most {limit} bytes")),
            ..Self::new(
                Class::TooLarge,
                "too-large",
                format!("the request body is over the server's limit of {limit} bytes"),
            )
        }
    }

    /// The queue is full.
    pub fn busy(queued: usize) -> ServiceError {
        ServiceError {
            retry_after: Some(1),
            ..Self::new(Class::Busy, "busy", format!("the server is busy: {queued} requests are already running or waiting; retry later"))
        }
    }

    /// The server holds its budget of reply bytes (`--max-held`) or more: `busy`, retry later.
    pub fn held_full(held: u64, limit: u64) -> ServiceError {
        ServiceError {
            retry_after: Some(1),
            field: Some("--max-held".into()),
            accepted: Some(format!("at most {limit} bytes held for replies at once")),
            ..Self::new(
                Class::Busy,
                "busy",
                format!("the server is busy: it holds {held} bytes of output and files for replies not yet taken (its --max-held is {limit}); retry later"),
            )
        }
    }

    /// The server is stopping.
    pub fn shutting_down() -> ServiceError {
        Self::new(
            Class::Unavailable,
            "shutting-down",
            "the server is shutting down",
        )
    }

    /// A file operation inside the sandbox failed (the agent's code: `not-found`, `symlink`,
    /// `not-regular`, `too-large`, …).
    pub fn file(field: &str, code: &str, message: &str) -> ServiceError {
        let class = match code {
            "not-found" => Class::NotFound,
            // A file over --max-fetch is not a request body over --max-body (413): 400.
            _ => Class::BadRequest,
        };
        ServiceError {
            field: Some(field.to_owned()),
            value: Some(code.to_owned()),
            ..Self::new(
                class,
                "file",
                format!("{field}: {}", crate::shorten(message, 300)),
            )
        }
    }

    /// palisade failed on the server's side.
    pub fn internal(message: impl Into<String>) -> ServiceError {
        Self::new(Class::Internal, "internal", message)
    }

    /// The class, for the front end's status code.
    pub fn class(&self) -> Class {
        self.class
    }
}
