//! `palisade serve`'s request decoding and checking on arbitrary input, and the server's reading
//! of the agent's frames (bytes the sandbox controls): nothing may panic, and a request that
//! decodes is either refused with an error naming a field or accepted as a plan.
//! Run: `cargo +nightly fuzz run server_request` (from the repository root; needs cargo-fuzz).
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_service::{api, fusion, proto, Ceiling, Config, Service};
use std::sync::OnceLock;

fn service() -> &'static Service {
    static S: OnceLock<Service> = OnceLock::new();
    S.get_or_init(|| {
        let mut p = palisade::policy::Policy::new(["true"]).unwrap();
        p.limits.memory_bytes = 256 << 20;
        p.network.allow.push(palisade::policy::net::NetRule::parse("fuzz", "pypi.org").unwrap());
        Service::new(Config::new(Ceiling::new(p).unwrap(), "/usr/bin/palisade".into()))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(r) = serde_json::from_slice::<api::RunRequest>(rest) {
                if let Err(e) = service().check_run(&r) {
                    assert!(!e.message.is_empty());
                }
            }
        }
        1 => {
            if let Ok(r) = serde_json::from_slice::<fusion::RunCodeRequest>(rest) {
                if let Ok(run) = fusion::to_run(&r, palisade_service::lang::ALL) {
                    let _ = service().check_run(&run);
                }
            }
        }
        2 => {
            let _ = serde_json::from_slice::<api::BatchRequest>(rest);
            let _ = serde_json::from_slice::<api::SessionRequest>(rest);
            let _ = serde_json::from_slice::<api::ExecRequest>(rest);
        }
        _ => {
            // A frame from the agent: bounded lengths, then a header of the protocol's types.
            if rest.len() >= 8 {
                let prefix: [u8; 8] = rest[..8].try_into().unwrap();
                if let Ok((h, d)) = proto::lengths(&prefix, 1 << 20) {
                    assert!(h <= proto::MAX_HEADER && d <= 1 << 20);
                    if rest.len() >= 8 + h {
                        let _ = serde_json::from_slice::<proto::Event>(&rest[8..8 + h]);
                    }
                }
            }
            if let Ok(p) = std::str::from_utf8(rest) {
                if let Ok(c) = proto::check_path(p) {
                    assert!(!c.is_empty() && c.iter().all(|x| *x != ".." && *x != "." && !x.contains('/')));
                }
            }
        }
    }
});
