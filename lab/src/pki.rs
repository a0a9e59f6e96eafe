//! The lab's certificate authority, for the `tls` and `quic` transports: the
//! same PKI as `quicsdn pki` (`quicsdn_transport::pki`), so one CA serves OVS
//! (`ovs-vsctl set-ssl`), the controllers' TLS listeners and the quicsdn agents.
//!
//! Layout of the directory: `ca.crt`, `ca.key`, and `NAME.crt`/`NAME.key` per
//! issued name. Each certificate has `CN=NAME` and `NAME` as a DNS
//! subject-alternative name, ECDSA P-256, and is valid for both server and
//! client authentication. Keys are unencrypted and readable by root only.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use quicsdn_transport::pki::{self, Validity};

/// A CA directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

/// A key and its certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    pub key: PathBuf,
    pub cert: PathBuf,
}

/// Lab certificates outlive any lab run.
const DAYS: u32 = 825;

impl Pki {
    /// Creates `dir` with a new CA (`ca.key`, `ca.crt`). Fails if one is there already.
    pub fn create(dir: &Path) -> Result<Pki> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        pki::init_ca(dir, "quicsdn-lab CA", Validity::days(DAYS))?;
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    /// An existing CA directory.
    pub fn open(dir: &Path) -> Pki {
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca_cert(&self) -> PathBuf {
        pki::ca_paths(&self.dir).0
    }

    /// The files [`Pki::issue`] writes for `name`.
    pub fn pair(&self, name: &str) -> CertPair {
        let (cert, key) = pki::cert_paths(&self.dir, name);
        CertPair { key, cert }
    }

    /// The CA, certificate and key an agent named `name` is started with
    /// (`--ca`, `--cert`, `--key`).
    pub fn agent_files(&self, name: &str) -> quicsdn_transport::tls::TlsFiles {
        let pair = self.pair(name);
        quicsdn_transport::tls::TlsFiles {
            ca: self.ca_cert(),
            cert: pair.cert,
            key: pair.key,
        }
    }

    /// Issues `NAME.key` + `NAME.crt` signed by the CA.
    pub fn issue(&self, name: &str) -> Result<CertPair> {
        pki::issue(&self.dir, name, &[], Validity::days(DAYS))
            .with_context(|| format!("issuing a lab certificate for {name}"))?;
        Ok(self.pair(name))
    }
}
