//! Property tests for the parsers that stand between the user's text and the boundary: sizes,
//! durations and host patterns. Each must never panic, accept exactly its documented forms, and
//! agree with the form palisade writes back (`palisade policy show`).

use palisade_policy::file::{fmt_ms, fmt_size};
use palisade_policy::net::{Host, NetRule, Network};
use palisade_policy::{parse_duration, parse_size, MAX_OUTPUT, MAX_TIMEOUT};
use proptest::prelude::*;

proptest! {
    #[test]
    fn sizes_never_panic_and_stay_in_range(s in "\\PC{0,24}") {
        if let Ok(v) = parse_size("t", &s) {
            prop_assert!((1..=MAX_OUTPUT).contains(&v));
        }
    }

    #[test]
    fn sizes_with_units_multiply_exactly(n in 1u64..=1024, u in 0usize..4) {
        let (unit, shift) = [("B", 0), ("KiB", 10), ("MiB", 20), ("GiB", 30)][u];
        prop_assert_eq!(parse_size("t", &format!("{n}{unit}")).unwrap(), n << shift);
    }

    #[test]
    fn a_written_size_reads_back(v in 1u64..=MAX_OUTPUT) {
        prop_assert_eq!(parse_size("t", &fmt_size(v)).unwrap(), v);
    }

    #[test]
    fn negative_and_fractional_sizes_are_refused(n in 1u64..1_000_000, f in 1u32..100) {
        let neg = format!("-{n}");
        let frac = format!("{n}.{f}MiB");
        prop_assert!(parse_size("t", &neg).is_err());
        prop_assert!(parse_size("t", &frac).is_err());
    }

    #[test]
    fn durations_never_panic_and_stay_in_range(s in "\\PC{0,24}") {
        if let Ok(d) = parse_duration("t", &s) {
            prop_assert!(d.as_millis() >= 1 && d <= MAX_TIMEOUT);
        }
    }

    #[test]
    fn a_written_duration_reads_back(ms in 1u64..=(7 * 24 * 3600 * 1000)) {
        prop_assert_eq!(parse_duration("t", &fmt_ms(ms)).unwrap().as_millis() as u64, ms);
    }

    #[test]
    fn a_bare_number_is_never_a_duration(n in 0u64..1_000_000_000) {
        prop_assert!(parse_duration("t", &n.to_string()).is_err());
    }

    #[test]
    fn host_patterns_never_panic_and_an_accepted_rule_reads_back(s in "\\PC{0,40}") {
        if let Ok(r) = NetRule::parse("t", &s) {
            let again = NetRule::parse("t", &r.to_string()).unwrap();
            prop_assert_eq!(again, r);
        }
    }

    /// `*.D` allows every subdomain of D, never D itself, never a name that merely ends with D's
    /// text, and matching ignores case and a trailing dot.
    #[test]
    fn wildcards_match_subdomains_only(d in "[a-z]{1,12}", sub in "[a-z0-9]{1,12}") {
        let domain = format!("{d}.example.org");
        let net = Network {
            allow: vec![NetRule::parse("t", &format!("*.{domain}")).unwrap()],
            ..Network::default()
        };
        let ok = |name: &str| net.decide(&Host::parse(name).unwrap(), 443).is_ok();
        let c1 = ok(&format!("{sub}.{domain}"));
        prop_assert!(c1);
        let c2 = ok(&format!("{}.{}.", sub.to_uppercase(), domain.to_uppercase()));
        prop_assert!(c2);
        prop_assert!(!ok(&domain));
        let c3 = !ok(&format!("{sub}{domain}"));
        prop_assert!(c3);
        let c4 = !ok(&format!("{domain}.evil"));
        prop_assert!(c4);
        let c5 = net.decide(&Host::parse(&format!("{sub}.{domain}")).unwrap(), 22).is_err();
        prop_assert!(c5);
    }

    /// An exact rule allows the name alone, in any case, with or without the trailing dot.
    #[test]
    fn exact_rules_match_the_name_alone(d in "[a-z]{1,12}", sub in "[a-z]{1,8}") {
        let domain = format!("{d}.example.org");
        let net = Network {
            allow: vec![NetRule::parse("t", &domain).unwrap()],
            ..Network::default()
        };
        let ok = |name: &str| net.decide(&Host::parse(name).unwrap(), 443).is_ok();
        prop_assert!(ok(&domain));
        let c6 = ok(&format!("{}.", domain.to_uppercase()));
        prop_assert!(c6);
        let c7 = !ok(&format!("{sub}.{domain}"));
        prop_assert!(c7);
        let c8 = !ok(&format!("evil{domain}"));
        prop_assert!(c8);
    }

    /// Deny beats allow, whatever the order of the rules.
    #[test]
    fn deny_wins(d in "[a-z]{1,12}") {
        let domain = format!("{d}.example.org");
        let net = Network {
            allow: vec![NetRule::parse("t", &format!("*.{domain}")).unwrap(), NetRule::parse("t", &format!("api.{domain}")).unwrap()],
            deny: vec![NetRule::parse("t", &format!("api.{domain}")).unwrap()],
            ..Network::default()
        };
        let c9 = net.decide(&Host::parse(&format!("api.{domain}")).unwrap(), 443).is_err();
        prop_assert!(c9);
        let c10 = net.decide(&Host::parse(&format!("www.{domain}")).unwrap(), 443).is_ok();
        prop_assert!(c10);
    }
}

proptest! {
    /// The policy-file parser on text built from its own vocabulary (tables, keys, values of
    /// every type): never a panic, and what it accepts renders to a file that reads back to the
    /// same policy, every field. The unstructured version of this runs under `cargo fuzz`
    /// (fuzz/fuzz_targets/policy_file.rs).
    #[test]
    fn policy_files_never_panic_and_read_back(lines in proptest::collection::vec(
        (
            prop::sample::select(vec!["", "[limits]", "[network]", "[filesystem]", "[env]", "[layers]", "[env.set]", "[bounds]", "[bounds.limits]", "[bounds.network]"]),
            prop::sample::select(vec!["memory", "timeout", "cpu_time", "pids", "cpus", "allow", "deny", "resolve", "dns_server", "local_ports", "ro", "rw", "protect", "unprotect", "set", "pass", "allow_degraded", "allow_ptrace", "profiles", "hostname", "A", "scratch", "keep_scratch"]),
            prop::sample::select(vec!["\"1GiB\"", "\"30s\"", "0", "-1", "1.5", "true", "[\"a\"]", "[\"/opt\"]", "[\"*.example.org\"]", "[8000]", "{ A = \"1\" }", "\"\"", "[\"python\"]", "\"/srv\"", "18446744073709551615", "[]", "\"x\\u0000\"", "[\".git/config\"]", "[\"landlock\"]", "\"box\"", "[\"a.org=192.0.2.1\"]", "\"192.0.2.53\""]),
        ),
        0..8,
    )) {
        let text: String = lines
            .iter()
            .map(|(t, k, v)| format!("{t}\n{k} = {v}\n"))
            .collect();
        if let Some((p, back, shown)) = palisade_policy::file::read_render_read(&text) {
            prop_assert_eq!(p, back, "{}\n{}", text, shown);
        }
    }
}
