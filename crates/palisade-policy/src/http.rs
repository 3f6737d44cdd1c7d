//! Egress beyond host names: which requests the proxy lets through to an allowed host (HTTP
//! rules), whose TLS it opens to read them (inspection), and credentials it adds to requests for
//! the code, which never holds them (secrets). The decisions are made here, on plain values; the
//! proxy (`palisade-net`) reads the requests.
//!
//! **HTTP rules** (`network.http`, `--http-rule`): `METHODS HOST[:PORT][PATH]`, e.g.
//! `GET,HEAD pypi.org/simple/**`. `METHODS` is a comma-separated list of methods in upper case,
//! `*` for any, or `read-only` (GET, HEAD, OPTIONS). `HOST` is what an allow rule takes (a name,
//! `*.DOMAIN`, an address or a block, an optional port; an IPv4 block in brackets,
//! `[10.0.0.0/8]`, so that its length is not read as the path) or `*` for every host. `PATH` starts with
//! `/`; `*` matches within one segment (`/packages/*.whl`), `**` as a whole segment matches any
//! number of them (`/simple/**`); without a path, every path. A host that no rule names gets any
//! request; a host that some rule names gets only the requests one of its rules allows.
//!
//! **Inspection** (`network.inspect`, `network.no_inspect`): the proxy terminates TLS for a host
//! it inspects, so that it can read (and check) each request. Hosts with HTTP rules or secrets
//! are inspected whatever `inspect` says; `no_inspect` exempts a host (certificate pinning,
//! mutual TLS) and may not name one that HTTP rules or secrets need.
//!
//! **Secrets** (`network.secrets`, `--secret`): `NAME@HOST[:PORT][=SOURCE]`. The value comes
//! from the host (`SOURCE`: `env:VAR`, by default `env:NAME`, or `file:/PATH`), resolved by the
//! caller that owns the environment ([`crate::Policy::resolve_secrets`]), never by this crate.
//! Inside, `$NAME` holds a random placeholder; the proxy puts the value in place of it in the
//! headers of requests to that host (on TLS, port 443 unless given), and refuses a request that
//! carries it anywhere else.

