//! A throw-away certificate authority for the lab's `tls` transport, made with
//! `openssl` (ECDSA P-256 keys, PEM files).
//!
//! Layout of the directory: `ca.crt`, `ca.key`, and `NAME.crt`/`NAME.key` per
//! issued name. Each certificate has `CN=NAME` and `NAME` as a DNS
//! subject-alternative name and is valid for both server and client
//! authentication, so the same files serve OVS (`ovs-vsctl set-ssl`), the
//! controllers' TLS listeners and, later, the quicsdn agents (which take PEM
//! files too). Keys are unencrypted and readable by root only.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cmd::run_args;

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

const DAYS: &str = "825";

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name == "ca"
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        bail!("bad certificate name {name:?} (letters, digits, '-', '.'; not \"ca\")");
    }
    Ok(())
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl Pki {
    /// Creates `dir` with a new CA (`ca.key`, `ca.crt`). Fails if one is there already.
    pub fn create(dir: &Path) -> Result<Pki> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        if pki.ca_cert().exists() {
            bail!("{} already exists", pki.ca_cert().display());
        }
        run_args(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &s(&dir.join("ca.key")),
                "-out",
                &s(&pki.ca_cert()),
                "-days",
                DAYS,
                "-subj",
                "/CN=quicsdn-lab CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )?;
        Ok(pki)
    }

    /// An existing CA directory.
    pub fn open(dir: &Path) -> Pki {
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The files [`Pki::issue`] writes for `name`.
    pub fn pair(&self, name: &str) -> CertPair {
        CertPair {
            key: self.dir.join(format!("{name}.key")),
            cert: self.dir.join(format!("{name}.crt")),
        }
    }

    /// Issues `NAME.key` + `NAME.crt` signed by the CA.
    pub fn issue(&self, name: &str) -> Result<CertPair> {
        check_name(name)?;
        let pair = self.pair(name);
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            format!(
                "basicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth,clientAuth\n\
                 subjectAltName=DNS:{name}\n"
            ),
        )?;
        run_args(
            "openssl",
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &s(&pair.key),
                "-out",
                &s(&csr),
                "-subj",
                &format!("/CN={name}"),
            ],
        )?;
        run_args(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &s(&csr),
                "-CA",
                &s(&self.ca_cert()),
                "-CAkey",
                &s(&self.dir.join("ca.key")),
                "-CAcreateserial",
                "-days",
                DAYS,
                "-extfile",
                &s(&ext),
                "-out",
                &s(&pair.cert),
            ],
        )?;
        let _ = std::fs::remove_file(csr);
        let _ = std::fs::remove_file(ext);
        Ok(pair)
    }
}
