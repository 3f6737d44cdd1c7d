//! Policy files: one TOML schema for everything a policy can say (docs/policy.md).
//!
//! A file is read in two steps. TOML and its shape first — unknown tables and fields, wrong
//! types — then every value through the same parsers the CLI uses (sizes, durations, host rules,
//! paths, names), so that a value that passes here is as valid as one from the command line. Each
//! error carries the file, line and column of the value, the field, the value and what is
//! accepted. Nothing here reads the host: a file is data until the caller applies it.
//!
//! A file is a [`PolicyOverlay`], not a whole policy: fields it leaves out keep the value they
//! had (defaults, then the profiles, then the file, then command-line options; lists add up).
//! Its optional `[bounds]` table says the most a policy run under the file may ask for
//! ([`PolicyFile::ceiling`]).

use crate::http::{parse_inspect, HttpRule, Secret};
use crate::net::{NetRule, Pin, MAX_LOCAL_PORTS};
use crate::{layer, parse_count, parse_cpus, parse_duration, parse_size, Bind, Bounds};
use crate::{Degradable, EnvName, EnvVar, Policy, PolicyError, PolicyOverlay, Scratch};
use crate::{MAX_OPEN_FILES, MAX_PIDS};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use toml::{Spanned, Value};

/// A policy file or profile, validated: every value is ready to use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyFile {
    /// The file's fields, and the profiles it names.
    pub overlay: PolicyOverlay,
    /// Its `[bounds]` table: how far past the file's own values a policy run under it may go.
    pub bounds: Option<PolicyOverlay>,
}

/// A policy file that cannot be used: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file's name as the user gave it (or `profile NAME`).
    pub origin: String,
    /// 1-based line and column of the offending value; 0 when the error is not about one place.
    pub line: usize,
    pub column: usize,
    /// The offending line's text.
    pub source_line: String,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            return write!(f, "{}: {}", self.origin, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}\n{:>5} | {}",
            self.origin, self.line, self.column, self.message, self.line, self.source_line
        )
    }
}

impl std::error::Error for FileError {}

// The file's shape. Leaves are kept as spanned TOML values and typed by hand below, so that a
// wrong type gets the same field-and-accepted-values message as a wrong value.
type V = Spanned<Value>;

/// A file's top level (`B`: its `[bounds]` table) or its `[bounds]` table (`B`: whatever is
/// there, refused).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw<B> {
    bounds: Option<B>,
    profiles: Option<V>,
    hostname: Option<V>,
    filesystem: Option<RawFs>,
    env: Option<RawEnv>,
    network: Option<RawNet>,
    limits: Option<RawLimits>,
    layers: Option<RawLayers>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFs {
    scratch: Option<V>,
    workspace: Option<V>,
    keep_scratch: Option<V>,
    ro: Option<V>,
    rw: Option<V>,
    protect: Option<V>,
    unprotect: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    set: Option<Spanned<BTreeMap<Spanned<String>, V>>>,
    pass: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNet {
    allow: Option<V>,
    deny: Option<V>,
    resolve: Option<V>,
    dns_server: Option<V>,
    local_ports: Option<V>,
    inspect: Option<V>,
    no_inspect: Option<V>,
    http: Option<V>,
    max_body: Option<V>,
    secrets: Option<V>,
    upstream_ca: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    timeout: Option<V>,
    cpu_time: Option<V>,
    memory: Option<V>,
    pids: Option<V>,
    open_files: Option<V>,
    file_size: Option<V>,
    output: Option<V>,
    tmp_size: Option<V>,
    scratch_size: Option<V>,
    cpus: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayers {
    allow_degraded: Option<V>,
    allow_ptrace: Option<V>,
}

/// Turns byte offsets into line, column and the line's text.
struct Src<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Src<'_> {
    fn err(&self, span: std::ops::Range<usize>, message: String) -> FileError {
        let start = span.start.min(self.text.len());
        let line_start = self.text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[start..]
            .find('\n')
            .map_or(self.text.len(), |i| start + i);
        FileError {
            origin: self.origin.to_owned(),
            line: self.text[..start].matches('\n').count() + 1,
            column: self.text[line_start..start].chars().count() + 1,
            source_line: self.text[line_start..line_end].trim_end().to_owned(),
            message,
        }
    }

    fn policy(&self, v: &V, e: PolicyError) -> FileError {
        self.err(v.span(), e.to_string())
    }

    fn string<'v>(&self, field: &str, v: &'v V) -> Result<&'v str, FileError> {
        v.get_ref()
            .as_str()
            .ok_or_else(|| self.wrong(field, v, "a string"))
    }

    fn bool(&self, field: &str, v: &V) -> Result<bool, FileError> {
        v.get_ref()
            .as_bool()
            .ok_or_else(|| self.wrong(field, v, "true or false"))
    }

    /// An array of strings, each with its own span for the errors about it.
    fn strings<'v>(&self, field: &str, v: &'v V) -> Result<Vec<(&'v str, V)>, FileError> {
        let a = v
            .get_ref()
            .as_array()
            .ok_or_else(|| self.wrong(field, v, "an array of strings, e.g. [\"a\", \"b\"]"))?;
        // Array elements carry no spans of their own: errors point at the array.
        a.iter()
            .map(|e| match e.as_str() {
                Some(s) => Ok((s, Spanned::new(v.span(), e.clone()))),
                None => Err(self.wrong(field, v, "an array of strings, e.g. [\"a\", \"b\"]")),
            })
            .collect()
    }

    fn wrong(&self, field: &str, v: &V, expected: &str) -> FileError {
        self.err(
            v.span(),
            format!(
                "{field}: expected {expected}, found {} `{}`",
                v.get_ref().type_str(),
                v.get_ref()
            ),
        )
    }

    /// A size: a string with a unit (`512MiB`) or a whole number of bytes.
    fn size(&self, field: &'static str, v: &V) -> Result<u64, FileError> {
        match v.get_ref() {
            Value::String(s) => parse_size(field, s).map_err(|e| self.policy(v, e)),
            Value::Integer(i) => parse_size(field, &format!("{i}B")).map_err(|e| self.policy(v, e)),
            _ => Err(self.wrong(field, v, "a size such as \"512MiB\" or a number of bytes")),
        }
    }

    fn duration_ms(&self, field: &'static str, v: &V) -> Result<u64, FileError> {
        let s = self
            .string(field, v)
            .map_err(|_| self.wrong(field, v, "a duration with a unit, e.g. \"30s\" or \"10m\""))?;
        parse_duration(field, s)
            .map(|d| d.as_millis() as u64)
            .map_err(|e| self.policy(v, e))
    }

    fn count(&self, field: &'static str, v: &V, max: u64) -> Result<u64, FileError> {
        match v.get_ref() {
            Value::Integer(i) => {
                parse_count(field, &i.to_string(), max).map_err(|e| self.policy(v, e))
            }
            _ => Err(self.wrong(field, v, "a whole number")),
        }
    }
}

