//! Peer identities from certificates.
//!
//! A switch's identity is the first DNS subject-alternative name of its
//! certificate (what `quicsdn pki issue --name` writes), or else its subject common
//! name (what `ovs-pki` writes). Logs, per-switch socket paths and the
//! one-connection-per-switch rule all use it.

use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The parts of a certificate quicsdn looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    pub identity: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// The serial number, in hex as `openssl x509 -serial` prints it.
    pub serial: String,
}

/// Reads a DER certificate's identity and expiry.
pub fn parse(der: &CertificateDer<'_>) -> Result<CertSummary, String> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let dns = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                GeneralName::DNSName(name) => Some(name.to_string()),
                _ => None,
            })
        });
    let cn = || {
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string)
    };
    let identity = dns
        .or_else(cn)
        .ok_or_else(|| "certificate has neither a DNS name nor a common name".to_string())?;
    Ok(CertSummary {
        identity,
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        serial: cert.raw_serial_as_string().replace(':', "").to_uppercase(),
    })
}

/// The verified identity of a QUIC connection's peer, if it presented a
/// certificate (on the controller agent it always has, or the handshake failed).
pub fn of_connection(conn: &quinn::Connection) -> Option<String> {
    peer_certificate(conn).map(|s| s.identity)
}

/// The certificate a QUIC connection's peer presented (for a resumed
/// session: the one it presented at the full handshake the ticket came from).
pub fn peer_certificate(conn: &quinn::Connection) -> Option<CertSummary> {
    let any = conn.peer_identity()?;
    let certs = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    parse(certs.first()?).ok()
}
