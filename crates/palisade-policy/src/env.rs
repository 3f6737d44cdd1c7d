use crate::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 255 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EnvName(String);

impl EnvName {
    /// Validates a name.
    pub fn new(s: &str) -> Result<Self, PolicyError> {
        let mut bytes = s.bytes();
        let first_ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_');
        if !first_ok || s.len() > 255 || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(PolicyError::invalid(
                "env.pass",
                s,
                "a name of letters, digits and `_` that does not start with a digit",
            ));
        }
        Ok(EnvName(s.to_owned()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EnvName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for EnvName {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, PolicyError> {
        EnvName::new(&s)
    }
}

impl From<EnvName> for String {
    fn from(n: EnvName) -> String {
        n.0
    }
}

/// One variable set inside the sandbox. Values never come from the host implicitly: a name
/// passed alone (`env.pass`) is resolved once, by the caller, into an explicit value
/// ([`crate::Policy::resolve_env`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: EnvName,
    pub value: String,
}

impl EnvVar {
    /// Parses `NAME=VALUE`.
    ///
    /// ```
    /// use palisade_policy::EnvVar;
    /// let v = EnvVar::parse("MODE=fast").unwrap();
    /// assert_eq!((v.name.as_str(), v.value.as_str()), ("MODE", "fast"));
    /// assert!(EnvVar::parse("1BAD=x").is_err());
    /// ```
    pub fn parse(spec: &str) -> Result<EnvVar, PolicyError> {
        let Some((n, v)) = spec.split_once('=') else {
            return Err(PolicyError::invalid("env.set", spec, "NAME=VALUE"));
        };
        EnvVar::new(n, v)
    }

    /// Builds a variable from a name and a value.
    pub fn new(name: &str, value: &str) -> Result<EnvVar, PolicyError> {
        if value.contains('\0') {
            return Err(PolicyError::invalid(
                "env.set",
                name,
                "a value without NUL bytes",
            ));
        }
        Ok(EnvVar {
            name: EnvName::new(name).map_err(|e| e.in_field("env.set"))?,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["A", "_x", "PATH", "a1_B"] {
            assert!(EnvName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A=B", "É"] {
            let e = EnvName::new(bad).unwrap_err().to_string();
            assert!(e.contains("env.pass"), "{e}");
            let e = EnvVar::new(bad, "v").unwrap_err().to_string();
            assert!(e.contains("env.set"), "{e}");
        }
        assert_eq!(EnvVar::parse("A==b").unwrap().value, "=b");
        assert!(EnvVar::parse("NOEQUALS").is_err());
    }
}
