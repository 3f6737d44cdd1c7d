//! A connection's first bytes as the transparent, CONNECT and SOCKS paths read them (TLS
//! ClientHello, HTTP request head, anything else): never a panic, and a verdict on a prefix is the
//! verdict on the whole (see `palisade_net::fuzzing::first_bytes`).
//! Run: `scripts/fuzz.sh first_bytes` (or `cargo fuzz run first_bytes` with a nightly toolchain).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| palisade_net::fuzzing::first_bytes(data));
