//! A request head on the HTTP proxy listener: never a panic, and what a forwarded request sends
//! upstream reads back as one head naming the host that was checked.
//! Run: `scripts/fuzz.sh proxy_request` (or `cargo fuzz run proxy_request` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::proxy_request(data));
