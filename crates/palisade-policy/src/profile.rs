//! Built-in profiles: small, composable presets, each a policy file (docs/profiles.md).
//!
//! A profile only ever adds what its workload needs on top of the defaults; `default` adds
//! nothing. They are applied in the order given, before the policy file's own fields and the
//! command-line options, so that both can override them.

/// Name, one-line summary, and the profile as policy-file text.
pub const PROFILES: &[(&str, &str, &str)] = &[
    (
        "default",
        "the strictest: nothing beyond the defaults (no network, 2GiB, 1024 processes, 10m)",
        "",
    ),
    (
        "python",
        "python3 scripts: unbuffered output, no .pyc files in scratch, pip never prompts; no network",
        r#"[env]
set = { PYTHONUNBUFFERED = "1", PYTHONDONTWRITEBYTECODE = "1", PIP_NO_INPUT = "1", PIP_DISABLE_PIP_VERSION_CHECK = "1", MPLBACKEND = "Agg" }
"#,
    ),
    (
        "pypi",
        "egress to the Python package index only (pypi.org, files.pythonhosted.org, port 443), inspected, read-only",
        r#"[network]
allow = ["pypi.org:443", "files.pythonhosted.org:443"]
# Both names are served by a CDN that serves others behind the same TLS name: inspection reads
# each request, so that its Host must be the name allowed; pip only reads.
inspect = true
http = ["read-only pypi.org", "read-only files.pythonhosted.org"]
"#,
    ),
    (
        "node",
        "node scripts: npm never prompts, no update or funding notices; no network",
        r#"[env]
set = { NODE_ENV = "production", NPM_CONFIG_UPDATE_NOTIFIER = "false", NPM_CONFIG_FUND = "false", NPM_CONFIG_AUDIT = "false", NO_UPDATE_NOTIFIER = "1" }
"#,
    ),
    (
        "npm",
        "egress to the npm registry only (registry.npmjs.org, port 443), inspected",
        r#"[network]
allow = ["registry.npmjs.org:443"]
# Behind a CDN: inspection reads each request, so that its Host must be the name allowed.
inspect = true
"#,
    ),
    (
        "shell",
        "shell pipelines: a C.UTF-8 locale, /bin/sh as SHELL, and at most 256 processes",
        r#"[env]
set = { SHELL = "/bin/sh", LC_ALL = "C.UTF-8" }

[limits]
pids = 256
"#,
    ),
    (
        "build",
        "compilers and build tools: 4096 processes, 4GiB, a 1GiB /tmp, 4GiB files, 30m",
        r#"[limits]
pids = 4096
memory = "4GiB"
tmp_size = "1GiB"
file_size = "4GiB"
timeout = "30m"
"#,
    ),
];

/// A profile's text by name.
///
/// ```
/// assert!(palisade_policy::profile::get("python").is_some());
/// assert!(palisade_policy::profile::get("nope").is_none());
/// ```
pub fn get(name: &str) -> Option<&'static str> {
    PROFILES.iter().find(|p| p.0 == name).map(|p| p.2)
}

/// A profile as an overlay, by name; an unknown name is an error naming it and the known ones.
///
/// ```
/// let o = palisade_policy::profile::overlay("build").unwrap();
/// assert_eq!(o.limits.pids, Some(4096));
/// let e = palisade_policy::profile::overlay("nope").unwrap_err();
/// assert_eq!(e.field(), Some("profiles"));
/// ```
pub fn overlay(name: &str) -> Result<crate::PolicyOverlay, crate::PolicyError> {
    let Some(text) = get(name) else {
        return Err(crate::PolicyError::invalid(
            "profiles",
            name,
            "one of the built-in profiles: default, python, pypi, node, npm, shell, build",
        ));
    };
    match crate::file::PolicyFile::parse(&format!("profile {name}"), text) {
        Ok(f) => Ok(f.overlay),
        // Each profile is parsed by a unit test: one that fails here is a build defect.
        Err(e) => panic!("built-in profile {name} is invalid: {e}"),
    }
}

/// The names, in order.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::PolicyFile;

    #[test]
    fn every_profile_is_a_valid_policy_file_without_profiles_or_host_paths() {
        for (name, _, text) in PROFILES {
            let f = PolicyFile::parse(&format!("profile {name}"), text)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(f.bounds.is_none(), "{name}");
            let f = f.overlay;
            assert!(f.profiles.is_empty(), "{name}");
            assert!(f.scratch.is_none() && f.binds.is_empty(), "{name}");
            assert!(f.env_pass.is_empty(), "{name}");
            assert!(
                f.allow_degraded.is_empty() && f.allow_ptrace.is_none(),
                "{name}"
            );
            assert_eq!(overlay(name).unwrap(), f);
        }
        assert_eq!(get("default"), Some(""));
        // The error lists exactly the profiles there are.
        let e = overlay("x").unwrap_err().to_string();
        assert!(
            e.ends_with(&format!(
                "one of the built-in profiles: {}",
                names().join(", ")
            )),
            "{e}"
        );
    }
}
