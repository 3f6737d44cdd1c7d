//! A reply to the supervisor's own lookup (`--dns-server`): never a panic, and addresses of the
//! type asked for only.
//! Run: `scripts/fuzz.sh dns_reply` (or `cargo fuzz run dns_reply` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::dns_reply(data));
