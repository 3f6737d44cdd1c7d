//! See `palisade_net::fuzzing::http_request` for what it checks.
//! Run: `scripts/fuzz.sh http_request` (or `cargo fuzz run http_request` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::http_request(data));
