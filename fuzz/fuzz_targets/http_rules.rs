//! See `palisade_net::fuzzing::http_rules` for what it checks.
//! Run: `scripts/fuzz.sh http_rules` (or `cargo fuzz run http_rules` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::http_rules(data));