impl PolicyFile {
    /// Reads a policy file's text. `origin` names it in errors (the path as the user gave it).
    ///
    /// ```
    /// use palisade_policy::file::PolicyFile;
    /// let f = PolicyFile::parse("p.toml", "[limits]\nmemory = \"512MiB\"\n").unwrap();
    /// assert_eq!(f.overlay.limits.memory_bytes, Some(512 << 20));
    /// let e = PolicyFile::parse("p.toml", "[limits]\nmemory = \"lots\"\n").unwrap_err();
    /// assert_eq!((e.line, e.column), (2, 10));
    /// assert!(e.message.contains("limits.memory") && e.message.contains("lots"));
    /// ```
    pub fn parse(origin: &str, text: &str) -> Result<PolicyFile, FileError> {
        let src = Src { origin, text };
        let raw: Raw<Box<Raw<V>>> = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let mut m = src.err(span, e.message().trim_end().to_owned());
            if e.span().is_none() {
                m.line = 0;
            }
            m
        })?;
        let overlay = src.overlay(&raw)?;
        let bounds = match &raw.bounds {
            None => None,
            Some(inner) => {
                let refused = [
                    ("bounds", inner.bounds.as_ref().map(|v| v.span())),
                    ("hostname", inner.hostname.as_ref().map(|v| v.span())),
                    (
                        "env.set",
                        inner
                            .env
                            .as_ref()
                            .and_then(|e| e.set.as_ref())
                            .map(|v| v.span()),
                    ),
                    (
                        "network.local_ports",
                        inner
                            .network
                            .as_ref()
                            .and_then(|n| n.local_ports.as_ref())
                            .map(|v| v.span()),
                    ),
                ];
                if let Some((field, span)) =
                    refused.into_iter().find_map(|(f, s)| s.map(|s| (f, s)))
                {
                    return Err(src.err(
                        span,
                        format!("bounds.{field}: not a bound (a policy may set it freely, or it is the ceiling itself); remove it from [bounds]"),
                    ));
                }
                Some(src.overlay(inner).map_err(|mut e| {
                    e.message = format!("in [bounds]: {}", e.message);
                    e
                })?)
            }
        };
        Ok(PolicyFile { overlay, bounds })
    }

    /// The ceiling of policies run under this file (a server's requests; the command line's
    /// options when the file has a `[bounds]` table): the file's own policy — the defaults, its
    /// profiles, its fields — with its `[bounds]` table on top, where values replace and lists
    /// add as anywhere else. Without `[bounds]`, exactly the file's own values are the most a
    /// policy may ask for.
    ///
    /// ```
    /// use palisade_policy::file::PolicyFile;
    /// let f = PolicyFile::parse("s.toml", "[limits]\ntimeout = \"30s\"\n[bounds.limits]\ntimeout = \"5m\"\n").unwrap();
    /// assert_eq!(f.ceiling().unwrap().limits.timeout_ms, 300_000);
    /// let f = PolicyFile::parse("s.toml", "[limits]\ntimeout = \"30s\"\n").unwrap();
    /// assert_eq!(f.ceiling().unwrap().limits.timeout_ms, 30_000);
    /// ```
    pub fn ceiling(&self) -> Result<Bounds, PolicyError> {
        let mut p = Policy::new(["true"])?;
        let none = PolicyOverlay::default();
        layer(
            &mut p,
            &[&self.overlay, self.bounds.as_ref().unwrap_or(&none)],
        )?;
        Ok(Bounds::from_policy(&p))
    }

    /// The policy this file gives: `base` (the defaults and the caller's command, lowered to
    /// the file's ceiling where it has a `[bounds]` table), the file's profiles and those of
    /// `options`, the file's fields, then those of `options` (the command line's, in the
    /// documented precedence), checked to fit the ceiling when there is one. Names in
    /// `env.pass` are left for the caller to resolve ([`Policy::resolve_env`]); everything
    /// else is validated.
    ///
    /// ```
    /// use palisade_policy::{file::PolicyFile, Policy, PolicyOverlay};
    /// let f = PolicyFile::parse("p.toml", "[limits]\npids = 64\n[bounds.limits]\npids = 128\ntimeout = \"1m\"\n").unwrap();
    /// let mut options = PolicyOverlay::default();
    /// let p = f.policy(Policy::new(["make"]).unwrap(), &options).unwrap();
    /// // The default timeout (10m) lowered to the ceiling, the file's pids.
    /// assert_eq!((p.limits.timeout_ms, p.limits.pids), (60_000, 64));
    /// options.limits.pids = Some(1000);
    /// let e = f.policy(Policy::new(["make"]).unwrap(), &options).unwrap_err();
    /// assert_eq!(e.to_string(), "limits.pids: 1000 is beyond the bounds (at most 128)");
    /// ```
    pub fn policy(&self, mut base: Policy, options: &PolicyOverlay) -> Result<Policy, PolicyError> {
        if self.bounds.is_some() {
            return self.ceiling()?.admit(base, &[&self.overlay, options]);
        }
        layer(&mut base, &[&self.overlay, options])?;
        base.validate_values()?;
        Ok(base)
    }
}

