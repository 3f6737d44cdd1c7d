//! Secrets the code uses without holding them: each is a random placeholder inside the sandbox,
//! which the proxy replaces with the real value in the headers of requests to the secret's host,
//! on an inspected TLS connection, and only there. A request that carries a placeholder
//! anywhere else (another host, another port, plain HTTP) is refused: the value never goes
//! there, and the attempt is reported.
//!
//! Where the proxy looks: the request target and every header of each request it reads (plain
//! HTTP and inspected TLS), including `Basic` credentials (base64 of `user:password`, where git
//! and pip put tokens). Bodies are not searched: a placeholder is worth nothing without the
//! proxy, so a body that carries one to another host carries no secret.

use crate::ca::{random, CaError};
use crate::wire::Head;
use base64::Engine;
use palisade_policy::http::Secret;
use palisade_policy::net::Host;

/// One secret of the run.
pub(crate) struct Slot {
    pub(crate) name: String,
    host: String,
    port: u16,
    pub(crate) placeholder: String,
    value: String,
}

/// The run's secrets.
#[derive(Default)]
pub(crate) struct Secrets(Vec<Slot>);

/// A request carried the placeholder of a secret that does not go where the request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elsewhere {
    pub(crate) name: String,
    pub(crate) belongs: String,
}

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

impl Secrets {
    /// A placeholder for each secret whose value the caller gave; the others are left out (a
    /// policy validates only with every value given).
    pub(crate) fn new(secrets: &[Secret]) -> Result<Secrets, CaError> {
        let mut v = Vec::with_capacity(secrets.len());
        for s in secrets {
            let Some(value) = &s.value else { continue };
            let r: String = random(20)?.iter().map(|b| format!("{b:02x}")).collect();
            v.push(Slot {
                name: s.name.to_string(),
                host: s.host.clone(),
                port: s.port,
                placeholder: format!("palisade-secret-{r}"),
                value: value.expose().to_owned(),
            });
        }
        Ok(Secrets(v))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `(variable, placeholder)` for each secret: what the sandbox's environment holds.
    pub(crate) fn placeholders(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|s| (s.name.clone(), s.placeholder.clone()))
            .collect()
    }

    /// The placeholders in a request to `host:port` (`tls`: on an inspected TLS connection) put
    /// in place: the values of the secrets for that destination replace their placeholders in
    /// the header values, `Basic` credentials included. Returns the names of the secrets used,
    /// or the first placeholder found that belongs elsewhere (then `head` is unchanged).
    pub(crate) fn apply(
        &self,
        head: &mut Head,
        host: &Host,
        port: u16,
        tls: bool,
    ) -> Result<Vec<String>, Elsewhere> {
        if self.0.is_empty() {
            return Ok(Vec::new());
        }
        let here =
            |s: &Slot| tls && matches!(host, Host::Name(n) if *n == s.host) && s.port == port;
        // Every place a placeholder could be, decoded where credentials are encoded.
        let mut places: Vec<Vec<u8>> = vec![head.target.as_bytes().to_vec()];
        for (name, value) in &head.headers {
            places.push(name.as_bytes().to_vec());
            places.push(value.clone());
            if let Some(d) = basic(name, value) {
                places.push(d);
            }
        }
        let mut used = Vec::new();
        for s in &self.0 {
            let found = places.iter().any(|p| contains(p, s.placeholder.as_bytes()));
            if !found {
                continue;
            }
            if !here(s) {
                return Err(Elsewhere {
                    name: s.name.clone(),
                    belongs: format!("{}:{} over TLS", s.host, s.port),
                });
            }
            used.push(s.name.clone());
        }
        if used.is_empty() {
            return Ok(used);
        }
        for (name, value) in head.headers.iter_mut() {
            let decoded = basic(name, value);
            for s in self.0.iter().filter(|s| used.contains(&s.name)) {
                *value = replace(value, s.placeholder.as_bytes(), s.value.as_bytes());
            }
            if let Some(mut d) = decoded {
                let before = d.clone();
                for s in self.0.iter().filter(|s| used.contains(&s.name)) {
                    d = replace(&d, s.placeholder.as_bytes(), s.value.as_bytes());
                }
                if d != before {
                    *value = format!("Basic {}", BASE64.encode(&d)).into_bytes();
                }
            }
        }
        Ok(used)
    }

