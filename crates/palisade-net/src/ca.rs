//! The per-run CA of TLS inspection, and the upstream trust it verifies hosts against.
//!
//! The CA's key pair is generated in the supervisor's memory when a run is prepared and lives
//! only there: it is never serialized, written to a file or passed to the sandbox, which gets the
//! certificate alone (to trust). It signs one leaf per host the sandbox reaches with inspection,
//! on demand, kept per run (at most [`MAX_LEAVES`]); every leaf shares one key pair of its own,
//! so that a leaf costs one signature. Certificates are valid from a day before the run to eight
//! days after it (a run lasts at most seven).

use palisade_policy::net::Host;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Most hosts whose leaf (and TLS configuration) a run keeps; past that, each handshake signs a
/// new one (its CPU is the connection's, and metered like the rest).
pub const MAX_LEAVES: usize = 1024;
/// Longest CA file or trust bundle read, in bytes.
pub const MAX_BUNDLE: u64 = 8 << 20;
/// How long before now certificates are valid (clocks differ), and after.
const BEFORE: time::Duration = time::Duration::days(1);
const AFTER: time::Duration = time::Duration::days(8);

/// Why inspection could not be prepared.
#[derive(Debug)]
pub enum CaError {
    /// Generating or signing a key or a certificate failed.
    Generate(String),
    /// The randomness for keys, serials and placeholders could not be had.
    Random(std::io::Error),
    /// `network.upstream_ca` (or a host bundle) could not be read or holds no certificate.
    Roots { path: String, why: String },
    /// No trust bundle on the host to verify upstream servers against.
    NoTrustStore { tried: Vec<String> },
}

impl fmt::Display for CaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaError::Generate(e) => write!(f, "cannot make the run's inspection CA: {e}"),
            CaError::Random(e) => write!(f, "cannot get random bytes for the run's CA: {e}"),
            CaError::Roots { path, why } => write!(
                f,
                "network.upstream_ca `{path}`: {why}; give a PEM file with the CA certificates upstream servers are verified against"
            ),
            CaError::NoTrustStore { tried } => write!(
                f,
                "no trust store on this host to verify inspected hosts against (looked for {}); install the CA certificates (ca-certificates) or set network.upstream_ca",
                tried.join(", ")
            ),
        }
    }
}

impl std::error::Error for CaError {}

/// `n` random bytes from the kernel.
pub(crate) fn random(n: usize) -> Result<Vec<u8>, CaError> {
    let mut b = vec![0u8; n];
    let mut at = 0;
    while at < n {
        let got = rustix::rand::getrandom(&mut b[at..], rustix::rand::GetRandomFlags::empty())
            .map_err(|e| CaError::Random(e.into()))?;
        at += got;
    }
    Ok(b)
}

/// A positive 127-bit serial number.
fn serial() -> Result<SerialNumber, CaError> {
    let mut b = random(16)?;
    b[0] &= 0x7f;
    b[0] |= 0x01;
    Ok(SerialNumber::from_slice(&b))
}

fn generate(e: rcgen::Error) -> CaError {
    CaError::Generate(e.to_string())
}

/// The run's CA: its certificate for the sandbox, its key only here.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// The leaves' shared key, as rustls signs with it.
    leaf_key: KeyPair,
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    provider: Arc<CryptoProvider>,
    /// Server configurations by host (each with its leaf), at most [`MAX_LEAVES`].
    configs: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// Serves the one leaf of a host, whatever the client's server name (the proxy checked the name
/// against the connection's host before the handshake, and checks rustls's reading after it).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl Ca {
    /// A new CA, for one run.
    pub fn new(provider: Arc<CryptoProvider>) -> Result<Ca, CaError> {
        let now = time::OffsetDateTime::now_utc();
        let key = KeyPair::generate().map_err(generate)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        let tag: String = random(6)?.iter().map(|b| format!("{b:02x}")).collect();
        dn.push(
            DnType::CommonName,
            format!("palisade inspection CA (one run, {tag})"),
        );
        dn.push(DnType::OrganizationName, "palisade sandbox");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BEFORE;
        params.not_after = now + AFTER;
        params.serial_number = Some(serial()?);
        let cert = params.self_signed(&key).map_err(generate)?;
        let leaf_key = KeyPair::generate().map_err(generate)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let leaf_signer = provider
            .key_provider
            .load_private_key(der)
            .map_err(|e| CaError::Generate(e.to_string()))?;
        Ok(Ca {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            leaf_key,
            leaf_signer,
            provider,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM), for the sandbox to trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf for `host` (a name, or an address).
    fn leaf(&self, host: &Host) -> Result<Arc<CertifiedKey>, CaError> {
        let now = time::OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        let shown = match host {
            Host::Name(n) => {
                let name = n.clone().try_into().map_err(generate)?;
                params.subject_alt_names = vec![SanType::DnsName(name)];
                n.clone()
            }
            Host::Ip(a) => {
                params.subject_alt_names = vec![SanType::IpAddress(*a)];
                a.to_string()
            }
        };
        dn.push(DnType::CommonName, shown);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BEFORE;
        params.not_after = now + AFTER;
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(generate)?;
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        Ok(Arc::new(CertifiedKey::new(chain, self.leaf_signer.clone())))
    }

    /// The TLS server configuration for connections to `host`: its leaf, HTTP/1.1 by ALPN.
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, CaError> {
        let key = host.to_string();
        if let Some(c) = self
            .configs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(c.clone());
        }
        let leaf = self.leaf(host)?;
        let mut cfg = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| CaError::Generate(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(leaf)));
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        let mut all = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() < MAX_LEAVES {
            all.insert(key, cfg.clone());
        }
        Ok(cfg)
    }

    /// How many hosts have a leaf kept.
    #[cfg(test)]
    pub(crate) fn leaves(&self) -> usize {
        self.configs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Certificates from PEM text: each `CERTIFICATE` block (others are skipped).
pub(crate) fn pem_certs(text: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(text)
        .filter_map(Result::ok)
        .collect()
}

/// Reads a CA file or bundle of at most [`MAX_BUNDLE`] bytes into a root store.
pub(crate) fn roots_from(path: &std::path::Path) -> Result<RootCertStore, CaError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let bad = |why: String| CaError::Roots {
        path: shown.clone(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut text = Vec::new();
    f.take(MAX_BUNDLE + 1)
        .read_to_end(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    if text.len() as u64 > MAX_BUNDLE {
        return Err(bad(format!("larger than {MAX_BUNDLE} bytes")));
    }
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(pem_certs(&text));
    if added == 0 {
        return Err(bad("no usable CERTIFICATE in it".into()));
    }
    Ok(store)
}

/// The host's trust store: the first of the usual system bundles that exists and holds
/// certificates ([`palisade_policy::net::TRUST_BUNDLES`]).
pub(crate) fn host_roots() -> Result<RootCertStore, CaError> {
    let tried: Vec<String> = palisade_policy::net::TRUST_BUNDLES
        .iter()
        .map(|s| s.to_string())
        .collect();
    for p in palisade_policy::net::TRUST_BUNDLES {
        if let Ok(store) = roots_from(std::path::Path::new(p)) {
            return Ok(store);
        }
    }
    Err(CaError::NoTrustStore { tried })
}
