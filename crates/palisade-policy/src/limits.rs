//! Limits enforced by the supervisor, and the parsers for their human forms.

use crate::PolicyError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest accepted wall-clock timeout: one week.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest accepted output cap: 1 TiB.
pub const MAX_OUTPUT: u64 = 1 << 40;

/// Ceilings of one run. Every one has a default, so a user who sets nothing is still protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time after which the whole sandbox is killed (status `timeout`), in ms.
    #[serde(default = "Limits::default_timeout_ms")]
    pub timeout_ms: u64,
    /// CPU time of all processes together (user plus system), in ms, after which the whole
    /// sandbox is killed (status `cpu-timeout`). Unset: the wall-clock timeout, so a program on one
    /// CPU is never stopped for CPU before its deadline, while one that burns several CPUs at once
    /// is stopped sooner.
    #[serde(default)]
    pub cpu_time_ms: Option<u64>,
    /// Bytes of stdout plus stderr relayed before the sandbox is killed (status `output-limit`).
    #[serde(default = "Limits::default_output_bytes")]
    pub output_bytes: u64,
    /// Processes and threads of the payload's uid inside the sandbox (`RLIMIT_NPROC`, which the
    /// kernel counts per user namespace), init included.
    #[serde(default = "Limits::default_pids")]
    pub pids: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    #[serde(default = "Limits::default_open_files")]
    pub open_files: u64,
    /// Largest file a process may write (`RLIMIT_FSIZE`; past it, SIGXFSZ).
    #[serde(default = "Limits::default_file_size")]
    pub file_size_bytes: u64,
    /// Memory of the whole sandbox, tmpfs contents included, swap off (cgroup).
    #[serde(default = "Limits::default_memory")]
    pub memory_bytes: u64,
    /// CPU share for all processes together, in thousandths of a CPU (500 = half a CPU). Unset:
    /// no quota. Opt-in because on cgroup v1 the extra cpu hierarchy costs ~0.3 ms per start, and
    /// the wall-clock timeout already bounds a runaway loop.
    #[serde(default)]
    pub cpu_milli: Option<u64>,
    /// Size of the `/tmp` tmpfs.
    #[serde(default = "Limits::default_tmp")]
    pub tmp_bytes: u64,
    /// Size of the ephemeral scratch tmpfs (a host `filesystem.scratch` is not capped by palisade).
    #[serde(default = "Limits::default_scratch")]
    pub scratch_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: Self::default_timeout_ms(),
            cpu_time_ms: None,
            output_bytes: Self::default_output_bytes(),
            pids: Self::default_pids(),
            open_files: Self::default_open_files(),
            file_size_bytes: Self::default_file_size(),
            memory_bytes: Self::default_memory(),
            cpu_milli: None,
            tmp_bytes: Self::default_tmp(),
            scratch_bytes: Self::default_scratch(),
        }
    }
}

impl Limits {
    fn default_timeout_ms() -> u64 {
        10 * 60 * 1000
    }
    fn default_output_bytes() -> u64 {
        64 << 20
    }
    fn default_pids() -> u64 {
        1024
    }
    fn default_open_files() -> u64 {
        1024
    }
    fn default_file_size() -> u64 {
        1 << 30
    }
    fn default_memory() -> u64 {
        2 << 30
    }
    fn default_tmp() -> u64 {
        256 << 20
    }
    fn default_scratch() -> u64 {
        1 << 30
    }

    /// The CPU quota in µs per 100 ms period, if one was asked for.
    ///
    /// ```
    /// use palisade_policy::Limits;
    /// let mut l = Limits::default();
    /// assert_eq!(l.cpu_quota_us(), None);
    /// l.cpu_milli = Some(500);
    /// assert_eq!(l.cpu_quota_us(), Some(50_000));
    /// ```
    pub fn cpu_quota_us(&self) -> Option<u64> {
        self.cpu_milli.map(|m| m * 100)
    }

    /// The timeout as a `Duration`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The CPU-time limit in force: the one set, or else the wall-clock timeout.
    ///
    /// ```
    /// use palisade_policy::Limits;
    /// use std::time::Duration;
    /// let mut l = Limits::default();
    /// assert_eq!(l.cpu_time(), l.timeout());
    /// l.cpu_time_ms = Some(1500);
    /// assert_eq!(l.cpu_time(), Duration::from_millis(1500));
    /// ```
    pub fn cpu_time(&self) -> Duration {
        Duration::from_millis(self.cpu_time_ms.unwrap_or(self.timeout_ms))
    }

