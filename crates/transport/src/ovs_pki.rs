//! `quicsdn pki import`: certificates made by Open vSwitch's `ovs-pki`, for
//! the agents.
//!
//! `ovs-pki init` makes two CAs in its directory (`/var/lib/openvswitch/pki`
//! by default): `controllerca/cacert.pem` signs controllers' certificates,
//! `switchca/cacert.pem` switches'. `ovs-pki req+sign NAME switch|controller`
//! writes `NAME-privkey.pem` and `NAME-cert.pem` in the current directory.
//! As in OVS (`ovs-vsctl set-ssl`), each end trusts the *other* end's CA: the
//! switch agent's `--ca` is the controller CA, the controller agent's the
//! switch CA. The import checks the pair (parses, key matches, signed by the
//! CA of its role, not expired) and copies the three files where the agent
//! reads them, so the ovs-pki directory's private CA keys never need to be
//! on the agent's host.

use crate::pki::PkiError;
use crate::tls::{Credentials, Role, TlsFiles};
use std::path::Path;

/// Which agent the certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRole {
    Switch,
    Controller,
}

impl AgentRole {
    /// ovs-pki's name for the CA that signs this role's certificates.
    fn own_ca(self) -> &'static str {
        match self {
            AgentRole::Switch => "switchca",
            AgentRole::Controller => "controllerca",
        }
    }

    /// The CA this role trusts: the other end's.
    fn peer_ca(self) -> &'static str {
        match self {
            AgentRole::Switch => "controllerca",
            AgentRole::Controller => "switchca",
        }
    }

    fn tls_role(self) -> Role {
        match self {
            AgentRole::Switch => Role::Client,
            AgentRole::Controller => Role::Server,
        }
    }
}

/// What was imported.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The files to give the agent (`ca`, `cert`, `key`).
    pub files: TlsFiles,
    /// The identity the agents will know it by.
    pub identity: String,
    pub serial: String,
    /// Said to the operator (e.g. a name ovs-pki made unique with a UUID).
    pub warnings: Vec<String>,
}

fn file_err(path: &Path, reason: impl std::fmt::Display) -> PkiError {
    PkiError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Imports `FROM/NAME-cert.pem` and `FROM/NAME-privkey.pem`, made by
/// `ovs-pki req+sign NAME switch|controller` with the PKI in `pki_dir`, into
/// `out` as `ca.crt` (the peer's CA), `NAME.crt` and `NAME.key` (mode 0600).
/// Nothing is overwritten.
pub fn import(
    pki_dir: &Path,
    from: &Path,
    name: &str,
    role: AgentRole,
    out: &Path,
) -> Result<Imported, PkiError> {
    let own_ca = pki_dir.join(role.own_ca()).join("cacert.pem");
    let peer_ca = pki_dir.join(role.peer_ca()).join("cacert.pem");
    let cert = from.join(format!("{name}-cert.pem"));
    let key = from.join(format!("{name}-privkey.pem"));
    for (p, hint) in [
        (&own_ca, "run `ovs-pki init` (or give --ovs-pki DIR)"),
        (&peer_ca, "run `ovs-pki init` (or give --ovs-pki DIR)"),
        (&cert, "run `ovs-pki req+sign NAME switch|controller` there"),
        (&key, "run `ovs-pki req+sign NAME switch|controller` there"),
    ] {
        if !p.is_file() {
            return Err(file_err(p, format!("not found: {hint}")));
        }
    }
    // Signed by the CA of its role: what the other end will check.
    let against_own = Credentials::load(&TlsFiles {
        ca: own_ca.clone(),
        cert: cert.clone(),
        key: key.clone(),
    })
    .map_err(|e| file_err(&cert, e))?;
    let now = rustls_pki_types::UnixTime::now();
    against_own.verify_own(role.tls_role(), now).map_err(|e| {
        file_err(
            &cert,
            format!(
                "not a valid {} certificate from {}: {e}",
                role.own_ca().trim_end_matches("ca"),
                own_ca.display()
            ),
        )
    })?;
    let mut warnings = Vec::new();
    let identity = against_own.identity.clone();
    if identity.contains(' ') {
        // ovs-pki without -u names it "NAME id:UUID" (also as its DNS name).
        match role {
            AgentRole::Controller => {
                return Err(file_err(
                    &cert,
                    format!(
                        "the certificate names {identity:?}, which no --server-name can match (ovs-pki appends a UUID unless told the name is unique): issue it with `ovs-pki -u req+sign {name} controller`"
                    ),
                ));
            }
            AgentRole::Switch => warnings.push(format!(
                "the certificate names {identity:?} (ovs-pki appends a UUID unless given -u): logs, metrics and per-switch socket paths will use that name; `ovs-pki -u req+sign {name} switch` makes it {name:?}"
            )),
        }
    }
    std::fs::create_dir_all(out).map_err(|e| file_err(out, e))?;
    let files = TlsFiles {
        ca: out.join("ca.crt"),
        cert: out.join(format!("{name}.crt")),
        key: out.join(format!("{name}.key")),
    };
    for p in [&files.ca, &files.cert, &files.key] {
        if p.exists() {
            return Err(PkiError::Exists(p.clone()));
        }
    }
    let copy = |from: &Path, to: &Path, mode: u32| -> Result<(), PkiError> {
        let data = std::fs::read(from).map_err(|e| file_err(from, e))?;
        crate::pki::write_new(to, &data, mode)
    };
    copy(&peer_ca, &files.ca, 0o644)?;
    copy(&cert, &files.cert, 0o644)?;
    copy(&key, &files.key, 0o600)?;
    // What the agent will load: the peer's CA must parse too.
    let loaded = Credentials::load(&files).map_err(|e| file_err(&files.ca, e))?;
    Ok(Imported {
        files,
        identity,
        serial: loaded.serial,
        warnings,
    })
}