impl Src<'_> {
    /// One table's worth of fields (the file's top level, or its `[bounds]`).
    fn overlay<B>(&self, raw: &Raw<B>) -> Result<PolicyOverlay, FileError> {
        let src = self;
        let mut f = PolicyOverlay::default();
        if let Some(v) = &raw.profiles {
            for (name, v) in src.strings("profiles", v)? {
                if crate::profile::get(name).is_none() {
                    return Err(src.err(
                        v.span(),
                        format!(
                            "profiles: unknown profile `{name}`; the built-in ones are: {}",
                            crate::profile::names().join(", ")
                        ),
                    ));
                }
                f.profiles.push(name.to_owned());
            }
        }
        if let Some(v) = &raw.hostname {
            f.hostname = Some(src.string("hostname", v)?.to_owned());
        }
        if let Some(fs) = &raw.filesystem {
            if let Some(v) = &fs.scratch {
                let s = src.string("filesystem.scratch", v)?;
                if !s.starts_with('/') {
                    return Err(src.err(
                        v.span(),
                        format!(
                            "invalid filesystem.scratch `{s}`: expected an absolute path of a host directory"
                        ),
                    ));
                }
                f.scratch = Some(PathBuf::from(s));
            }
            if let Some(v) = &fs.workspace {
                let s = src.string("filesystem.workspace", v)?;
                if !s.starts_with('/') {
                    return Err(src.err(
                        v.span(),
                        format!(
                            "invalid filesystem.workspace `{s}`: expected an absolute path of a host directory"
                        ),
                    ));
                }
                if fs.scratch.is_some() {
                    return Err(src.err(
                        v.span(),
                        "filesystem.workspace: give filesystem.scratch or filesystem.workspace, not both (both are mounted at /workspace)".to_owned(),
                    ));
                }
                f.workspace = Some(PathBuf::from(s));
            }
            if let Some(v) = &fs.keep_scratch {
                f.keep_scratch = Some(src.bool("filesystem.keep_scratch", v)?);
            }
            for (writable, v) in [(false, &fs.ro), (true, &fs.rw)] {
                let field = Bind::field(writable);
                if let Some(v) = v {
                    for (s, v) in src.strings(field, v)? {
                        let b = Bind::parse(s, writable).map_err(|e| src.policy(&v, e))?;
                        f.binds.push(b);
                    }
                }
            }
            for (field, list, v) in [
                ("filesystem.protect", &mut f.protect, &fs.protect),
                ("filesystem.unprotect", &mut f.unprotect, &fs.unprotect),
            ] {
                if let Some(v) = v {
                    for (s, v) in src.strings(field, v)? {
                        let p = crate::protect::ProtectedPath::new(s)
                            .map_err(|e| src.policy(&v, e.in_field(field)))?;
                        list.push(p);
                    }
                }
            }
        }
        if let Some(env) = &raw.env {
            if let Some(set) = &env.set {
                // In the file's order, so that what `show` prints reads back the same.
                let mut vars: Vec<_> = set.get_ref().iter().collect();
                vars.sort_by_key(|(k, _)| k.span().start);
                for (k, v) in vars {
                    let name = EnvName::new(k.get_ref())
                        .map_err(|e| src.err(k.span(), e.in_field("env.set").to_string()))?;
                    let val = src.string(&format!("env.set.{}", k.get_ref()), v)?;
                    let var = EnvVar::new(name.as_str(), val).map_err(|e| src.policy(v, e))?;
                    f.env_set.push(var);
                }
            }
            if let Some(v) = &env.pass {
                for (s, v) in src.strings("env.pass", v)? {
                    let n = EnvName::new(s).map_err(|e| src.policy(&v, e))?;
                    if f.env_set.iter().any(|e| e.name == n) || f.env_pass.contains(&n) {
                        return Err(src.err(
                            v.span(),
                            format!("env.pass: `{s}` is named twice (in env.set or env.pass); name each variable once"),
                        ));
                    }
                    f.env_pass.push(n);
                }
            }
        }
        if let Some(net) = &raw.network {
            for (field, list, v) in [
                ("network.allow", &mut f.allow_net, &net.allow),
                ("network.deny", &mut f.deny_net, &net.deny),
            ] {
                if let Some(v) = v {
                    for (s, v) in src.strings(field, v)? {
                        list.push(NetRule::parse(field, s).map_err(|e| src.policy(&v, e))?);
                    }
                }
            }
            if let Some(v) = &net.resolve {
                for (s, v) in src.strings("network.resolve", v)? {
                    f.resolve
                        .push(Pin::parse(s).map_err(|e| src.policy(&v, e))?);
                }
            }
            if let Some(v) = &net.dns_server {
                let s = src.string("network.dns_server", v)?;
                let a = crate::net::parse_dns_server(s).map_err(|e| src.policy(v, e))?;
                f.dns_server = Some(a);
            }
            if let Some(v) = &net.local_ports {
                let bad = || {
                    src.wrong(
                        "network.local_ports",
                        v,
                        "an array of TCP ports from 1 to 65535, e.g. [8000]",
                    )
                };
                let a = v.get_ref().as_array().ok_or_else(bad)?;
                if a.len() > MAX_LOCAL_PORTS {
                    return Err(src.err(
                        v.span(),
                        format!("network.local_ports: at most {MAX_LOCAL_PORTS} ports"),
                    ));
                }
                for p in a {
                    match p.as_integer() {
                        Some(p @ 1..=65535) => f.local_ports.push(p as u16),
                        _ => return Err(bad()),
                    }
                }
            }
            if let Some(v) = &net.inspect {
                match v.get_ref() {
                    Value::Boolean(b) => f.inspect_all = Some(*b),
                    Value::Array(_) => {
                        for (s, v) in src.strings("network.inspect", v)? {
                            let r = parse_inspect("network.inspect", s)
                                .map_err(|e| src.policy(&v, e))?;
                            f.inspect.push(r);
                        }
                    }
                    _ => {
                        return Err(src.wrong(
                            "network.inspect",
                            v,
                            "true, false, or an array of hosts, e.g. [\"pypi.org\"]",
                        ))
                    }
                }
            }
            if let Some(v) = &net.no_inspect {
                for (s, v) in src.strings("network.no_inspect", v)? {
                    let r =
                        parse_inspect("network.no_inspect", s).map_err(|e| src.policy(&v, e))?;
                    f.no_inspect.push(r);
                }
            }
            if let Some(v) = &net.http {
                for (s, v) in src.strings("network.http", v)? {
                    let r = HttpRule::parse("network.http", s).map_err(|e| src.policy(&v, e))?;
                    f.http.push(r);
                }
            }
            if let Some(v) = &net.max_body {
                f.max_body = Some(src.size("network.max_body", v)?);
            }
            if let Some(v) = &net.secrets {
                for (s, v) in src.strings("network.secrets", v)? {
                    let x = Secret::parse("network.secrets", s).map_err(|e| src.policy(&v, e))?;
                    if f.secrets.iter().any(|o| o.name == x.name) {
                        return Err(src.err(
                            v.span(),
                            format!(
                                "network.secrets: `{}` is named twice; one secret for one variable",
                                x.name
                            ),
                        ));
                    }
                    f.secrets.push(x);
                }
            }
            if let Some(v) = &net.upstream_ca {
                let s = src.string("network.upstream_ca", v)?;
                if !s.starts_with('/') || s.contains('\0') {
                    return Err(src.err(
                        v.span(),
                        format!("invalid network.upstream_ca `{s}`: expected an absolute path of a PEM file on the host"),
                    ));
                }
                f.upstream_ca = Some(PathBuf::from(s));
            }
        }
        if let Some(l) = &raw.limits {
            let o = &mut f.limits;
            if let Some(v) = &l.timeout {
                o.timeout_ms = Some(src.duration_ms("limits.timeout", v)?);
            }
            if let Some(v) = &l.cpu_time {
                o.cpu_time_ms = Some(src.duration_ms("limits.cpu_time", v)?);
            }
            if let Some(v) = &l.memory {
                o.memory_bytes = Some(src.size("limits.memory", v)?);
            }
            if let Some(v) = &l.file_size {
                o.file_size_bytes = Some(src.size("limits.file_size", v)?);
            }
            if let Some(v) = &l.output {
                o.output_bytes = Some(src.size("limits.output", v)?);
            }
            if let Some(v) = &l.tmp_size {
                o.tmp_bytes = Some(src.size("limits.tmp_size", v)?);
            }
            if let Some(v) = &l.scratch_size {
                o.scratch_bytes = Some(src.size("limits.scratch_size", v)?);
            }
            if let Some(v) = &l.pids {
                o.pids = Some(src.count("limits.pids", v, MAX_PIDS)?);
            }
            if let Some(v) = &l.open_files {
                o.open_files = Some(src.count("limits.open_files", v, MAX_OPEN_FILES)?);
            }
            if let Some(v) = &l.cpus {
                let s = match v.get_ref() {
                    Value::Integer(i) => i.to_string(),
                    Value::Float(x) => x.to_string(),
                    Value::String(s) => s.clone(),
                    _ => {
                        return Err(src.wrong("limits.cpus", v, "a number of CPUs, e.g. 0.5 or 2"))
                    }
                };
                o.cpu_milli = Some(parse_cpus("limits.cpus", &s).map_err(|e| src.policy(v, e))?);
            }
            // The whole set, as the run would see it, so that a range the parsers leave to
            // `Limits::validate` (memory under 1 MiB, a tmpfs under 1 MiB) is caught here too,
            // at the value it is about.
            let mut all = crate::Limits::default();
            o.apply(&mut all);
            all.validate().map_err(|e| {
                let at = match e.field() {
                    Some("limits.memory") => &l.memory,
                    Some("limits.tmp_size") => &l.tmp_size,
                    Some("limits.scratch_size") => &l.scratch_size,
                    Some("limits.timeout") => &l.timeout,
                    Some("limits.cpu_time") => &l.cpu_time,
                    Some("limits.output") => &l.output,
                    Some("limits.file_size") => &l.file_size,
                    Some("limits.pids") => &l.pids,
                    Some("limits.open_files") => &l.open_files,
                    _ => &l.cpus,
                };
                match at {
                    Some(v) => src.policy(v, e),
                    None => FileError {
                        origin: src.origin.to_owned(),
                        line: 0,
                        column: 0,
                        source_line: String::new(),
                        message: e.to_string(),
                    },
                }
            })?;
        }
        if let Some(layers) = &raw.layers {
            if let Some(v) = &layers.allow_degraded {
                for (s, v) in src.strings("layers.allow_degraded", v)? {
                    let d = Degradable::parse(s).map_err(|e| src.policy(&v, e))?;
                    if !f.allow_degraded.contains(&d) {
                        f.allow_degraded.push(d);
                    }
                }
            }
            if let Some(v) = &layers.allow_ptrace {
                f.allow_ptrace = Some(src.bool("layers.allow_ptrace", v)?);
            }
        }
        Ok(f)
    }
}