    /// The same limits with every derived default written out (for the report).
    pub fn resolved(mut self) -> Limits {
        self.cpu_time_ms = Some(self.cpu_time().as_millis() as u64);
        self
    }

    /// Checks ranges (for values that came from a file rather than the parsers below). Errors
    /// name the policy-file field (`limits.memory`).
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT.as_millis() as u64 {
            return Err(PolicyError::invalid(
                "limits.timeout",
                &self.timeout_ms.to_string(),
                "a wall-clock time between 1 ms and 7 days",
            ));
        }
        if let Some(c) = self.cpu_time_ms {
            if c == 0 || c > MAX_TIMEOUT.as_millis() as u64 {
                return Err(PolicyError::invalid(
                    "limits.cpu_time",
                    &c.to_string(),
                    "a CPU time between 1 ms and 7 days",
                ));
            }
        }
        if self.output_bytes == 0 || self.output_bytes > MAX_OUTPUT {
            return Err(PolicyError::invalid(
                "limits.output",
                &self.output_bytes.to_string(),
                "a size between 1 byte and 1 TiB",
            ));
        }
        let count = |field: &'static str, v: u64, max: u64, expected: &'static str| {
            if v == 0 || v > max {
                Err(PolicyError::invalid(field, &v.to_string(), expected))
            } else {
                Ok(())
            }
        };
        count(
            "limits.pids",
            self.pids,
            MAX_PIDS,
            "a number of processes between 1 and 4194304",
        )?;
        count(
            "limits.open_files",
            self.open_files,
            MAX_OPEN_FILES,
            "a number of descriptors between 1 and 1048576",
        )?;
        count(
            "limits.file_size",
            self.file_size_bytes,
            MAX_OUTPUT,
            "a size between 1 byte and 1 TiB",
        )?;
        if let Some(m) = self.cpu_milli {
            if !(10..=MAX_CPUS * 1000).contains(&m) {
                return Err(PolicyError::invalid(
                    "limits.cpus",
                    &m.to_string(),
                    "between 0.01 and 4096 CPUs",
                ));
            }
        }
        for (field, v) in [
            ("limits.tmp_size", self.tmp_bytes),
            ("limits.scratch_size", self.scratch_bytes),
        ] {
            if !(1 << 20..=MAX_OUTPUT).contains(&v) {
                return Err(PolicyError::invalid(
                    field,
                    &v.to_string(),
                    "a size between 1 MiB and 1 TiB",
                ));
            }
        }
        count(
            "limits.memory",
            self.memory_bytes,
            MAX_OUTPUT,
            "a size between 1 MiB and 1 TiB",
        )?;
        if self.memory_bytes < 1 << 20 {
            return Err(PolicyError::invalid(
                "limits.memory",
                &self.memory_bytes.to_string(),
                "a size between 1 MiB and 1 TiB",
            ));
        }
        Ok(())
    }
}

/// Most CPUs a quota may name.
pub const MAX_CPUS: u64 = 4096;

/// Parses a CPU share such as `0.5`, `2` or `1.25` into thousandths of a CPU.
///
/// ```
/// use palisade_policy::parse_cpus;
/// assert_eq!(parse_cpus("--cpus", "0.5").unwrap(), 500);
/// assert!(parse_cpus("--cpus", "0").is_err());
/// assert!(parse_cpus("--cpus", "half").is_err());
/// ```
pub fn parse_cpus(field: &'static str, s: &str) -> Result<u64, PolicyError> {
    const EXPECTED: &str = "a number of CPUs between 0.01 and 4096, e.g. 0.5 or 2";
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| PolicyError::invalid(field, s, EXPECTED))?;
    if !v.is_finite() || !(0.01..=MAX_CPUS as f64).contains(&v) {
        return Err(PolicyError::invalid(field, s, EXPECTED));
    }
    Ok((v * 1000.0).round() as u64)
}

/// Largest accepted process ceiling (the kernel's own `pid_max` ceiling).
pub const MAX_PIDS: u64 = 4_194_304;
/// Largest accepted open-files ceiling (the kernel's default `fs.nr_open`).
pub const MAX_OPEN_FILES: u64 = 1_048_576;