use crate::net::{NetRule, Pattern};
use crate::{EnvName, PolicyError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// At most this many HTTP rules, and entries of `inspect` and `no_inspect` each.
pub const MAX_HTTP_RULES: usize = 256;
/// At most this many secrets.
pub const MAX_SECRETS: usize = 64;
/// Longest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 8192;
/// The methods of the `read-only` preset.
pub const READ_ONLY: [&str; 3] = ["GET", "HEAD", "OPTIONS"];
/// The port a secret's host is reached on unless the secret names one.
pub const SECRET_PORT: u16 = 443;
/// Most methods in one rule, and characters in one method.
const MAX_METHODS: usize = 16;
const MAX_METHOD_CHARS: usize = 32;
/// Longest path pattern.
const MAX_PATH_CHARS: usize = 1024;

/// A path pattern: `/`-separated segments, `*` within a segment, `**` as a whole segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathPattern(String);

impl PathPattern {
    /// Every path (`/**`).
    pub fn any() -> PathPattern {
        PathPattern("/**".into())
    }

    fn parse(field: &'static str, s: &str) -> Result<PathPattern, PolicyError> {
        let bad = |why: &'static str| PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: why,
        };
        if !s.starts_with('/') || s.len() > MAX_PATH_CHARS {
            return Err(bad(
                "a path pattern that starts with `/`, at most 1024 characters",
            ));
        }
        let ok_char = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()+,;=:@%*/".contains(c);
        if !s.chars().all(ok_char) {
            return Err(bad("a path pattern of URL path characters (no spaces, `?`, `#`, `\\` or control characters); `*` matches within a segment, `**` any number of segments"));
        }
        for seg in s[1..].split('/') {
            if seg == "." || seg == ".." {
                return Err(bad("a path pattern without `.` or `..` segments (requests with them are refused where rules apply)"));
            }
            if seg.contains("**") && seg != "**" {
                return Err(bad("`**` only as a whole segment (`/simple/**`); `*` matches within one (`/files/*.whl`)"));
            }
        }
        Ok(PathPattern(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `path` (without its query, as sent) matches.
    pub fn matches(&self, path: &str) -> bool {
        if path == "*" {
            return self.0 == "/**";
        }
        let Some(p) = path.strip_prefix('/') else {
            return false;
        };
        let pat: Vec<&str> = self.0[1..].split('/').collect();
        let segs: Vec<&str> = p.split('/').collect();
        glob(
            &pat,
            &segs,
            |a| *a == "**",
            |a, b| segment_matches(a.as_bytes(), b.as_bytes()),
        )
    }
}

/// Wildcard matching in O(pattern × input): `star(p)` says whether pattern item `p` matches any
/// run of input items, `one(p, x)` whether it matches the single item `x`. The usual greedy
/// algorithm with one backtracking point, which is exact for a single kind of star.
fn glob<P, T>(
    pat: &[P],
    input: &[T],
    star: impl Fn(&P) -> bool,
    one: impl Fn(&P, &T) -> bool,
) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while i < input.len() {
        if p < pat.len() && star(&pat[p]) {
            back = Some((p, i));
            p += 1;
        } else if p < pat.len() && one(&pat[p], &input[i]) {
            p += 1;
            i += 1;
        } else if let Some((bp, bi)) = back {
            p = bp + 1;
            i = bi + 1;
            back = Some((bp, bi + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(star)
}

/// One segment against a segment pattern where `*` matches any run of characters.
fn segment_matches(pat: &[u8], seg: &[u8]) -> bool {
    glob(pat, seg, |c| *c == b'*', |c, x| c == x)
}

/// One `network.http` rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HttpRule {
    /// `None`: any method.
    pub methods: Option<Vec<String>>,
    /// `None`: every host (`*`).
    pub host: Option<NetRule>,
    pub path: PathPattern,
}

impl HttpRule {
    /// Parses `METHODS HOST[:PORT][PATH]`; `field` names the option in errors.
    ///
    /// ```
    /// use palisade_policy::http::HttpRule;
    /// let r = HttpRule::parse("network.http", "GET,HEAD pypi.org/simple/**").unwrap();
    /// assert!(r.allows("GET", "/simple/requests/"));
    /// assert!(!r.allows("POST", "/simple/requests/"));
    /// assert!(!r.allows("GET", "/legacy/"));
    /// assert_eq!(HttpRule::parse("network.http", "read-only *").unwrap().to_string(), "GET,HEAD,OPTIONS *");
    /// assert!(HttpRule::parse("network.http", "get pypi.org").is_err());
    /// ```
    pub fn parse(field: &'static str, s: &str) -> Result<HttpRule, PolicyError> {
        const EXPECTED: &str = "METHODS HOST[:PORT][/PATH]: METHODS is GET,HEAD (upper case, comma-separated), * or read-only; HOST is a name, *.DOMAIN, an address or * (every host); PATH starts with `/`, e.g. `GET,HEAD pypi.org/simple/**`";
        let bad = |why: &'static str| PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: why,
        };
        let (methods, rest) = s.trim().split_once(' ').ok_or_else(|| bad(EXPECTED))?;
        let rest = rest.trim_start();
        let methods = match methods {
            "*" => None,
            "read-only" => Some(READ_ONLY.iter().map(|m| m.to_string()).collect()),
            list => {
                let mut v: Vec<String> = Vec::new();
                for m in list.split(',') {
                    let token = !m.is_empty()
                        && m.len() <= MAX_METHOD_CHARS
                        && m.bytes().all(|b| {
                            b.is_ascii_uppercase()
                                || b.is_ascii_digit()
                                || b"!#$%&'*+-.^_`|~".contains(&b)
                        });
                    if !token || m == "*" {
                        return Err(bad("methods in upper case, separated by commas (GET,HEAD,POST), each an HTTP token of at most 32 characters; or * for any, or read-only"));
                    }
                    if !v.iter().any(|x| x == m) {
                        v.push(m.to_owned());
                    }
                }
                if v.len() > MAX_METHODS {
                    return Err(bad("at most 16 methods in one rule"));
                }
                Some(v)
            }
        };
        // The host ends at the first `/` outside the brackets of an IPv6 address or block.
        let host_end = if rest.starts_with('[') {
            rest.find(']')
                .map(|e| e + 1 + rest[e + 1..].find('/').unwrap_or(rest.len() - e - 1))
                .ok_or_else(|| bad(EXPECTED))?
        } else {
            rest.find('/').unwrap_or(rest.len())
        };
        let (host, path) = rest.split_at(host_end);
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad(EXPECTED));
        }
        let host = match host {
            "*" => None,
            h => Some(NetRule::parse(field, h).map_err(|_| {
                bad("a host as an allow rule takes it (a name, *.DOMAIN, an address or a block, optionally :PORT), or * for every host")
            })?),
        };
        let path = if path.is_empty() {
            PathPattern::any()
        } else {
            PathPattern::parse(field, path)?
        };
        Ok(HttpRule {
            methods,
            host,
            path,
        })
    }

    /// Whether this rule is about `host` on `port` (as an allow rule would match it).
    pub fn names(&self, host: &crate::net::Host, port: u16) -> bool {
        match &self.host {
            None => true,
            Some(r) => r.matches(host) && r.port.is_none_or(|p| p == port),
        }
    }

    /// Whether the rule allows `method` on `path` (no query).
    pub fn allows(&self, method: &str, path: &str) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x == method))
            && self.path.matches(path)
    }
}