impl PolicyFile {
    /// The effective policy written back as a policy file (`palisade policy show`): every field
    /// set, sizes and durations in their shortest exact form, variables still to pass by name
    /// as names (never a value the caller's environment would give them). Reading the text
    /// back gives the same policy, but for the command and `tty`, which are not file fields,
    /// and the CPU time, which is written out where it defaults to the timeout.
    pub fn render(p: &Policy) -> String {
        let mut s = String::new();
        let q = |v: &str| toml::Value::String(v.to_owned()).to_string();
        let list = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|x| q(x)).collect();
            format!("[{}]", items.join(", "))
        };
        s.push_str(&format!("hostname = {}\n\n[filesystem]\n", q(&p.hostname)));
        match &p.scratch {
            Scratch::Host { path } => {
                s.push_str(&format!("scratch = {}\n", q(&path.display().to_string())))
            }
            Scratch::Workspace { path } => {
                s.push_str(&format!("workspace = {}\n", q(&path.display().to_string())))
            }
            Scratch::Ephemeral => s.push_str("# scratch: a fresh tmpfs (no host directory)\n"),
        }
        s.push_str(&format!("keep_scratch = {}\n", p.keep_scratch));
        let spec = |b: &Bind| {
            let src = b.source.display().to_string();
            if src == b.target.as_str() {
                src
            } else {
                format!("{src}:{}", b.target)
            }
        };
        let ro: Vec<String> = p.binds.iter().filter(|b| !b.writable).map(spec).collect();
        let rw: Vec<String> = p.binds.iter().filter(|b| b.writable).map(spec).collect();
        s.push_str(&format!("ro = {}\nrw = {}\n", list(&ro), list(&rw)));
        let defaults = crate::protect::defaults();
        let extra: Vec<String> = p
            .protected
            .iter()
            .filter(|x| !defaults.contains(x))
            .cloned()
            .collect();
        let dropped: Vec<String> = defaults
            .iter()
            .filter(|x| !p.protected.contains(x))
            .cloned()
            .collect();
        s.push_str(&format!(
            "# protected (read-only under a host scratch): {}\nprotect = {}\nunprotect = {}\n",
            p.protected.join(" "),
            list(&extra),
            list(&dropped)
        ));
        s.push_str("\n[env]\nset = {");
        let vars: Vec<String> = p
            .env
            .iter()
            .map(|v| format!(" {} = {}", v.name, q(&v.value)))
            .collect();
        s.push_str(&vars.join(","));
        s.push_str(if vars.is_empty() { "}\n" } else { " }\n" });
        let pass: Vec<String> = p.env_pass.iter().map(|n| n.to_string()).collect();
        s.push_str(&format!("pass = {}\n", list(&pass)));
        let rules = |v: &[NetRule]| list(&v.iter().map(|r| r.to_string()).collect::<Vec<_>>());
        s.push_str(&format!(
            "\n[network]\nallow = {}\ndeny = {}\nresolve = {}\nlocal_ports = {:?}\n",
            rules(&p.network.allow),
            rules(&p.network.deny),
            list(
                &p.network
                    .resolve
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
            ),
            p.network.local_ports
        ));
        if let Some(a) = p.network.dns_server {
            s.push_str(&format!("dns_server = {}\n", q(&a.to_string())));
        }
        let n = &p.network;
        if n.inspect_all {
            s.push_str("inspect = true\n");
        } else {
            s.push_str(&format!("inspect = {}\n", rules(&n.inspect)));
        }
        let shown = |v: &[String]| list(v);
        s.push_str(&format!(
            "no_inspect = {}\nhttp = {}\n# secrets: NAME@HOST and where from, never what they hold\nsecrets = {}\n",
            rules(&n.no_inspect),
            shown(&n.http.iter().map(|r| r.to_string()).collect::<Vec<_>>()),
            shown(&n.secrets.iter().map(|r| r.to_string()).collect::<Vec<_>>()),
        ));
        if let Some(b) = n.max_body {
            s.push_str(&format!("max_body = {}\n", q(&fmt_size(b))));
        }
        if let Some(c) = &n.upstream_ca {
            s.push_str(&format!("upstream_ca = {}\n", q(&c.display().to_string())));
        }
        let l = &p.limits;
        s.push_str(&format!(
            "\n[limits]\ntimeout = {}\ncpu_time = {}\nmemory = {}\npids = {}\nopen_files = {}\nfile_size = {}\noutput = {}\ntmp_size = {}\nscratch_size = {}\n",
            q(&fmt_ms(l.timeout_ms)),
            q(&fmt_ms(l.cpu_time().as_millis() as u64)),
            q(&fmt_size(l.memory_bytes)),
            l.pids,
            l.open_files,
            q(&fmt_size(l.file_size_bytes)),
            q(&fmt_size(l.output_bytes)),
            q(&fmt_size(l.tmp_bytes)),
            q(&fmt_size(l.scratch_bytes)),
        ));
        match l.cpu_milli {
            Some(m) => s.push_str(&format!("cpus = {}\n", m as f64 / 1000.0)),
            None => s.push_str("# cpus: no quota\n"),
        }
        let degraded: Vec<String> = p
            .allow_degraded
            .iter()
            .map(|d| d.name().to_owned())
            .collect();
        s.push_str(&format!(
            "\n[layers]\nallow_degraded = {}\nallow_ptrace = {}\n",
            list(&degraded),
            p.allow_ptrace
        ));
        s
    }
}

