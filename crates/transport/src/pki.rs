//! A minimal PKI for quicsdn: one CA, and certificates it signs for switches and
//! controllers (`quicsdn pki init` / `quicsdn pki issue`).
//!
//! Keys are ECDSA P-256. Every issued certificate carries its name as a DNS
//! subject-alternative name and as the subject common name, and may be used as
//! both TLS client and server (an agent is one or the other depending on its
//! role). Private keys are written with mode 0600 and never overwritten.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// Why a PKI operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{0} already exists; refusing to overwrite it")]
    Exists(PathBuf),
    #[error("invalid name {0:?}: use letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Validity of a new certificate.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (to tolerate clock skew between hosts) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(i64::from(days)),
        }
    }
}

/// Paths of a CA in `dir`.
pub fn ca_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("ca.crt"), dir.join("ca.key"))
}

/// Paths of `name`'s certificate and key in `dir`.
pub fn cert_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    )
}

/// A new self-signed CA: its certificate (PEM) and key pair. In memory;
/// [`init_ca`] writes them.
pub fn generate_ca(common_name: &str, validity: Validity) -> Result<(String, KeyPair), PkiError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key_pair = KeyPair::generate()?;
    let cert = params.self_signed(&key_pair)?;
    Ok((cert.pem(), key_pair))
}

/// A new certificate for `name`, signed by the CA `ca_cert_pem`/`ca_key`:
/// its certificate and key, PEM. In memory; [`issue`] writes them.
pub fn generate_cert(
    ca_cert_pem: &str,
    ca_key: &KeyPair,
    name: &str,
    ips: &[IpAddr],
    validity: Validity,
) -> Result<(String, String), PkiError> {
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
    let mut params = CertificateParams::new(vec![name.to_string()])?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key_pair = KeyPair::generate()?;
    let cert = params.signed_by(&key_pair, &issuer)?;
    Ok((cert.pem(), key_pair.serialize_pem()))
}

/// Creates `dir/ca.crt` and `dir/ca.key`.
pub fn init_ca(
    dir: &Path,
    common_name: &str,
    validity: Validity,
) -> Result<(PathBuf, PathBuf), PkiError> {
    let (crt, key) = ca_paths(dir);
    refuse_existing(&[&crt, &key])?;
    let (cert_pem, key_pair) = generate_ca(common_name, validity)?;
    create_dir(dir)?;
    write_new(&key, key_pair.serialize_pem().as_bytes(), 0o600)?;
    write_new(&crt, cert_pem.as_bytes(), 0o644)?;
    Ok((crt, key))
}

/// Whether `name` may name a certificate (and its files).
fn check_name(name: &str) -> Result<(), PkiError> {
    if name.is_empty()
        || name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(PkiError::BadName(name.to_string()));
    }
    Ok(())
}

/// Creates `dir/NAME.crt` and `dir/NAME.key`, signed by the CA in `dir`.
pub fn issue(
    dir: &Path,
    name: &str,
    ips: &[IpAddr],
    validity: Validity,
) -> Result<(PathBuf, PathBuf), PkiError> {
    let (crt, key) = cert_paths(dir, name);
    check_name(name)?;
    refuse_existing(&[&crt, &key])?;
    let (cert_pem, key_pem) = issue_pem(dir, name, ips, validity)?;
    write_new(&key, key_pem.as_bytes(), 0o600)?;
    write_new(&crt, cert_pem.as_bytes(), 0o644)?;
    Ok((crt, key))
}

/// A new certificate for `name` signed by the CA in `dir`: its certificate
/// and key, PEM, not written anywhere (a rotation writes them where the
/// agent reads them).
pub fn issue_pem(
    dir: &Path,
    name: &str,
    ips: &[IpAddr],
    validity: Validity,
) -> Result<(String, String), PkiError> {
    check_name(name)?;
    let (ca_crt, ca_key) = ca_paths(dir);
    let ca_key_pem = read(&ca_key)?;
    let ca_key_pair = KeyPair::from_pem(&ca_key_pem).map_err(|e| PkiError::File {
        path: ca_key.clone(),
        reason: format!("not a usable private key: {e}"),
    })?;
    let ca_pem = read(&ca_crt)?;
    Issuer::from_ca_cert_pem(&ca_pem, &ca_key_pair).map_err(|e| PkiError::File {
        path: ca_crt.clone(),
        reason: format!("not a usable CA certificate: {e}"),
    })?;
    generate_cert(&ca_pem, &ca_key_pair, name, ips, validity)
}

fn refuse_existing(paths: &[&Path]) -> Result<(), PkiError> {
    match paths.iter().find(|p| p.exists()) {
        Some(p) => Err(PkiError::Exists(p.to_path_buf())),
        None => Ok(()),
    }
}

fn create_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|e| PkiError::File {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })
}

fn read(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|e| PkiError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

pub(crate) fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<(), PkiError> {
    let err = |e: std::io::Error| PkiError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(data).map_err(err)
}

/// For this crate's unit tests: loaded credentials for `name`, issued by a
/// CA in `dir` (created by the first call).
#[cfg(test)]
pub(crate) fn test_credentials(dir: &Path, name: &str) -> crate::tls::Credentials {
    let (ca, _) = ca_paths(dir);
    if !ca.exists() {
        init_ca(dir, "CA", Validity::days(1)).unwrap();
    }
    let (cert, key) = issue(dir, name, &[], Validity::days(1)).unwrap();
    crate::tls::Credentials::load(&crate::tls::TlsFiles { ca, cert, key }).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Credentials, TlsFiles};

    #[test]
    fn issued_certificates_load_and_name_their_identity() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = init_ca(dir.path(), "test CA", Validity::days(30)).unwrap();
        let (cert, key) = issue(
            dir.path(),
            "sw1",
            &["10.0.0.1".parse().unwrap()],
            Validity::days(30),
        )
        .unwrap();
        let creds = Credentials::load(&TlsFiles {
            ca,
            cert,
            key: key.clone(),
        })
        .unwrap();
        assert_eq!(creds.identity, "sw1");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn nothing_is_overwritten_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "CA", Validity::days(1)).unwrap();
        assert!(matches!(
            init_ca(dir.path(), "CA", Validity::days(1)),
            Err(PkiError::Exists(_))
        ));
        issue(dir.path(), "ctl", &[], Validity::days(1)).unwrap();
        assert!(matches!(
            issue(dir.path(), "ctl", &[], Validity::days(1)),
            Err(PkiError::Exists(_))
        ));
        for bad in ["", "../x", ".hidden", "a b"] {
            assert!(matches!(
                issue(dir.path(), bad, &[], Validity::days(1)),
                Err(PkiError::BadName(_))
            ));
        }
        let other = tempfile::tempdir().unwrap();
        let e = issue(other.path(), "sw1", &[], Validity::days(1)).unwrap_err();
        assert!(e.to_string().contains("ca.key"), "{e}");
    }

    #[test]
    fn mismatched_key_is_reported_with_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = init_ca(dir.path(), "CA", Validity::days(1)).unwrap();
        let (cert, _) = issue(dir.path(), "a", &[], Validity::days(1)).unwrap();
        let (_, other_key) = issue(dir.path(), "b", &[], Validity::days(1)).unwrap();
        let e = Credentials::load(&TlsFiles {
            ca,
            cert,
            key: other_key,
        })
        .unwrap_err();
        assert!(matches!(e, crate::tls::TlsError::Mismatch { .. }), "{e}");
        assert!(
            e.to_string().contains("a.crt") && e.to_string().contains("b.key"),
            "{e}"
        );
    }
}