/// Parses a positive count no larger than `max`.
///
/// ```
/// use palisade_policy::parse_count;
/// assert_eq!(parse_count("--pids", "32", 100).unwrap(), 32);
/// assert!(parse_count("--pids", "0", 100).is_err());
/// assert!(parse_count("--pids", "101", 100).is_err());
/// ```
pub fn parse_count(field: &'static str, s: &str, max: u64) -> Result<u64, PolicyError> {
    const EXPECTED: &str = "a positive whole number within the field's range";
    match s.trim().parse::<u64>() {
        Ok(v) if v > 0 && v <= max => Ok(v),
        _ => Err(PolicyError::invalid(field, s, EXPECTED)),
    }
}

/// Parses a duration: a positive number with a unit, `ms`, `s`, `m` or `h` (`1.5s`, `500ms`,
/// `10m`). A bare number is refused: the unit is never guessed.
///
/// ```
/// use palisade_policy::parse_duration;
/// use std::time::Duration;
/// assert_eq!(parse_duration("timeout", "1.5s").unwrap(), Duration::from_millis(1500));
/// assert!(parse_duration("timeout", "0s").is_err());
/// assert!(parse_duration("timeout", "10").is_err());
/// ```
pub fn parse_duration(field: &'static str, s: &str) -> Result<Duration, PolicyError> {
    const EXPECTED: &str =
        "a positive number with a unit: ms, s, m or h (e.g. 30s, 1.5m), at most 7 days";
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(PolicyError::invalid(field, s, EXPECTED)),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| PolicyError::invalid(field, s, EXPECTED))?;
    let secs = v * scale;
    if !secs.is_finite() || secs < 0.001 || secs > MAX_TIMEOUT.as_secs_f64() {
        return Err(PolicyError::invalid(field, s, EXPECTED));
    }
    Ok(Duration::from_millis((secs * 1000.0).round() as u64))
}

/// Parses a size: a positive integer with an optional unit, `k`/`KiB`, `m`/`MiB`, `g`/`GiB`, `t`/`TiB`
/// (powers of 1024) or `kB`, `MB`, `GB` (powers of 1000); bare numbers are bytes.
///
/// ```
/// use palisade_policy::parse_size;
/// assert_eq!(parse_size("output-limit", "1MiB").unwrap(), 1 << 20);
/// assert_eq!(parse_size("output-limit", "512").unwrap(), 512);
/// assert!(parse_size("output-limit", "-1").is_err());
/// ```
pub fn parse_size(field: &'static str, s: &str) -> Result<u64, PolicyError> {
    const EXPECTED: &str = "a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB";
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit {
        "" | "B" => 1,
        "k" | "K" | "KiB" => 1 << 10,
        "m" | "M" | "MiB" => 1 << 20,
        "g" | "G" | "GiB" => 1 << 30,
        "t" | "T" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(PolicyError::invalid(field, s, EXPECTED)),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| PolicyError::invalid(field, s, EXPECTED))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 && v <= MAX_OUTPUT => Ok(v),
        _ => Err(PolicyError::invalid(field, s, EXPECTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("t", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_duration("t", "10m").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse_duration("t", "2h").unwrap(),
            Duration::from_secs(7200)
        );
        for bad in [
            "", "s", "10", "-1s", "1x", "1e3s", "0ms", "0.0001s", "999h", "1.2.3s", "NaNs",
        ] {
            let e = parse_duration("timeout", bad).unwrap_err().to_string();
            assert!(e.contains("timeout") && e.contains("unit"), "{bad}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("o", "64k").unwrap(), 65536);
        assert_eq!(parse_size("o", "2GB").unwrap(), 2_000_000_000);
        for bad in ["", "0", "-5", "1.5M", "5X", "18446744073709551615T", "2T"] {
            let e = parse_size("output-limit", bad).unwrap_err().to_string();
            assert!(e.contains("output-limit"), "{bad}: {e}");
        }
    }

    #[test]
    fn defaults_are_on_and_valid() {
        let l = Limits::default();
        assert_eq!(l.timeout(), Duration::from_secs(600));
        assert_eq!(l.output_bytes, 64 << 20);
        l.validate().unwrap();
        assert!(Limits { timeout_ms: 0, ..l }.validate().is_err());
        let e = Limits {
            cpu_time_ms: Some(0),
            ..l
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("limits.cpu_time"), "{e}");
        assert_eq!(l.resolved().cpu_time_ms, Some(600_000));
        assert!(Limits {
            output_bytes: 0,
            ..l
        }
        .validate()
        .is_err());
    }
}