/// A size in its shortest exact form: `2GiB`, `1536KiB`, `1000B`.
pub fn fmt_size(b: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}B")
}

/// A duration in ms in its shortest exact form: `10m`, `90s`, `1500ms`.
pub fn fmt_ms(ms: u64) -> String {
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The JSON Schema (draft 2020-12) of policy files, for editors. A unit test holds it to the
/// parser: every property it lists is accepted, and every field the parser accepts is listed.
pub fn json_schema() -> serde_json::Value {
    use serde_json::json;
    let strings = |d: &str| json!({"type": "array", "items": {"type": "string"}, "description": d});
    let size =
        |d: &str| json!({"type": ["string", "integer"], "description": d, "examples": ["512MiB"]});
    let dur = |d: &str| json!({"type": "string", "description": d, "examples": ["30s", "10m"]});
    let count = |d: &str| json!({"type": "integer", "minimum": 1, "description": d});
    let table = |props: serde_json::Value| json!({"type": "object", "additionalProperties": false, "properties": props});
    let mut props = json!({
        "profiles": {"type": "array", "items": {"enum": crate::profile::names()}, "description": "built-in profiles applied first, in order"},
        "hostname": {"type": "string", "description": "host name inside (RFC 1123), default `sandbox`"},
        "filesystem": table(json!({
            "scratch": {"type": "string", "description": "absolute path of a host directory mounted read-write at /workspace; absent: a fresh tmpfs"},
            "workspace": {"type": "string", "description": "absolute path of a host directory seen at /workspace through a copy-on-write overlay: never written during the run; the changes are kept as a change set to review and apply (docs/workspace.md)"},
            "keep_scratch": {"type": "boolean", "description": "use a host temporary directory as scratch and keep it"},
            "ro": strings("host paths visible read-only: HOST or HOST:INSIDE"),
            "rw": strings("host paths visible read-write: HOST or HOST:INSIDE"),
            "protect": strings("more paths, relative to a host scratch, kept read-only inside"),
            "unprotect": strings("default protected paths made writable again"),
        })),
        "env": table(json!({
            "set": {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "description": "variables set inside"},
            "pass": strings("variables whose values the caller gives from its own environment (palisade run: its own)"),
        })),
        "network": table(json!({
            "allow": strings("egress rules: HOST, *.DOMAIN, IP, [IPv6] or CIDR, optionally :PORT (default 80 and 443)"),
            "deny": strings("rules refused even where an allow rule matches"),
            "resolve": strings("HOST=IP pins for the proxy's upstream lookups (tests, special setups)"),
            "dns_server": {"type": "string", "description": "IP[:PORT] of the DNS server the proxy asks for allowed names' addresses instead of the system resolver (port 53 by default)"},
            "local_ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "maxItems": MAX_LOCAL_PORTS, "description": "TCP ports code inside may listen on and connect to"},
            "inspect": {"type": ["boolean", "array"], "items": {"type": "string"}, "description": "TLS inspection: true for every allowed host, or the hosts (HOST, *.DOMAIN, optionally :PORT) whose TLS the proxy terminates to check each request; hosts with HTTP rules or secrets are inspected anyway"},
            "no_inspect": strings("hosts never inspected (certificate pinning, mutual TLS): HOST or *.DOMAIN, optionally :PORT"),
            "http": strings("HTTP rules: METHODS HOST[:PORT][/PATH], e.g. `GET,HEAD pypi.org/simple/**`; METHODS may be * or read-only, HOST may be *"),
            "max_body": size("the largest request body the proxy forwards (requests it reads: plain HTTP and inspected TLS)"),
            "secrets": strings("NAME@HOST[:PORT][=env:VAR|=file:/PATH]: $NAME inside holds a placeholder, which the proxy replaces with the value in requests to HOST only"),
            "upstream_ca": {"type": "string", "description": "a CA file (PEM, host path) that inspected hosts are verified against instead of the host's trust store"},
        })),
        "limits": table(json!({
            "timeout": dur("wall-clock limit for the whole run (default 10m)"),
            "cpu_time": dur("CPU time of all processes together (default: the timeout)"),
            "memory": size("memory of the whole sandbox (default 2GiB)"),
            "pids": count("processes and threads (default 1024)"),
            "open_files": count("open files per process (default 1024)"),
            "file_size": size("largest file written (default 1GiB)"),
            "output": size("stdout plus stderr (default 64MiB)"),
            "tmp_size": size("/tmp tmpfs size (default 256MiB)"),
            "scratch_size": size("ephemeral scratch tmpfs size, and the most a workspace's changes may hold (default 1GiB)"),
            "cpus": {"type": ["number", "string"], "description": "CPU quota, e.g. 0.5 or 2 (default: none)", "examples": [0.5]},
        })),
        "layers": table(json!({
            "allow_degraded": {"type": "array", "items": {"enum": ["cgroup", "landlock"]}, "description": "layers to run without where the host has none (reported)"},
            "allow_ptrace": {"type": "boolean", "description": "let processes inside trace one another"},
        })),
    });
    // [bounds] takes the same fields but those that bound nothing.
    let mut bounds = props.clone();
    let b = bounds.as_object_mut().expect("an object");
    b.remove("hostname");
    b["env"]["properties"]
        .as_object_mut()
        .expect("an object")
        .remove("set");
    b["network"]["properties"]
        .as_object_mut()
        .expect("an object")
        .remove("local_ports");
    props.as_object_mut().expect("an object").insert(
        "bounds".to_owned(),
        json!({"type": "object", "additionalProperties": false, "properties": bounds, "description": "the most a policy run under this file may ask for, beyond the file's own values (a server's requests; the command-line options): values replace them, lists add; without it, the file's own values are the most"}),
    );
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/palisade-sandbox/palisade/docs/policy.schema.json",
        "title": "palisade policy file",
        "description": "docs/policy.md: every field optional; lists add to the profiles' and defaults', values replace them; command-line options override the file.",
        "type": "object",
        "additionalProperties": false,
        "properties": props,
    })
}

