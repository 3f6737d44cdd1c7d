use crate::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// An absolute, normalized path inside the sandbox: starts with `/`, no `.` or `..` components, no
/// empty components, no NUL byte, at most 4095 bytes.
///
/// ```
/// use palisade_policy::SandboxPath;
/// assert_eq!(SandboxPath::new("/data/").unwrap().as_str(), "/data");
/// assert!(SandboxPath::new("/data/../etc").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath(String);

impl SandboxPath {
    /// Validates and normalizes (a trailing `/` is dropped).
    pub fn new(s: &str) -> Result<Self, PolicyError> {
        const EXPECTED: &str = "an absolute path without `.` or `..` components or NUL bytes";
        if !s.starts_with('/') || s.contains('\0') || s.len() > 4095 {
            return Err(PolicyError::invalid("path", s, EXPECTED));
        }
        let mut out = String::with_capacity(s.len());
        for comp in s.split('/').skip(1) {
            match comp {
                "" => continue,
                "." | ".." => return Err(PolicyError::invalid("path", s, EXPECTED)),
                c => {
                    out.push('/');
                    out.push_str(c);
                }
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(SandboxPath(out))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is `prefix` or lies under it, by whole components.
    pub fn starts_with(&self, prefix: &str) -> bool {
        prefix == "/"
            || self.0 == prefix
            || (self.0.starts_with(prefix) && self.0.as_bytes().get(prefix.len()) == Some(&b'/'))
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, PolicyError> {
        SandboxPath::new(&s)
    }
}

impl From<SandboxPath> for String {
    fn from(p: SandboxPath) -> String {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_and_refuses() {
        assert_eq!(SandboxPath::new("//a///b/").unwrap().as_str(), "/a/b");
        assert_eq!(SandboxPath::new("/").unwrap().as_str(), "/");
        for bad in ["", "a/b", "/a/./b", "/a/../b", "/a\0b"] {
            assert!(SandboxPath::new(bad).is_err(), "{bad:?} accepted");
        }
        let p = SandboxPath::new("/procfs").unwrap();
        assert!(!p.starts_with("/proc"));
        assert!(SandboxPath::new("/proc/1").unwrap().starts_with("/proc"));
    }
}
