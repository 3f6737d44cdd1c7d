//! Policy files: one TOML schema for everything the CLI can express (docs/policy.md).
//!
//! A file is read in two steps. TOML and its shape first — unknown tables and fields, wrong
//! types — then every value through the same parsers the CLI uses (sizes, durations, host rules,
//! paths, names), so that a value that passes here is as valid as one from the command line. Each
//! error carries the file, line and column of the value, the field, the value and what is
//! accepted. Nothing here reads the host: a file is data until the caller applies it.
//!
//! A file is an overlay, not a whole policy: fields it leaves out keep the value they had
//! (defaults, then the profiles, then the file, then command-line options; lists add up).

use crate::net::{NetRule, Pin, MAX_LOCAL_PORTS};
use crate::{parse_count, parse_cpus, parse_duration, parse_size, Bind, Degradable, EnvName};
use crate::{EnvVar, Policy, PolicyError, Scratch, MAX_OPEN_FILES, MAX_PIDS};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use toml::{Spanned, Value};

/// A policy file or profile, validated: every value is ready to use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyFile {
    /// Built-in profiles to apply first, in order.
    pub profiles: Vec<String>,
    pub hostname: Option<String>,
    pub scratch: Option<PathBuf>,
    pub keep_scratch: Option<bool>,
    pub binds: Vec<Bind>,
    /// More paths under the scratch directory kept read-only inside.
    pub protect: Vec<String>,
    /// Default protected paths made writable again.
    pub unprotect: Vec<String>,
    pub env_set: Vec<EnvVar>,
    /// Variables whose value is taken from the caller's environment when the policy is applied.
    pub env_pass: Vec<EnvName>,
    pub allow_net: Vec<NetRule>,
    pub deny_net: Vec<NetRule>,
    pub resolve: Vec<Pin>,
    pub local_ports: Vec<u16>,
    pub limits: LimitsOverlay,
    pub allow_degraded: Vec<Degradable>,
    pub allow_ptrace: Option<bool>,
}

/// The limits a file sets; `None` keeps the value in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsOverlay {
    pub timeout_ms: Option<u64>,
    pub cpu_time_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size_bytes: Option<u64>,
    pub output_bytes: Option<u64>,
    pub tmp_bytes: Option<u64>,
    pub scratch_bytes: Option<u64>,
    pub cpu_milli: Option<u64>,
}