/// Reads `text` as a policy file, renders the policy it gives onto the defaults, and reads that
/// back: the fuzz target's and the tests' check that `palisade policy show` prints what reads
/// back to the same policy. `None` when `text` is not a valid file or gives no valid policy;
/// otherwise the policy, the policy read back from the rendering, and the rendering (the two
/// policies must be equal). Panics when the rendering does not parse.
#[doc(hidden)]
pub fn read_render_read(text: &str) -> Option<(Policy, Policy, String)> {
    let f = PolicyFile::parse("fuzz.toml", text).ok()?;
    let mut p = Policy::new(["true"]).ok()?;
    layer(&mut p, &[&f.overlay]).ok()?;
    p.validate_values().ok()?;
    let shown = PolicyFile::render(&p);
    let back = PolicyFile::parse("shown.toml", &shown)
        .unwrap_or_else(|e| panic!("a rendered policy does not read back: {e}\n{shown}"));
    assert!(back.bounds.is_none() && back.overlay.profiles.is_empty());
    let mut q = Policy::new(["true"]).ok()?;
    layer(&mut q, &[&back.overlay]).expect("no profiles");
    // `show` writes the CPU time out where it defaults to the timeout.
    p.limits = p.limits.resolved();
    Some((p, q, shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LimitsOverlay;

    fn err(text: &str) -> FileError {
        PolicyFile::parse("p.toml", text).expect_err(text)
    }

    /// Broken files and the exact message each gets: the place, the field, the value, and what
    /// is accepted.
    #[test]
    fn broken_files_get_the_line_the_field_and_what_is_accepted() {
        let cases: &[(&str, usize, usize, &str)] = &[
            ("[limits]\nmemory = \"lots\"\n", 2, 10, "invalid limits.memory `lots`: expected a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB"),
            ("[limits]\nmemory = true\n", 2, 10, "limits.memory: expected a size such as \"512MiB\" or a number of bytes, found boolean `true`"),
            ("[limits]\nmemory = \"512k\"\n", 2, 10, "invalid limits.memory `524288`: expected a size between 1 MiB and 1 TiB"),
            ("[limits]\ntimeout = \"10\"\n", 2, 11, "invalid limits.timeout `10`: expected a positive number with a unit: ms, s, m or h (e.g. 30s, 1.5m), at most 7 days"),
            ("[limits]\ntimeout = 10\n", 2, 11, "limits.timeout: expected a duration with a unit, e.g. \"30s\" or \"10m\", found integer `10`"),
            ("[limits]\npids = 0\n", 2, 8, "invalid limits.pids `0`: expected a positive whole number within the field's range"),
            ("[limits]\ncpus = \"half\"\n", 2, 8, "invalid limits.cpus `half`: expected a number of CPUs between 0.01 and 4096, e.g. 0.5 or 2"),
            ("[limits]\nmemroy = \"1G\"\n", 2, 1, "unknown field `memroy`, expected one of `timeout`, `cpu_time`, `memory`, `pids`, `open_files`, `file_size`, `output`, `tmp_size`, `scratch_size`, `cpus`"),
            ("[envv]\n", 1, 2, "unknown field `envv`, expected one of `bounds`, `profiles`, `hostname`, `filesystem`, `env`, `network`, `limits`, `layers`"),
            ("profiles = [\"pyton\"]\n", 1, 12, "profiles: unknown profile `pyton`; the built-in ones are: default, python, pypi, node, npm, shell, build"),
            ("profiles = \"python\"\n", 1, 12, "profiles: expected an array of strings, e.g. [\"a\", \"b\"], found string `\"python\"`"),
            ("[network]\nallow = [\"*\"]\n", 2, 9, "invalid network.allow `*`: expected a host without `*`, or `*.DOMAIN` for subdomains; a bare `*` would allow everything, so it is refused"),
            ("[network]\nlocal_ports = [0]\n", 2, 15, "network.local_ports: expected an array of TCP ports from 1 to 65535, e.g. [8000], found array `[0]`"),
            ("[filesystem]\nro = [\"rel\"]\n", 2, 6, "invalid filesystem.ro `rel`: expected an absolute host path, optionally followed by `:` and an absolute path inside"),
            ("[filesystem]\nscratch = \"proj\"\n", 2, 11, "invalid filesystem.scratch `proj`: expected an absolute path of a host directory"),
            ("[filesystem]\nprotect = [\"../x\"]\n", 2, 11, "invalid filesystem.protect `../x`: expected a path relative to the scratch directory, e.g. `.git/hooks` (no leading `/`, no `.` or `..`)"),
            ("[env]\nset = { \"1X\" = \"a\" }\n", 2, 9, "invalid env.set `1X`: expected a name of letters, digits and `_` that does not start with a digit"),
            ("[env]\nset = { A = 1 }\n", 2, 13, "env.set.A: expected a string, found integer `1`"),
            ("[env]\nset = { A = \"1\" }\npass = [\"A\"]\n", 3, 8, "env.pass: `A` is named twice (in env.set or env.pass); name each variable once"),
            ("[env]\npass = [\"A\", \"A\"]\n", 2, 8, "env.pass: `A` is named twice (in env.set or env.pass); name each variable once"),
            ("[env]\npass = [\"1A\"]\n", 2, 8, "invalid env.pass `1A`: expected a name of letters, digits and `_` that does not start with a digit"),
            ("[network]\nresolve = [\"x\"]\n", 2, 11, "invalid network.resolve `x`: expected HOST=IP, e.g. example.org=198.51.100.10 or example.org=[2001:db8::10]"),
            ("[filesystem]\nrw = [\"/a:b\"]\n", 2, 6, "invalid filesystem.rw `b`: expected an absolute path without `.` or `..` components or NUL bytes"),
            ("[bounds]\nhostname = \"x\"\n", 2, 12, "bounds.hostname: not a bound (a policy may set it freely, or it is the ceiling itself); remove it from [bounds]"),
            ("[bounds.env]\nset = { A = \"1\" }\n", 2, 7, "bounds.env.set: not a bound (a policy may set it freely, or it is the ceiling itself); remove it from [bounds]"),
            ("[bounds.network]\nlocal_ports = [80]\n", 2, 15, "bounds.network.local_ports: not a bound (a policy may set it freely, or it is the ceiling itself); remove it from [bounds]"),
            ("[bounds.bounds]\n", 1, 1, "bounds.bounds: not a bound (a policy may set it freely, or it is the ceiling itself); remove it from [bounds]"),
            ("[bounds.limits]\nmemory = \"lots\"\n", 2, 10, "in [bounds]: invalid limits.memory `lots`: expected a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB"),
            ("[bounds.limits]\nmemroy = 1\n", 2, 1, "unknown field `memroy`, expected one of `timeout`, `cpu_time`, `memory`, `pids`, `open_files`, `file_size`, `output`, `tmp_size`, `scratch_size`, `cpus`"),
            ("[layers]\nallow_degraded = [\"seccomp\"]\n", 2, 18, "invalid layers.allow_degraded `seccomp`: expected one of: cgroup, landlock"),
            ("[layers]\nallow_ptrace = \"yes\"\n", 2, 16, "layers.allow_ptrace: expected true or false, found string `\"yes\"`"),
            ("[network]\nhttp = [\"get pypi.org\"]\n", 2, 8, "invalid network.http `get pypi.org`: expected methods in upper case, separated by commas (GET,HEAD,POST), each an HTTP token of at most 32 characters; or * for any, or read-only"),
            ("[network]\nhttp = [\"GET pypi.org/a/../b\"]\n", 2, 8, "invalid network.http `/a/../b`: expected a path pattern without `.` or `..` segments (requests with them are refused where rules apply)"),
            ("[network]\ninspect = \"yes\"\n", 2, 11, "network.inspect: expected true, false, or an array of hosts, e.g. [\"pypi.org\"], found string `\"yes\"`"),
            ("[network]\ninspect = [\"pypi.org:80\"]\n", 2, 11, "invalid network.inspect `pypi.org:80`: expected a TLS port (port 80 carries plain HTTP, which the proxy reads and checks without inspection)"),
            ("[network]\nno_inspect = [\"10.0.0.0/8\"]\n", 2, 14, "invalid network.no_inspect `10.0.0.0/8`: expected a host name or *.DOMAIN, optionally :PORT (an address gets a certificate only through `inspect = true`)"),
            ("[network]\nmax_body = \"big\"\n", 2, 12, "invalid network.max_body `big`: expected a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB"),
            ("[network]\nsecrets = [\"T@*.example.com\"]\n", 2, 11, "invalid network.secrets `T@*.example.com`: expected one host name for a secret's value: no wildcard and no address, so that it goes to exactly the host named"),
            ("[network]\nsecrets = [\"T@a.example\", \"T@b.example\"]\n", 2, 11, "network.secrets: `T` is named twice; one secret for one variable"),
            ("[network]\nupstream_ca = \"ca.pem\"\n", 2, 15, "invalid network.upstream_ca `ca.pem`: expected an absolute path of a PEM file on the host"),
        ];
        for (text, line, column, message) in cases {
            let e = err(text);
            assert_eq!(
                (e.line, e.column, e.message.as_str()),
                (*line, *column, *message),
                "{text}"
            );
        }
        // The rendering: file, line and column, the message, then the line itself.
        assert_eq!(
            err("[limits]\nmemory = \"lots\"\n").to_string(),
            "p.toml:2:10: invalid limits.memory `lots`: expected a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB\n    2 | memory = \"lots\""
        );
    }

    #[test]
    fn a_full_file_reads_into_validated_values() {
        let f = PolicyFile::parse(
            "p.toml",
            r#"
profiles = ["python", "pypi"]
hostname = "box"
[filesystem]
scratch = "/srv/proj"
keep_scratch = false
ro = ["/opt/data", "/srv/x:/data"]
rw = ["/tmp/out:/out"]
protect = ["Makefile"]
unprotect = [".git/config"]
[env]
set = { MODE = "fast", A = "1" }
pass = ["TOKEN"]
[network]
allow = ["example.org:8443"]
deny = ["bad.example.org"]
resolve = ["example.org=203.0.113.7"]
dns_server = "[2001:db8::53]:5353"
local_ports = [8000]
inspect = ["pypi.org", "*.example.org:8443"]
no_inspect = ["pinned.example.org"]
http = ["GET,HEAD pypi.org/simple/**", "read-only *"]
max_body = "1MiB"
secrets = ["TOKEN@api.example.org", "KEY@example.org:8443=file:/run/key"]
upstream_ca = "/etc/corp-ca.pem"
[limits]
timeout = "90s"
cpu_time = "1m"
memory = 536870912
pids = 64
open_files = 256
file_size = "10MiB"
output = "1MiB"
tmp_size = "64MiB"
scratch_size = "128MiB"
cpus = 0.5
[layers]
allow_degraded = ["cgroup", "cgroup"]
allow_ptrace = true
"#,
        )
        .unwrap();
        assert!(f.bounds.is_none());
        let f = f.overlay;
        assert_eq!(f.profiles, ["python", "pypi"]);
        assert_eq!(f.hostname.as_deref(), Some("box"));
        assert_eq!(f.scratch, Some(PathBuf::from("/srv/proj")));
        assert_eq!(f.keep_scratch, Some(false));
        assert_eq!(f.binds.len(), 3);
        assert_eq!(f.binds[1].target.as_str(), "/data");
        assert!(f.binds[2].writable);
        let paths = |v: &[crate::protect::ProtectedPath]| -> Vec<String> {
            v.iter().map(|p| p.as_str().to_owned()).collect()
        };
        assert_eq!(paths(&f.protect), ["Makefile"]);
        assert_eq!(paths(&f.unprotect), [".git/config"]);
        // In the file's order, not sorted.
        assert_eq!(
            f.env_set,
            [
                EnvVar::new("MODE", "fast").unwrap(),
                EnvVar::new("A", "1").unwrap()
            ]
        );
        assert_eq!(f.env_pass, [EnvName::new("TOKEN").unwrap()]);
        assert_eq!(f.allow_net[0].to_string(), "example.org:8443");
        assert_eq!(f.resolve[0].to_string(), "example.org=203.0.113.7");
        assert_eq!(f.dns_server, Some("[2001:db8::53]:5353".parse().unwrap()));
        assert_eq!(f.local_ports, [8000]);
        let shown = |v: Vec<String>| v.join(" ");
        assert_eq!(
            shown(f.inspect.iter().map(|r| r.to_string()).collect()),
            "pypi.org *.example.org:8443"
        );
        assert_eq!(f.inspect_all, None);
        assert_eq!(f.no_inspect[0].to_string(), "pinned.example.org");
        assert_eq!(
            shown(f.http.iter().map(|r| r.to_string()).collect()),
            "GET,HEAD pypi.org/simple/** GET,HEAD,OPTIONS *"
        );
        assert_eq!(f.max_body, Some(1 << 20));
        assert_eq!(
            shown(f.secrets.iter().map(|r| r.to_string()).collect()),
            "TOKEN@api.example.org KEY@example.org:8443=file:/run/key"
        );
        assert_eq!(f.upstream_ca, Some(PathBuf::from("/etc/corp-ca.pem")));
        assert_eq!(
            f.limits,
            LimitsOverlay {
                timeout_ms: Some(90_000),
                cpu_time_ms: Some(60_000),
                memory_bytes: Some(512 << 20),
                pids: Some(64),
                open_files: Some(256),
                file_size_bytes: Some(10 << 20),
                output_bytes: Some(1 << 20),
                tmp_bytes: Some(64 << 20),
                scratch_bytes: Some(128 << 20),
                cpu_milli: Some(500),
            }
        );
        assert_eq!(f.allow_degraded, [Degradable::Cgroup]);
        assert_eq!(f.allow_ptrace, Some(true));
        assert_eq!(f.tty, None);
        assert_eq!(
            PolicyFile::parse("e.toml", "").unwrap(),
            PolicyFile::default()
        );
    }

    /// `policy show` prints a file that reads back to the same policy: every field.
    #[test]
    fn the_rendered_policy_reads_back_to_itself() {
        let mut p = Policy::new(["true"]).unwrap();
        p.hostname = "box".into();
        p.scratch = Scratch::Host {
            path: "/srv/proj".into(),
        };
        p.keep_scratch = true;
        p.binds.push(Bind::parse("/opt/data", false).unwrap());
        p.binds.push(Bind::parse("/tmp/out:/out", true).unwrap());
        p.env.push(EnvVar::new("Z", "x \"y\"").unwrap());
        p.env.push(EnvVar::new("A", "").unwrap());
        p.env_pass.push(EnvName::new("TOKEN").unwrap());
        p.network
            .allow
            .push(NetRule::parse("t", "*.example.org:8443").unwrap());
        p.network
            .allow
            .push(NetRule::parse("t", "[2001:db8::/32]").unwrap());
        p.network
            .deny
            .push(NetRule::parse("t", "bad.example.org").unwrap());
        p.network
            .resolve
            .push(Pin::parse("a.example.org=2001:db8::7").unwrap());
        p.network.local_ports.push(8000);
        p.network.dns_server = Some("198.51.100.53:53".parse().unwrap());
        p.network
            .inspect
            .push(NetRule::parse("t", "*.example.org").unwrap());
        p.network
            .no_inspect
            .push(NetRule::parse("t", "pinned.example.org:8443").unwrap());
        p.network
            .http
            .push(crate::http::HttpRule::parse("t", "GET,HEAD a.example.org/simple/**").unwrap());
        p.network
            .http
            .push(crate::http::HttpRule::parse("t", "* [2001:db8::/32]:8443").unwrap());
        p.network.max_body = Some(1536 << 10);
        p.network
            .secrets
            .push(Secret::parse("t", "API_KEY@a.example.org:8443=env:GH").unwrap());
        p.network.upstream_ca = Some("/etc/corp-ca.pem".into());
        p.limits = crate::Limits {
            timeout_ms: 1500,
            cpu_time_ms: None,
            output_bytes: 1000,
            pids: 7,
            open_files: 9,
            file_size_bytes: 1536 << 10,
            memory_bytes: 3 << 29,
            cpu_milli: Some(250),
            tmp_bytes: 5 << 20,
            scratch_bytes: 3 << 30,
        };
        p.protected.retain(|x| x != ".git/config");
        p.protected.push("Makefile".into());
        p.allow_degraded.push(Degradable::Landlock);
        p.allow_ptrace = true;
        p.validate_values().unwrap();
        let text = PolicyFile::render(&p);
        let (read, back, shown) = read_render_read(&text).unwrap_or_else(|| panic!("{text}"));
        // `show` writes the CPU time out (it defaults to the timeout).
        p.limits.cpu_time_ms = Some(1500);
        assert_eq!(read, p, "{text}");
        assert_eq!(back, p, "{shown}");
        assert_eq!(shown, text);
        // Every built-in profile, alone, round-trips too.
        for name in crate::profile::names() {
            let text = format!("profiles = [\"{name}\"]\n");
            let (read, back, shown) = read_render_read(&text).unwrap();
            assert_eq!(read, back, "{name}: {shown}");
        }
    }

    /// The JSON Schema and the parser describe the same fields: each property the schema lists
    /// is accepted with its example value, and each field the parser accepts (its "expected one
    /// of" list for an unknown field) is in the schema.
    #[test]
    fn the_schema_lists_exactly_the_fields_the_parser_accepts() {
        let schema = json_schema();
        let props = schema["properties"].as_object().unwrap();
        let accepted = |table: &str| -> Vec<String> {
            let text = if table.is_empty() {
                "zzz = 1\n".to_owned()
            } else {
                format!("[{table}]\nzzz = 1\n")
            };
            let m = err(&text).message;
            let list = m.split("expected ").nth(1).unwrap_or_else(|| panic!("{m}"));
            let list = list.trim_start_matches("one of ").replace(" or ", ", ");
            list.split(", ")
                .map(|s| s.trim_matches('`').to_owned())
                .collect()
        };
        let mut top: Vec<String> = props.keys().cloned().collect();
        let mut parser_top = accepted("");
        top.sort();
        parser_top.sort();
        assert_eq!(top, parser_top);
        for (name, p) in props {
            let Some(sub) = p.get("properties").and_then(|s| s.as_object()) else {
                continue;
            };
            let mut keys: Vec<String> = sub.keys().cloned().collect();
            let mut parsed = accepted(name);
            if name == "bounds" {
                // The parser refuses these in [bounds] with a message of their own.
                for refused in ["bounds", "hostname"] {
                    assert!(err(&format!("[bounds]\n{refused} = 1\n"))
                        .message
                        .contains("not a bound"));
                }
                parsed.retain(|k| k != "bounds" && k != "hostname");
                for (table, field) in [("env", "set"), ("network", "local_ports")] {
                    let t = &sub[table]["properties"];
                    assert!(t.get(field).is_none(), "bounds.{table}.{field}");
                    assert_eq!(
                        t.as_object().unwrap().len() + 1,
                        props[table]["properties"].as_object().unwrap().len()
                    );
                }
            }
            keys.sort();
            parsed.sort();
            assert_eq!(keys, parsed, "[{name}]");
        }
        let committed = include_str!("../../../docs/policy.schema.json");
        let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        assert_eq!(
            committed, generated,
            "docs/policy.schema.json is stale: run `palisade policy schema > docs/policy.schema.json`"
        );
    }

    /// `filesystem.workspace`: read, rendered back, and refused beside `filesystem.scratch`.
    #[test]
    fn a_workspace_reads_renders_and_excludes_a_scratch() {
        let f = PolicyFile::parse("w.toml", "[filesystem]\nworkspace = \"/srv/proj\"\n").unwrap();
        assert_eq!(f.overlay.workspace, Some(PathBuf::from("/srv/proj")));
        let mut p = Policy::new(["true"]).unwrap();
        layer(&mut p, &[&f.overlay]).unwrap();
        assert_eq!(
            p.scratch,
            Scratch::Workspace {
                path: "/srv/proj".into()
            }
        );
        let (read, back, shown) = read_render_read(&PolicyFile::render(&p)).unwrap();
        p.limits = p.limits.resolved();
        assert_eq!((&read, &back), (&p, &p), "{shown}");
        assert!(shown.contains("workspace = \"/srv/proj\""), "{shown}");
        let e = err("[filesystem]\nscratch = \"/a\"\nworkspace = \"/b\"\n");
        assert_eq!((e.line, e.column), (3, 13));
        assert!(e.message.contains("not both"), "{}", e.message);
        let e = err("[filesystem]\nworkspace = \"b\"\n");
        assert_eq!(
            e.message,
            "invalid filesystem.workspace `b`: expected an absolute path of a host directory"
        );
        // A kept scratch means nothing for a workspace, whose changes are kept anyway.
        p.keep_scratch = true;
        assert_eq!(
            p.validate().unwrap_err().field(),
            Some("filesystem.keep_scratch")
        );
    }

    #[test]
    fn sizes_and_durations_render_in_their_shortest_exact_form() {
        assert_eq!(fmt_size(2 << 30), "2GiB");
        assert_eq!(fmt_size(1536 << 10), "1536KiB");
        assert_eq!(fmt_size(1000), "1000B");
        assert_eq!(fmt_ms(600_000), "10m");
        assert_eq!(fmt_ms(7_200_000), "2h");
        assert_eq!(fmt_ms(90_000), "90s");
        assert_eq!(fmt_ms(1500), "1500ms");
    }
}
