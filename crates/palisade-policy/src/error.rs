use thiserror::Error;

/// A policy value that cannot be used. Each variant names the field as a policy file does
/// (`limits.memory`, `filesystem.rw`), the value and what is accepted, so the message can be
/// shown as it is; a front end with names of its own (the command line's options) maps the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A value outside what the field accepts.
    #[error("invalid {field} `{value}`: expected {expected}")]
    Invalid {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A bind onto a path palisade builds itself.
    #[error("{field} target `{target}` is on or under `{reserved}`, which palisade builds itself; choose another path inside with HOST:INSIDE")]
    Reserved {
        field: &'static str,
        target: String,
        reserved: &'static str,
    },
    /// A value beyond what the caller's [`crate::Bounds`] allow.
    #[error(transparent)]
    Bounds(#[from] crate::BoundsError),
    /// Two binds onto one inside path.
    #[error("bind target `{target}` is given twice (from `{first}` and `{second}`); each inside path takes one bind")]
    DuplicateTarget {
        target: String,
        first: String,
        second: String,
    },
}

impl PolicyError {
    pub(crate) fn invalid(field: &'static str, value: &str, expected: &'static str) -> Self {
        PolicyError::Invalid {
            field,
            value: value.to_owned(),
            expected,
        }
    }

    /// The policy field the error is about, where it is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PolicyError::Invalid { field, .. } | PolicyError::Reserved { field, .. } => Some(field),
            PolicyError::Bounds(b) => Some(b.field),
            PolicyError::DuplicateTarget { .. } => None,
        }
    }

    /// The same error, reported against another field name (e.g. the CLI option).
    pub fn in_field(self, field: &'static str) -> Self {
        match self {
            PolicyError::Invalid {
                value, expected, ..
            } => PolicyError::Invalid {
                field,
                value,
                expected,
            },
            PolicyError::Reserved {
                target, reserved, ..
            } => PolicyError::Reserved {
                field,
                target,
                reserved,
            },
            PolicyError::Bounds(mut b) => {
                b.field = field;
                PolicyError::Bounds(b)
            }
            other => other,
        }
    }
}
