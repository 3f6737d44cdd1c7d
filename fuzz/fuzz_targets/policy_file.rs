//! The policy-file parser on arbitrary input: it must never panic; what it accepts must give a
//! policy that renders to a file reading back to the same policy, every field; and a file's own
//! ceiling must hold the defaults once lowered to it.
//! Run: `scripts/fuzz.sh policy_file` (or `cargo +nightly fuzz run policy_file`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_policy::file::{read_render_read, PolicyFile};
use palisade_policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some((p, back, shown)) = read_render_read(text) {
        assert_eq!(p, back, "the rendered policy reads back different:\n{shown}");
    }
    let Ok(f) = PolicyFile::parse("fuzz.toml", text) else {
        return;
    };
    if let Ok(b) = f.ceiling() {
        let mut d = Policy::new(["true"]).expect("the defaults are valid");
        d.clamp_to(&b);
        if let Err(e) = d.check_within(&b) {
            panic!("the defaults lowered to a ceiling do not fit it: {e}");
        }
    }
});
