use thiserror::Error;

/// A policy value that cannot be used. Each variant names the field, the value and what is
/// accepted, so the message can be shown to the user as it is.
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
            other => other,
        }
    }
}
