//! TLS 1.3 with mutual authentication for the agents' QUIC connections.
//!
//! There is no plaintext mode and no way to turn peer verification off: the
//! controller agent requires a client certificate chaining to its CA
//! (`WebPkiClientVerifier` with mandatory client auth), and the switch agent
//! requires the controller's certificate to chain to its CA and to name
//! `--server-name`. RFC 9001 §4.2: QUIC "MUST NOT" negotiate a TLS version older
//! than 1.3, so only TLS 1.3 is offered.

use quicsdn_wire::preamble::ALPN;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use time::OffsetDateTime;
use tracing::warn;

/// The PEM files one agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) that peers' certificates must chain to.
    pub ca: PathBuf,
    /// This agent's certificate (chain), leaf first.
    pub cert: PathBuf,
    /// This agent's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The application a QUIC connection carries: the protocol name both ends
/// must agree on in the handshake (ALPN, RFC 7301; RFC 9001 §8.1 requires it
/// for QUIC), and what to call each end in logs. The agents and the TCP proxy
/// use different names, so neither can connect to the other by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Application {
    pub alpn: &'static [u8],
    /// The end that connects, as logs name it.
    pub client: &'static str,
    /// The end that listens, as logs name it.
    pub server: &'static str,
}

/// The switch and controller agents.
pub const AGENTS: Application = Application {
    alpn: ALPN,
    client: "switch agent",
    server: "controller agent",
};

/// What went wrong loading or using certificates, naming the file involved.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{what} {path} contains no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("certificate {cert} and key {key} cannot be used together: {reason}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("invalid CA certificate in {path}: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error("TLS configuration failed: {0}")]
    Config(String),
}

/// Why this agent's verifier refused a peer's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertRejection {
    /// It does not chain to the CA.
    UnknownIssuer,
    /// It has expired or is not valid yet.
    Expired,
    /// (Switch agent) it does not carry `--server-name`.
    WrongName,
    /// None was presented.
    NoCertificate,
    /// Anything else: signature, usage, revocation.
    Other,
}

impl CertRejection {
    /// Classifies a rustls verification error.
    pub fn of(e: &rustls::Error) -> CertRejection {
        use rustls::CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::UnknownIssuer => CertRejection::UnknownIssuer,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => CertRejection::Expired,
                C::NotValidForName | C::NotValidForNameContext { .. } => CertRejection::WrongName,
                _ => CertRejection::Other,
            },
            rustls::Error::NoCertificatesPresented => CertRejection::NoCertificate,
            _ => CertRejection::Other,
        }
    }
}

/// Told of every certificate this agent's verifier refuses (the metrics).
#[derive(Clone)]
pub struct RejectionHook(pub Arc<dyn Fn(CertRejection) + Send + Sync>);

impl std::fmt::Debug for RejectionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RejectionHook")
    }
}

/// Loaded credentials: the roots to verify peers with, and this agent's identity.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// Told of refused peer certificates.
    pub on_reject: Option<RejectionHook>,
    files: TlsFiles,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    /// The identity in this agent's own certificate (see [`crate::identity`]).
    pub identity: String,
    /// When this agent's own certificate becomes valid.
    pub not_before: OffsetDateTime,
    /// When this agent's own certificate expires.
    pub not_after: OffsetDateTime,
    /// This agent's certificate's serial number (hex).
    pub serial: String,
    /// When the first certificate of the CA file expires.
    pub ca_not_after: OffsetDateTime,
}

/// ring's provider, TLS 1.3's mandatory suite first (RFC 8446 §9.1: "A
/// TLS-compliant application MUST implement the TLS_AES_128_GCM_SHA256
/// cipher suite"). rustls prefers AES-256-GCM with SHA-384, whose key schedule
/// and transcript hash run SHA-512 in software, while SHA-256 has CPU
/// instructions (x86 SHA extensions, ARMv8): SHA-512 was ~5 % of both agents'
/// CPU in a 0-RTT reconnect storm (issue 18). The key exchange (X25519, P-256)
/// gives 128-bit security either way. The client offers this order and the
/// server follows it.
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// The contents of the three files, as read (see [`TlsFiles::read`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPem {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl TlsFiles {
    /// Reads the three files (following symlinks).
    pub fn read(&self) -> Result<TlsPem, TlsError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        };
        Ok(TlsPem {
            ca: read("CA file", &self.ca)?,
            cert: read("certificate file", &self.cert)?,
            key: read("key file", &self.key)?,
        })
    }
}