    /// A response header from the secret's host that reflects a value the proxy put in: the
    /// value goes back to the sandbox as its placeholder.
    pub(crate) fn mask(&self, value: &[u8]) -> Vec<u8> {
        let mut v = value.to_vec();
        for s in &self.0 {
            v = replace(&v, s.value.as_bytes(), s.placeholder.as_bytes());
        }
        v
    }
}

/// The decoded credentials of an `Authorization: Basic …` (or `Proxy-Authorization`) value.
fn basic(name: &str, value: &[u8]) -> Option<Vec<u8>> {
    if !name.eq_ignore_ascii_case("authorization")
        && !name.eq_ignore_ascii_case("proxy-authorization")
    {
        return None;
    }
    let v = value.trim_ascii();
    let scheme = v.get(..6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    BASE64.decode(v[6..].trim_ascii()).ok()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || !contains(hay, from) {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len() + to.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse_head;
    use palisade_policy::http::SecretValue;

    fn secrets() -> Secrets {
        let mut s = Secret::parse("t", "TOKEN@api.example.org").unwrap();
        s.value = Some(SecretValue::new("real-t0ken").unwrap());
        let mut k = Secret::parse("t", "KEY@other.example.org").unwrap();
        k.value = Some(SecretValue::new("real-k3y").unwrap());
        Secrets::new(&[s, k]).unwrap()
    }

    fn head(t: &str) -> Head {
        parse_head(t.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn placeholders_become_values_for_their_host_only() {
        let s = secrets();
        let p = s.placeholders();
        assert_eq!(p[0].0, "TOKEN");
        assert!(p[0].1.starts_with("palisade-secret-") && p[0].1.len() == 56);
        assert_ne!(p[0].1, p[1].1);
        let tok = &p[0].1;
        let api = Host::parse("api.example.org").unwrap();
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: api.example.org\r\nAuthorization: Bearer {tok}\r\n\r\n"
        ));
        assert_eq!(s.apply(&mut h, &api, 443, true), Ok(vec!["TOKEN".into()]));
        assert_eq!(h.headers[1].1, b"Bearer real-t0ken");
        // Basic credentials, as git and pip send a token.
        let creds = BASE64.encode(format!("x-access-token:{tok}"));
        let mut h = head(&format!(
            "GET / HTTP/1.1\r\nHost: api.example.org\r\nAuthorization: Basic {creds}\r\n\r\n"
        ));
        s.apply(&mut h, &api, 443, true).unwrap();
        let v = String::from_utf8(h.headers[1].1.clone()).unwrap();
        let d = BASE64.decode(v.strip_prefix("Basic ").unwrap()).unwrap();
        assert_eq!(d, b"x-access-token:real-t0ken");
        // Elsewhere: another host, another port, plain HTTP, in the URL or in Basic credentials.
        for (req, host, port, tls) in [
            (
                format!("GET / HTTP/1.1\r\nX-A: {tok}\r\n\r\n"),
                "evil.example",
                443,
                true,
            ),
            (
                format!("GET / HTTP/1.1\r\nX-A: {tok}\r\n\r\n"),
                "api.example.org",
                8443,
                true,
            ),
            (
                format!("GET / HTTP/1.1\r\nX-A: {tok}\r\n\r\n"),
                "api.example.org",
                443,
                false,
            ),
            (
                format!("GET /?k={tok} HTTP/1.1\r\n\r\n"),
                "evil.example",
                443,
                true,
            ),
            (
                format!("GET / HTTP/1.1\r\nAuthorization: Basic {creds}\r\n\r\n"),
                "evil.example",
                443,
                true,
            ),
        ] {
            let mut h = head(&req);
            let before = h.clone();
            let e = s
                .apply(&mut h, &Host::parse(host).unwrap(), port, tls)
                .unwrap_err();
            assert_eq!(e.name, "TOKEN", "{req}");
            assert_eq!(e.belongs, "api.example.org:443 over TLS");
            assert_eq!(h, before, "nothing replaced");
        }
        // Another secret's placeholder on the right host for the first one is still refused.
        let key = &p[1].1;
        let mut h = head(&format!("GET / HTTP/1.1\r\nX-K: {key}\r\n\r\n"));
        assert_eq!(s.apply(&mut h, &api, 443, true).unwrap_err().name, "KEY");
        // The value reflected in a response header goes back as the placeholder.
        assert_eq!(
            s.mask(b"token real-t0ken seen"),
            format!("token {tok} seen").into_bytes()
        );
    }
}