impl LimitsOverlay {
    /// Writes the limits this overlay sets into `l`.
    pub fn apply(&self, l: &mut crate::Limits) {
        let set = |v: Option<u64>, t: &mut u64| {
            if let Some(v) = v {
                *t = v;
            }
        };
        set(self.timeout_ms, &mut l.timeout_ms);
        set(self.memory_bytes, &mut l.memory_bytes);
        set(self.pids, &mut l.pids);
        set(self.open_files, &mut l.open_files);
        set(self.file_size_bytes, &mut l.file_size_bytes);
        set(self.output_bytes, &mut l.output_bytes);
        set(self.tmp_bytes, &mut l.tmp_bytes);
        set(self.scratch_bytes, &mut l.scratch_bytes);
        if self.cpu_time_ms.is_some() {
            l.cpu_time_ms = self.cpu_time_ms;
        }
        if self.cpu_milli.is_some() {
            l.cpu_milli = self.cpu_milli;
        }
    }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
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
    local_ports: Option<V>,
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
    /// assert_eq!(f.limits.memory_bytes, Some(512 << 20));
    /// let e = PolicyFile::parse("p.toml", "[limits]\nmemory = \"lots\"\n").unwrap_err();
    /// assert_eq!((e.line, e.column), (2, 10));
    /// assert!(e.message.contains("limits.memory") && e.message.contains("lots"));
    /// ```
    pub fn parse(origin: &str, text: &str) -> Result<PolicyFile, FileError> {
        let src = Src { origin, text };
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let mut m = src.err(span, e.message().trim_end().to_owned());
            if e.span().is_none() {
                m.line = 0;
            }
            m
        })?;
        let mut f = PolicyFile::default();
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
            if let Some(v) = &fs.keep_scratch {
                f.keep_scratch = Some(src.bool("filesystem.keep_scratch", v)?);
            }
            for (field, writable, v) in [
                ("filesystem.ro", false, &fs.ro),
                ("filesystem.rw", true, &fs.rw),
            ] {
                if let Some(v) = v {
                    for (s, v) in src.strings(field, v)? {
                        let b = Bind::parse(s, writable)
                            .map_err(|e| src.policy(&v, e.in_field(field)))?;
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
                        list.push(p.as_str().to_owned());
                    }
                }
            }
        }
        if let Some(env) = &raw.env {
            if let Some(set) = &env.set {
                for (k, v) in set.get_ref() {
                    let name = EnvName::new(k.get_ref())
                        .map_err(|e| src.err(k.span(), e.in_field("env.set").to_string()))?;
                    let val = src.string(&format!("env.set.{}", k.get_ref()), v)?;
                    let var = EnvVar::new(name.as_str(), val)
                        .map_err(|e| src.policy(v, e.in_field("env.set")))?;
                    f.env_set.push(var);
                }
            }
            if let Some(v) = &env.pass {
                for (s, v) in src.strings("env.pass", v)? {
                    let n = EnvName::new(s).map_err(|e| src.policy(&v, e.in_field("env.pass")))?;
                    if f.env_set.iter().any(|e| e.name == n) {
                        return Err(src.err(
                            v.span(),
                            format!("env.pass: `{s}` is also in env.set; name each variable once"),
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
                    let p =
                        Pin::parse(s).map_err(|e| src.policy(&v, e.in_field("network.resolve")))?;
                    f.resolve.push(p);
                }
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
            // `Limits::validate` (memory under 1 MiB, a tmpfs under 1 MiB) is caught here too.
            let mut all = crate::Limits::default();
            o.apply(&mut all);
            all.validate().map_err(|e| FileError {
                origin: origin.to_owned(),
                line: 0,
                column: 0,
                source_line: String::new(),
                message: format!("limits: {e}"),
            })?;
        }
        if let Some(layers) = &raw.layers {
            if let Some(v) = &layers.allow_degraded {
                for (s, v) in src.strings("layers.allow_degraded", v)? {
                    let d = Degradable::parse(s)
                        .map_err(|e| src.policy(&v, e.in_field("layers.allow_degraded")))?;
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

    /// The effective policy written back as a policy file (`palisade policy show`): every field
    /// set, sizes and durations in their shortest exact form. Reading the text back gives the
    /// same policy, command aside.
    pub fn render(p: &Policy, keep_scratch: bool) -> String {
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
            Scratch::Ephemeral => s.push_str("# scratch: a fresh tmpfs (no host directory)\n"),
        }
        s.push_str(&format!("keep_scratch = {keep_scratch}\n"));
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
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/palisade-sandbox/palisade/docs/policy.schema.json",
        "title": "palisade policy file",
        "description": "docs/policy.md: every field optional; lists add to the profiles' and defaults', values replace them; command-line options override the file.",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "profiles": {"type": "array", "items": {"enum": crate::profile::names()}, "description": "built-in profiles applied first, in order"},
            "hostname": {"type": "string", "description": "host name inside (RFC 1123), default `sandbox`"},
            "filesystem": table(json!({
                "scratch": {"type": "string", "description": "absolute path of a host directory mounted read-write at /workspace; absent: a fresh tmpfs"},
                "keep_scratch": {"type": "boolean", "description": "use a host temporary directory as scratch and keep it"},
                "ro": strings("host paths visible read-only: HOST or HOST:INSIDE"),
                "rw": strings("host paths visible read-write: HOST or HOST:INSIDE"),
                "protect": strings("more paths, relative to a host scratch, kept read-only inside"),
                "unprotect": strings("default protected paths made writable again"),
            })),
            "env": table(json!({
                "set": {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "description": "variables set inside"},
                "pass": strings("variables copied from palisade's own environment"),
            })),
            "network": table(json!({
                "allow": strings("egress rules: HOST, *.DOMAIN, IP, [IPv6] or CIDR, optionally :PORT (default 80 and 443)"),
                "deny": strings("rules refused even where an allow rule matches"),
                "resolve": strings("HOST=IP pins for the proxy's upstream lookups (tests, special setups)"),
                "local_ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "maxItems": MAX_LOCAL_PORTS, "description": "TCP ports code inside may listen on and connect to"},
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
                "scratch_size": size("ephemeral scratch tmpfs size (default 1GiB)"),
                "cpus": {"type": ["number", "string"], "description": "CPU quota, e.g. 0.5 or 2 (default: none)", "examples": [0.5]},
            })),
            "layers": table(json!({
                "allow_degraded": {"type": "array", "items": {"enum": ["cgroup", "landlock"]}, "description": "layers to run without where the host has none (reported)"},
                "allow_ptrace": {"type": "boolean", "description": "let processes inside trace one another"},
            })),
        }
    })
}