fn parse_certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Read {
            what,
            path: path.to_path_buf(),
            reason: format!("not valid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "PEM certificate",
        });
    }
    Ok(certs)
}

/// Which end of the TLS handshake an agent's own certificate serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The connecting end (switch agent, proxy client): a client certificate.
    Client,
    /// The listening end (controller agent, proxy server): a server certificate.
    Server,
}

/// How long ahead of a certificate's expiry the agents warn about it (at
/// start, after each rotation, and every 12 hours in between).
pub const EXPIRY_WARNING_AHEAD: time::Duration = time::Duration::days(14);

/// What to say of a certificate valid until `not_after`, at `now`: nothing
/// until [`EXPIRY_WARNING_AHEAD`] before its end.
fn expiry_warning(not_after: OffsetDateTime, now: OffsetDateTime) -> Option<String> {
    let left = not_after - now;
    if left.is_negative() {
        Some(format!("expired at {not_after}; peers will reject it"))
    } else if left < EXPIRY_WARNING_AHEAD {
        Some(format!(
            "expires at {not_after}, in {} days and {} hours; replace it before peers reject it",
            left.whole_days(),
            left.whole_hours() % 24
        ))
    } else {
        None
    }
}

impl Credentials {
    /// Reads and checks the three files: the CA must parse, the certificate and key
    /// must match.
    pub fn load(files: &TlsFiles) -> Result<Credentials, TlsError> {
        Self::from_pem(files, &files.read()?)
    }

    /// [`Self::load`] from the files' contents (`files` names them in errors).
    pub fn from_pem(files: &TlsFiles, pem: &TlsPem) -> Result<Credentials, TlsError> {
        let ca = parse_certs("CA file", &files.ca, &pem.ca)?;
        let ca_summary = crate::identity::parse(&ca[0]).map_err(|reason| TlsError::BadCa {
            path: files.ca.clone(),
            reason,
        })?;
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots.add(cert).map_err(|e| TlsError::BadCa {
                path: files.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let chain = parse_certs("certificate file", &files.cert, &pem.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
                what: "key file",
                path: files.key.clone(),
                expected: "PEM private key",
            },
            e => TlsError::Read {
                what: "key file",
                path: files.key.clone(),
                reason: format!("not valid PEM: {e}"),
            },
        })?;
        rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider()).map_err(
            |e| TlsError::Mismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
                reason: e.to_string(),
            },
        )?;
        let leaf = crate::identity::parse(&chain[0]).map_err(|reason| TlsError::Read {
            what: "certificate file",
            path: files.cert.clone(),
            reason,
        })?;
        Ok(Credentials {
            on_reject: None,
            files: files.clone(),
            roots: Arc::new(roots),
            chain,
            key: Arc::new(key),
            identity: leaf.identity,
            not_before: leaf.not_before,
            not_after: leaf.not_after,
            serial: leaf.serial,
            ca_not_after: ca_summary.not_after,
        })
    }

    /// Whether this agent's own certificate chains to its own CA file and
    /// may serve `role` at `now` (RFC 5280 §6 path validation, and §4.2.1.12:
    /// the extended key usage, if the certificate has one, must allow the
    /// role). With one CA for both ends (`quicsdn pki`) it does; with
    /// `ovs-pki`'s two CAs each end's certificate comes from the CA the other
    /// end trusts, and only the peer can check it.
    pub fn verify_own(&self, role: Role, now: UnixTime) -> Result<(), String> {
        let leaf = webpki::EndEntityCert::try_from(&self.chain[0]).map_err(|e| e.to_string())?;
        let usage = match role {
            Role::Client => webpki::KeyUsage::client_auth(),
            Role::Server => webpki::KeyUsage::server_auth(),
        };
        leaf.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.roots.roots,
            &self.chain[1..],
            now,
            usage,
            None,
            None,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// This agent's private key (DER), for keys derived from it.
    pub(crate) fn private_key_der(&self) -> &[u8] {
        self.key.secret_der()
    }

    /// Warns when this certificate has expired or soon will: peers would
    /// reject it, and the log should say so before they do.
    pub fn warn_if_expiring(&self) {
        if let Some(warning) = expiry_warning(self.not_after, OffsetDateTime::now_utc()) {
            warn!(identity = %self.identity, "this certificate ({}) {warning}", self.files.cert.display());
        }
    }

    /// rustls configuration for the controller agent (QUIC server): present our
    /// certificate, require one from every client.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        self.server_config_for(AGENTS)
    }

    /// [`Self::server_config`] for another application.
    pub fn server_config_for(&self, app: Application) -> Result<rustls::ServerConfig, TlsError> {
        let provider = provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(Arc::new(LoggingClientVerifier {
                inner: verifier,
                role: app.client,
                hook: self.on_reject.clone(),
            }))
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![app.alpn.to_vec()];
        Ok(cfg)
    }

    /// rustls configuration for the switch agent (QUIC client): verify the server
    /// against our CA and present our certificate.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        self.client_config_for(AGENTS)
    }

    /// [`Self::client_config`] for another application.
    pub fn client_config_for(&self, app: Application) -> Result<rustls::ClientConfig, TlsError> {
        let provider = provider();
        let inner =
            WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous() // Only to wrap the standard verifier in one that logs; it still decides.
            .with_custom_certificate_verifier(Arc::new(LoggingServerVerifier {
                inner,
                role: app.server,
                hook: self.on_reject.clone(),
            }))
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![app.alpn.to_vec()];
        Ok(cfg)
    }
}

