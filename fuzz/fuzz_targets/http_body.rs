//! See `palisade_net::fuzzing::http_body` for what it checks.
//! Run: `scripts/fuzz.sh http_body` (or `cargo fuzz run http_body` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::http_body(data));
