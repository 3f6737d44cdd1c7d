//! The policy-file parser on arbitrary input: it must never panic, and what it accepts must be a
//! policy that validates and renders to a file it accepts again.
//! Run: `scripts/fuzz.sh policy_file` (or `cargo +nightly fuzz run policy_file`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_policy::file::PolicyFile;
use palisade_policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(f) = PolicyFile::parse("fuzz.toml", text) else {
        return;
    };
    let mut p = Policy::new(["true"]).unwrap();
    p.binds = f.binds.clone();
    p.env = f.env_set.clone();
    p.network.allow = f.allow_net.clone();
    p.network.deny = f.deny_net.clone();
    p.network.resolve = f.resolve.clone();
    p.network.dns_server = f.dns_server;
    p.network.local_ports = f.local_ports.clone();
    f.limits.apply(&mut p.limits);
    if p.validate().is_ok() {
        let shown = PolicyFile::render(&p, false);
        PolicyFile::parse("shown.toml", &shown).expect("a rendered policy reads back");
    }
});