impl fmt::Display for HttpRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.methods {
            None => f.write_str("*")?,
            Some(m) => f.write_str(&m.join(","))?,
        }
        match &self.host {
            None => f.write_str(" *")?,
            // An IPv4 block in brackets, or its `/LEN` would read back as the path.
            Some(NetRule {
                pattern: Pattern::Net { addr, prefix },
                port,
            }) if addr.is_ipv4() && *prefix < 32 => {
                write!(f, " [{addr}/{prefix}]")?;
                if let Some(p) = port {
                    write!(f, ":{p}")?;
                }
            }
            Some(h) => write!(f, " {h}")?,
        }
        if self.path != PathPattern::any() {
            f.write_str(self.path.as_str())?;
        }
        Ok(())
    }
}

impl TryFrom<String> for HttpRule {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        HttpRule::parse("network.http", &s)
    }
}

impl From<HttpRule> for String {
    fn from(r: HttpRule) -> String {
        r.to_string()
    }
}

/// Why a request's path cannot be checked against path patterns, or `None` when it can: servers
/// differ on dot segments, encoded slashes and backslashes, so a path holding them could match a
/// pattern and be served from elsewhere.
pub fn ambiguous_path(path: &str) -> Option<&'static str> {
    if path == "*" {
        return None;
    }
    if !path.starts_with('/') {
        return Some("a path that does not start with `/`");
    }
    let lower = path.to_ascii_lowercase();
    if path.contains('\\') || ["%2f", "%5c", "%00"].iter().any(|e| lower.contains(e)) {
        return Some("an encoded `/`, a `\\` or an encoded NUL in the path");
    }
    let dotted = lower.split('/').any(|s| {
        let s = s.replace("%2e", ".");
        s == "." || s == ".."
    });
    if dotted {
        return Some("a `.` or `..` segment in the path");
    }
    None
}

/// Where a secret's value comes from on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SecretSource {
    /// A variable of the caller's environment.
    Env(EnvName),
    /// A file (absolute path) the caller reads.
    File(PathBuf),
}

/// A secret's value, once the caller gave it: never serialized, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SecretValue(String);

impl SecretValue {
    /// A value fit for an HTTP header: 1 to [`MAX_SECRET_BYTES`] bytes of visible ASCII, spaces
    /// or tabs (no line breaks, no NUL). The error says what is wrong, never the value.
    pub fn new(v: &str) -> Result<SecretValue, &'static str> {
        if v.is_empty() || v.len() > MAX_SECRET_BYTES {
            return Err("a value of 1 to 8192 bytes");
        }
        if !v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
            return Err("a value of visible ASCII characters, spaces and tabs (it goes into an HTTP header: no line breaks, no NUL, no other bytes)");
        }
        Ok(SecretValue(v.to_owned()))
    }

    /// The value, for the proxy.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(..)")
    }
}

/// One `network.secrets` entry: a variable inside that holds a placeholder, the host its value
/// goes to, and where the value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Secret {
    /// The variable inside (and, by default, the caller's variable the value comes from).
    pub name: EnvName,
    /// The one host the value goes to: a normalized name.
    pub host: String,
    pub port: u16,
    pub from: SecretSource,
    /// The value, once the caller resolved it ([`crate::Policy::resolve_secrets`]).
    pub value: Option<SecretValue>,
}

