//! A query to the DNS stub: never a panic, and the answer echoes its id and question.
//! Run: `scripts/fuzz.sh dns_query` (or `cargo fuzz run dns_query` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::dns_query(data));