/// The identity a rejected certificate claims, for the log line (it is not trusted).
fn claimed_identity(cert: &CertificateDer<'_>) -> String {
    crate::identity::parse(cert)
        .map(|s| s.identity)
        .unwrap_or_else(|e| format!("<unreadable certificate: {e}>"))
}

/// The standard client verifier, logging the identity a rejected client claimed.
#[derive(Debug)]
struct LoggingClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    role: &'static str,
    hook: Option<RejectionHook>,
}

impl ClientCertVerifier for LoggingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|e| {
                warn!(peer = %claimed_identity(end_entity), "rejected the {}'s certificate: {e}", self.role);
                if let Some(h) = &self.hook {
                    (h.0)(CertRejection::of(e));
                }
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The standard server verifier, logging the identity a rejected server claimed.
#[derive(Debug)]
struct LoggingServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    role: &'static str,
    hook: Option<RejectionHook>,
}

impl ServerCertVerifier for LoggingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .inspect_err(|e| {
                warn!(
                    peer = %claimed_identity(end_entity),
                    expected = %server_name.to_str(),
                    "rejected the {}'s certificate: {e}",
                    self.role
                );
                if let Some(h) = &self.hook {
                    (h.0)(CertRejection::of(e));
                }
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::test_credentials;

    #[test]
    fn the_agents_negotiate_aes_128_gcm_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let ctl = test_credentials(dir.path(), "ctl");
        let sw = test_credentials(dir.path(), "sw1");
        let server_name = ServerName::try_from("ctl").unwrap();
        let mut client =
            rustls::ClientConnection::new(Arc::new(sw.client_config().unwrap()), server_name)
                .unwrap();
        let mut server =
            rustls::ServerConnection::new(Arc::new(ctl.server_config().unwrap())).unwrap();
        // The TLS records of each side fed to the other, in memory, until both are done.
        for _ in 0..10 {
            let mut flight = Vec::new();
            client.write_tls(&mut flight).unwrap();
            server.read_tls(&mut flight.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            flight.clear();
            server.write_tls(&mut flight).unwrap();
            client.read_tls(&mut flight.as_slice()).unwrap();
            client.process_new_packets().unwrap();
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
        }
        assert!(!server.is_handshaking(), "the handshake did not complete");
        for suite in [
            server.negotiated_cipher_suite(),
            client.negotiated_cipher_suite(),
        ] {
            assert_eq!(
                suite.map(|s| s.suite()),
                Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
            );
        }
    }

    #[test]
    fn expiry_is_warned_about_two_weeks_ahead_and_after() {
        // 2027-01-31 12:00 UTC
        let not_after = OffsetDateTime::from_unix_timestamp(1_801_396_800).unwrap();
        let at = |days: i64, hours: i64| {
            not_after - time::Duration::days(days) - time::Duration::hours(hours)
        };
        assert_eq!(expiry_warning(not_after, at(14, 0)), None);
        assert_eq!(expiry_warning(not_after, at(200, 0)), None);
        let soon = expiry_warning(not_after, at(13, 23)).expect("warned");
        assert!(soon.contains("in 13 days and 23 hours"), "{soon}");
        assert!(soon.contains("2027-01-31 12:00"), "{soon}");
        let gone = expiry_warning(not_after, at(0, -1)).expect("warned");
        assert!(gone.starts_with("expired at 2027-01-31 12:00"), "{gone}");
    }
}