impl Secret {
    /// Parses `NAME@HOST[:PORT][=env:VAR|=file:/PATH]`.
    ///
    /// ```
    /// use palisade_policy::http::{Secret, SecretSource};
    /// let s = Secret::parse("network.secrets", "GH_TOKEN@api.github.com").unwrap();
    /// assert_eq!((s.host.as_str(), s.port), ("api.github.com", 443));
    /// assert!(matches!(s.from, SecretSource::Env(ref v) if v.as_str() == "GH_TOKEN"));
    /// let s = Secret::parse("network.secrets", "KEY@api.example.com:8443=file:/run/key").unwrap();
    /// assert_eq!(s.to_string(), "KEY@api.example.com:8443=file:/run/key");
    /// assert!(Secret::parse("network.secrets", "KEY@*.example.com").is_err());
    /// ```
    pub fn parse(field: &'static str, s: &str) -> Result<Secret, PolicyError> {
        const EXPECTED: &str = "NAME@HOST[:PORT][=env:VAR|=file:/PATH]: a variable name, one host name (no wildcard, no address), an optional port (default 443), and where the value comes from (default: the variable NAME of palisade's environment)";
        let bad = |why: &'static str| PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: why,
        };
        let (spec, source) = match s.split_once('=') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let (name, host) = spec.split_once('@').ok_or_else(|| bad(EXPECTED))?;
        let name = EnvName::new(name).map_err(|_| bad(EXPECTED))?;
        let rule = NetRule::parse(field, host).map_err(|_| bad(EXPECTED))?;
        let Pattern::Exact(host) = rule.pattern else {
            return Err(bad(
                "one host name for a secret's value: no wildcard and no address, so that it goes to exactly the host named",
            ));
        };
        let port = rule.port.unwrap_or(SECRET_PORT);
        if port == 80 {
            return Err(bad("a TLS port for a secret's host (not 80): the value would cross the network in the clear"));
        }
        let from = match source {
            None => SecretSource::Env(name.clone()),
            Some(src) => {
                if let Some(v) = src.strip_prefix("env:") {
                    SecretSource::Env(EnvName::new(v).map_err(|_| bad(EXPECTED))?)
                } else if let Some(p) = src.strip_prefix("file:") {
                    if !p.starts_with('/') || p.contains('\0') {
                        return Err(bad("file:/ABSOLUTE/PATH as a secret's source"));
                    }
                    SecretSource::File(PathBuf::from(p))
                } else {
                    return Err(bad(EXPECTED));
                }
            }
        };
        Ok(Secret {
            name,
            host,
            port,
            from,
            value: None,
        })
    }

    /// Whether the secret's value goes to `host` on `port`.
    pub fn for_host(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.host)?;
        if self.port != SECRET_PORT {
            write!(f, ":{}", self.port)?;
        }
        match &self.from {
            SecretSource::Env(v) if *v == self.name => Ok(()),
            SecretSource::Env(v) => write!(f, "=env:{v}"),
            SecretSource::File(p) => write!(f, "=file:{}", p.display()),
        }
    }
}

impl TryFrom<String> for Secret {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Secret::parse("network.secrets", &s)
    }
}

impl From<Secret> for String {
    fn from(s: Secret) -> String {
        s.to_string()
    }
}

/// Parses an `inspect` or `no_inspect` entry: a host name or `*.DOMAIN`, with an optional port
/// that is not 80 (plain HTTP, which the proxy reads without inspection).
pub fn parse_inspect(field: &'static str, s: &str) -> Result<NetRule, PolicyError> {
    let r = NetRule::parse(field, s)?;
    if !matches!(r.pattern, Pattern::Exact(_) | Pattern::Subdomains(_)) {
        return Err(PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: "a host name or *.DOMAIN, optionally :PORT (an address gets a certificate only through `inspect = true`)",
        });
    }
    if r.port == Some(80) {
        return Err(PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: "a TLS port (port 80 carries plain HTTP, which the proxy reads and checks without inspection)",
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Host;

    fn rule(s: &str) -> HttpRule {
        HttpRule::parse("network.http", s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn rules_parse_print_and_read_back() {
        for (given, shown) in [
            ("GET,HEAD pypi.org/simple/**", "GET,HEAD pypi.org/simple/**"),
            ("read-only *", "GET,HEAD,OPTIONS *"),
            (
                "* api.example.com:8443/v1/*/items",
                "* api.example.com:8443/v1/*/items",
            ),
            (
                "POST,POST *.example.org/upload",
                "POST *.example.org/upload",
            ),
            ("GET [2001:db8::1]:8443/x", "GET [2001:db8::1]:8443/x"),
            ("GET [10.0.0.0/8]:80/health", "GET [10.0.0.0/8]:80/health"),
            ("GET example.org/**", "GET example.org"),
            ("M-SEARCH example.org/", "M-SEARCH example.org/"),
        ] {
            let r = rule(given);
            assert_eq!(r.to_string(), shown, "{given}");
            assert_eq!(rule(&r.to_string()), r, "{given}");
        }
        for bad in [
            "",
            "GET",
            "get pypi.org",
            "GET, pypi.org",
            "G(ET pypi.org",
            "* pypi.org/a/**b",
            "* pypi.org/a/***",
            "* pypi.org/a/../b",
            "* pypi.org/a b",
            "* pypi.org/a?q",
            "* *.com",
            "* pypi.org:0",
            "GET pypi.org/\u{7f}",
            "GET pypi.org\\x",
        ] {
            let e = HttpRule::parse("network.http", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("network.http"), "{bad}: {e}");
        }
    }

    #[test]
    fn paths_match_segment_by_segment() {
        let m = |p: &str, path: &str| PathPattern::parse("t", p).unwrap().matches(path);
        assert!(m("/simple/**", "/simple"));
        assert!(m("/simple/**", "/simple/"));
        assert!(m("/simple/**", "/simple/requests/"));
        assert!(!m("/simple/**", "/simpler/x"));
        assert!(!m("/simple/**", "/legacy/simple/x"));
        assert!(m("/files/*.whl", "/files/a-1.0-py3-none-any.whl"));
        assert!(!m("/files/*.whl", "/files/a/b.whl"));
        assert!(m("/a/**/z", "/a/z"));
        assert!(m("/a/**/z", "/a/b/c/z"));
        assert!(!m("/a/**/z", "/a/b/c/y"));
        assert!(m("/**", "/"));
        assert!(m("/**", "*"));
        assert!(!m("/x", "*"));
        assert!(m("/", "/"));
        assert!(!m("/", "/a"));
        assert!(m("/a*b*c", "/abbbc"));
        assert!(!m("/a*b*c", "/abbb"));
        // Many stars do not make matching slow.
        let p = format!("/{}", "**/".repeat(60) + "x");
        let path = "/a".repeat(500);
        assert!(!m(&p, &path));
    }

    #[test]
    fn rules_say_whom_they_are_about() {
        let r = rule("GET *.example.org:8443/x");
        let h = |s: &str| Host::parse(s).unwrap();
        assert!(r.names(&h("a.example.org"), 8443));
        assert!(!r.names(&h("a.example.org"), 443));
        assert!(!r.names(&h("example.org"), 8443));
        assert!(rule("GET example.org").names(&h("example.org"), 443));
        assert!(rule("GET *").names(&h("198.51.100.7"), 22));
        assert!(rule("GET [198.51.100.0/24]").names(&h("198.51.100.7"), 80));
        // Without brackets, `/24` is the path.
        assert_eq!(rule("GET 198.51.100.0/24").path.as_str(), "/24");
    }

    #[test]
    fn ambiguous_paths_are_told() {
        for ok in ["/", "/simple/x/", "/a%20b", "*", "/a.b/..c"] {
            assert_eq!(ambiguous_path(ok), None, "{ok}");
        }
        for bad in [
            "/a/../b",
            "/a/./b",
            "/..",
            "/a/%2e%2E/b",
            "/a/.%2e/b",
            "/a%2fb",
            "/a%5Cb",
            "/a\\b",
            "/a%00",
            "x",
        ] {
            assert!(ambiguous_path(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn secrets_parse_and_print() {
        let s = Secret::parse("t", "TOKEN@API.Example.com.").unwrap();
        assert_eq!(s.to_string(), "TOKEN@api.example.com");
        let s = Secret::parse("t", "T@h.example:8443=env:OTHER").unwrap();
        assert_eq!(s.from, SecretSource::Env(EnvName::new("OTHER").unwrap()));
        assert_eq!(s.to_string(), "T@h.example:8443=env:OTHER");
        assert_eq!(Secret::parse("t", &s.to_string()).unwrap(), s);
        for bad in [
            "TOKEN",
            "TOKEN@",
            "1T@h.example",
            "T@*.example.com",
            "T@198.51.100.7",
            "T@h.example:80",
            "T@h.example=file:rel",
            "T@h.example=vault:x",
            "T@h.example=env:1X",
        ] {
            let e = Secret::parse("network.secrets", bad)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("network.secrets") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        assert!(SecretValue::new("Bearer abc").is_ok());
        for bad in ["", "a\r\nX: y", "\0", "é"] {
            assert!(SecretValue::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", SecretValue::new("s3cr3t").unwrap()),
            "SecretValue(..)"
        );
    }

    #[test]
    fn inspect_entries_are_names_on_tls_ports() {
        assert!(parse_inspect("network.inspect", "*.example.org:8443").is_ok());
        for bad in ["example.org:80", "198.51.100.7", "10.0.0.0/8"] {
            let e = parse_inspect("network.inspect", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("network.inspect") && e.contains(bad), "{e}");
        }
    }
}
