//! Certificate rotation without restarts: the CA, certificate and key files
//! are read again on SIGHUP and when they change on disk. New handshakes use
//! what was read; established connections keep going (TLS 1.3 authenticates
//! a connection once, at its handshake, so nothing on them depends on the
//! files any more). Files that would not work are refused, with a log line
//! naming the file and why, and the credentials in use keep serving.
//!
//! **Noticing changes.** The files are polled: every few seconds `stat(2)` of
//! each path, following symlinks, gives the device, inode, size and times of
//! the file it resolves to now. A change of any of them is a new version.
//! This sees the ways certificates are replaced in practice: written in
//! place, renamed over (certbot, `install`), and Kubernetes' secret volumes,
//! where `cert.pem -> ..data/cert.pem` and the `..data` symlink is swapped to
//! a new directory at once. Open vSwitch polls its certificate files the same
//! way (`stream-ssl.c` checks their mtimes). Not inotify: a watch follows an
//! inode, not a name, so it misses the `..data` swap and renames over the
//! file unless the directories up the path are watched too, it gets nothing
//! on NFS and some FUSE/overlay mounts, and its queue can overflow;
//! ghostunnel removed its inotify-based reload for this ("doesn't work well
//! in practice", ghostunnel PR #14) in favour of a timer and a signal. Three
//! `stat` calls every few seconds cost nothing.
//!
//! Layers: [`ChangeDetector`] decides when to read (pure: it sees stamps, not
//! files); [`check_replacement`] decides whether what was read may replace
//! what serves (pure); [`task`] is the thin async glue (the poll timer,
//! SIGHUP requests, log lines) around an agent's [`Install`].

use crate::shutdown::Shutdown;
use crate::tls::{Credentials, Role, TlsError, TlsFiles, TlsPem};
use rustls_pki_types::UnixTime;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// How often the files are checked by default. A change is read once two
/// checks in a row saw it ([`ChangeDetector`]), so within two periods.
pub const DEFAULT_POLL: Duration = Duration::from_secs(5);

/// How often the expiry warning is repeated while the certificate nears its end.
const EXPIRY_WARNING_PERIOD: Duration = Duration::from_secs(12 * 60 * 60);

/// One version of a file as `stat(2)` of its path (symlinks followed) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl FileStamp {
    pub fn of(path: &Path) -> io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Ok(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The stamps of the CA, certificate and key files (in that order); `None`
/// where the file cannot be stat'ed now.
pub type Stamps = [Option<FileStamp>; 3];

/// The files' stamps now.
pub fn stamps(files: &TlsFiles) -> Stamps {
    [&files.ca, &files.cert, &files.key].map(|p| FileStamp::of(p).ok())
}

/// Decides, poll by poll, when to read the files again. Pure: it is told
/// what the files look like, and answers whether to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeDetector {
    /// The stamps at the last read (used or refused).
    read: Stamps,
    /// The stamps at the previous poll.
    previous: Stamps,
}

impl ChangeDetector {
    /// `read`: the stamps of the files in use, taken before they were read.
    pub fn new(read: Stamps) -> ChangeDetector {
        ChangeDetector {
            read,
            previous: read,
        }
    }

    /// One poll: true when the files differ from those last read and are
    /// as they were at the previous poll. Waiting for one quiet poll lets a
    /// writer that replaces the files one by one (the certificate, then the
    /// key) finish, so the pair is read once, matched, instead of refused
    /// between the two. A file that cannot be stat'ed (deleted, or between
    /// a delete and a create) is waited for.
    pub fn poll(&mut self, now: Stamps) -> bool {
        let settled = now == self.previous;
        self.previous = now;
        settled && now != self.read && now.iter().all(Option::is_some)
    }

    /// The files were read at `stamps`, whatever came of it: a refused
    /// version is not read (and logged) again until it changes.
    pub fn read_at(&mut self, stamps: Stamps) {
        self.read = stamps;
    }
}

/// Why new files were not put in use. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A file cannot be read or parsed, or the key does not match the certificate.
    #[error(transparent)]
    Unusable(#[from] TlsError),
    #[error("certificate file {cert}: the certificate expired at {not_after}")]
    Expired {
        cert: PathBuf,
        not_after: OffsetDateTime,
    },
    #[error("certificate file {cert}: the certificate is not valid before {not_before}")]
    NotYetValid {
        cert: PathBuf,
        not_before: OffsetDateTime,
    },
    /// The certificate in use chains to the CA file, the new one does not
    /// (a certificate from another CA, or a CA file without its issuer).
    #[error(
        "certificate file {cert} is not valid for the CA in {ca} (the certificate in use is): {reason}"
    )]
    NotFromCa {
        cert: PathBuf,
        ca: PathBuf,
        reason: String,
    },
    /// The agent's identity names its sockets and metrics: changing it takes a restart.
    #[error(
        "certificate file {cert} names {new:?}, but this agent runs as {was:?} (restart the agent to change its identity)"
    )]
    IdentityChanged {
        cert: PathBuf,
        was: String,
        new: String,
    },
}

/// What a rotation must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Which end of the handshake the certificate serves (its key usage).
    pub role: Role,
    /// Refuse a certificate naming another identity.
    pub same_identity: bool,
}

/// Whether `new` may replace `current` for new handshakes at `now`. Pure.
///
/// It must be valid now, name the same identity if the policy says so, and,
/// if the certificate in use chains to the CA file in use, chain to the new
/// CA file (so the same check also refuses a new CA file without the
/// certificate's issuer, which peers sharing that file would refuse too).
/// With two CAs (`ovs-pki`: each end's certificate comes from the CA the
/// other end trusts) only the peer can check the chain.
pub fn check_replacement(
    current: &Credentials,
    new: &Credentials,
    policy: Policy,
    now: OffsetDateTime,
) -> Result<(), Refusal> {
    let cert = || new.files().cert.clone();
    if new.not_after <= now {
        return Err(Refusal::Expired {
            cert: cert(),
            not_after: new.not_after,
        });
    }
    if new.not_before > now {
        return Err(Refusal::NotYetValid {
            cert: cert(),
            not_before: new.not_before,
        });
    }
    if policy.same_identity && new.identity != current.identity {
        return Err(Refusal::IdentityChanged {
            cert: cert(),
            was: current.identity.clone(),
            new: new.identity.clone(),
        });
    }
    let t = unix_time(now);
    if current.verify_own(policy.role, t).is_ok()
        && let Err(reason) = new.verify_own(policy.role, t)
    {
        return Err(Refusal::NotFromCa {
            cert: cert(),
            ca: new.files().ca.clone(),
            reason,
        });
    }
    Ok(())
}

fn unix_time(t: OffsetDateTime) -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_secs(t.unix_timestamp().max(0) as u64))
}

/// The credentials of a starting agent, with what rotation compares later
/// reads against.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub creds: Credentials,
    pem: TlsPem,
    stamps: Stamps,
}

impl Loaded {
    /// [`Credentials::load`], remembering the files' stamps (taken before the
    /// read, so a change during it is noticed at the next poll) and contents.
    pub fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
        let stamps = stamps(files);
        let pem = files.read()?;
        let creds = Credentials::from_pem(files, &pem)?;
        Ok(Loaded { creds, pem, stamps })
    }
}

/// An agent's way of putting new credentials in use for new handshakes.
pub trait Install: Send + Sync + 'static {
    /// Builds the new TLS configurations and makes them the ones new
    /// handshakes use. An error leaves the old ones in place.
    fn install(&self, creds: &Credentials) -> Result<(), TlsError>;

    /// Told of every attempt's outcome (metrics).
    fn outcome(&self, _result: &Result<Reloaded, Refusal>, _current: &Credentials) {}
}

/// A successful read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// New credentials are in use; new handshakes present this serial.
    Replaced { serial: String, previous: String },
    /// The files hold what is in use already: nothing was changed.
    Unchanged { serial: String },
}

/// What started a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Signal,
    Changed,
}

type Request = oneshot::Sender<Result<Reloaded, Refusal>>;

/// Asks the rotation task to read the files now (SIGHUP).
#[derive(Debug, Clone)]
pub struct RotationHandle(mpsc::Sender<Request>);

impl RotationHandle {
    /// Reads the files now and puts them in use if they pass; `None` if the
    /// agent is stopping.
    pub async fn reload(&self) -> Option<Result<Reloaded, Refusal>> {
        let (tx, rx) = oneshot::channel();
        self.0.send(tx).await.ok()?;
        rx.await.ok()
    }
}

/// Where and how to rotate.
#[derive(Debug, Clone)]
pub struct Rotation {
    pub policy: Policy,
    /// How often to check the files; `None`: only on request (SIGHUP).
    pub poll: Option<Duration>,
    /// What the log lines call this agent ("switch agent sw1").
    pub who: String,
}

/// The rotation task, for the agent to spawn, and the handle that asks it
/// for a read: it checks the files every `rotation.poll`, reads them on each
/// [`RotationHandle::reload`], and repeats the expiry warning twice a day.
/// It ends with `shutdown`.
pub fn task(
    loaded: Loaded,
    rotation: Rotation,
    install: Arc<dyn Install>,
    shutdown: Shutdown,
) -> (
    RotationHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel(4);
    (
        RotationHandle(tx),
        run(loaded, rotation, install, rx, shutdown),
    )
}

struct State {
    current: Credentials,
    pem: TlsPem,
    detector: ChangeDetector,
    rotation: Rotation,
    install: Arc<dyn Install>,
    /// Files that could not be stat'ed at the last poll (warned about once).
    missing: [bool; 3],
}

async fn run(
    loaded: Loaded,
    rotation: Rotation,
    install: Arc<dyn Install>,
    mut requests: mpsc::Receiver<Request>,
    shutdown: Shutdown,
) {
    let mut st = State {
        detector: ChangeDetector::new(loaded.stamps),
        current: loaded.creds,
        pem: loaded.pem,
        rotation,
        install,
        missing: [false; 3],
    };
    // Without polling the timer is never awaited (a day, not `MAX`, which
    // would overflow the deadline).
    let period = st
        .rotation
        .poll
        .unwrap_or(Duration::from_secs(24 * 60 * 60));
    let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut expiry = tokio::time::interval_at(
        tokio::time::Instant::now() + EXPIRY_WARNING_PERIOD,
        EXPIRY_WARNING_PERIOD,
    );
    loop {
        tokio::select! {
            _ = poll.tick(), if st.rotation.poll.is_some() => {
                let now = stamps(st.current.files());
                st.note_missing(&now);
                if st.detector.poll(now) {
                    // Logged and reported by `attempt`.
                    let _ = st.attempt(now, Trigger::Changed);
                }
            }
            Some(reply) = requests.recv() => {
                let now = stamps(st.current.files());
                let r = st.attempt(now, Trigger::Signal);
                let _ = reply.send(r);
            }
            _ = expiry.tick() => st.current.warn_if_expiring(),
            _ = shutdown.wait() => return,
        }
    }
}

impl State {
    fn note_missing(&mut self, now: &Stamps) {
        let files = self.current.files().clone();
        let paths = [&files.ca, &files.cert, &files.key];
        for i in 0..3 {
            let gone = now[i].is_none();
            if gone && !self.missing[i] {
                warn!(
                    "{}: cannot read {}; new handshakes keep using the certificate in use (serial {}) until it is back",
                    self.rotation.who,
                    paths[i].display(),
                    self.current.serial
                );
            }
            self.missing[i] = gone;
        }
    }

    fn attempt(&mut self, stamps: Stamps, trigger: Trigger) -> Result<Reloaded, Refusal> {
        self.detector.read_at(stamps);
        let r = self.read_and_install();
        let why = match trigger {
            Trigger::Signal => "on request (SIGHUP)",
            Trigger::Changed => "after they changed on disk",
        };
        let who = &self.rotation.who;
        match &r {
            Ok(Reloaded::Replaced { serial, previous }) => {
                info!(
                    serial = %serial, previous_serial = %previous, identity = %self.current.identity,
                    not_after = %self.current.not_after,
                    "{who}: read the certificate files {why}; new handshakes present certificate serial {serial} (was {previous}); established connections keep going"
                );
                self.current.warn_if_expiring();
            }
            Ok(Reloaded::Unchanged { serial }) => info!(
                serial = %serial,
                "{who}: read the certificate files {why}; they hold the certificate in use (serial {serial})"
            ),
            Err(e) => warn!(
                serial = %self.current.serial,
                "{who}: refused the new certificate files read {why}: {e}; new handshakes keep using the certificate in use (serial {})",
                self.current.serial
            ),
        }
        self.install.outcome(&r, &self.current);
        r
    }

    fn read_and_install(&mut self) -> Result<Reloaded, Refusal> {
        let files = self.current.files().clone();
        let pem = files.read()?;
        if pem == self.pem {
            return Ok(Reloaded::Unchanged {
                serial: self.current.serial.clone(),
            });
        }
        let mut new = Credentials::from_pem(&files, &pem)?;
        new.on_reject = self.current.on_reject.clone();
        check_replacement(
            &self.current,
            &new,
            self.rotation.policy,
            OffsetDateTime::now_utc(),
        )?;
        self.install.install(&new)?;
        let previous = std::mem::replace(&mut self.current, new);
        self.pem = pem;
        Ok(Reloaded::Replaced {
            serial: self.current.serial.clone(),
            previous: previous.serial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{self, Validity};

    fn stamp(ino: u64, mtime_ns: i128) -> Option<FileStamp> {
        Some(FileStamp {
            dev: 1,
            ino,
            size: 100,
            mtime_ns,
            ctime_ns: mtime_ns,
        })
    }

    #[test]
    fn a_change_is_read_once_it_has_settled_and_only_once() {
        let s0 = [stamp(1, 0), stamp(2, 0), stamp(3, 0)];
        let mut d = ChangeDetector::new(s0);
        assert!(!d.poll(s0), "nothing changed");
        // The certificate is replaced; the key follows a poll later.
        let s1 = [stamp(1, 0), stamp(4, 5), stamp(3, 0)];
        assert!(!d.poll(s1), "not settled yet");
        let s2 = [stamp(1, 0), stamp(4, 5), stamp(5, 6)];
        assert!(!d.poll(s2), "still changing");
        assert!(d.poll(s2), "settled");
        d.read_at(s2);
        assert!(!d.poll(s2), "read already");
        assert!(!d.poll(s2));
        // Only the time changes (touch): another version, read again.
        let s3 = [stamp(1, 9), stamp(4, 5), stamp(5, 6)];
        assert!(!d.poll(s3));
        assert!(d.poll(s3));
    }

    #[test]
    fn a_missing_file_is_waited_for_and_a_symlink_swap_is_a_change() {
        let s0 = [stamp(1, 0), stamp(2, 0), stamp(3, 0)];
        let mut d = ChangeDetector::new(s0);
        let gone = [stamp(1, 0), None, stamp(3, 0)];
        assert!(!d.poll(gone));
        assert!(!d.poll(gone), "a missing file is never read");
        // `..data` now points at another directory: other inodes, same times.
        let swapped = [stamp(11, 0), stamp(12, 0), stamp(13, 0)];
        assert!(!d.poll(swapped));
        assert!(d.poll(swapped));
        // Swapped back to the files last read: nothing to do.
        d.read_at(swapped);
        assert!(!d.poll(s0));
        assert!(d.poll(s0), "back to the original version is a change too");
    }

    /// Credentials from PEM made in memory.
    struct Ca {
        cert: String,
        key: rcgen::KeyPair,
    }

    impl Ca {
        fn new() -> Ca {
            let (cert, key) = pki::generate_ca("test CA", Validity::days(2)).unwrap();
            Ca { cert, key }
        }

        fn issue(&self, name: &str, validity: Validity) -> (String, String) {
            pki::generate_cert(&self.cert, &self.key, name, &[], validity).unwrap()
        }

        fn creds(&self, name: &str) -> Credentials {
            let (cert, key) = self.issue(name, Validity::days(1));
            creds(&self.cert, &cert, &key)
        }
    }

    fn files() -> TlsFiles {
        TlsFiles {
            ca: "/etc/q/ca.pem".into(),
            cert: "/etc/q/cert.pem".into(),
            key: "/etc/q/key.pem".into(),
        }
    }

    fn creds(ca: &str, cert: &str, key: &str) -> Credentials {
        try_creds(ca, cert, key).unwrap()
    }

    fn try_creds(ca: &str, cert: &str, key: &str) -> Result<Credentials, TlsError> {
        Credentials::from_pem(
            &files(),
            &TlsPem {
                ca: ca.into(),
                cert: cert.into(),
                key: key.into(),
            },
        )
    }

    const SWITCH: Policy = Policy {
        role: Role::Client,
        same_identity: true,
    };

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn a_new_certificate_from_the_same_ca_replaces_the_old() {
        let ca = Ca::new();
        let (old, new) = (ca.creds("sw1"), ca.creds("sw1"));
        assert_ne!(old.serial, new.serial);
        check_replacement(&old, &new, SWITCH, now()).unwrap();
        let server = Policy {
            role: Role::Server,
            same_identity: false,
        };
        check_replacement(&old, &ca.creds("ctl2"), server, now()).unwrap();
    }

    #[test]
    fn corrupt_or_mismatched_files_are_refused_naming_the_file() {
        let ca = Ca::new();
        let (cert, key) = ca.issue("sw1", Validity::days(1));
        let (_, other_key) = ca.issue("sw1", Validity::days(1));
        let e = try_creds(&ca.cert, &cert, &other_key).unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("/etc/q/key.pem"), "{e}");
        // A truncated certificate: not valid PEM.
        let cut = &cert[..cert.len() / 2];
        let e = try_creds(&ca.cert, cut, &key).unwrap_err();
        assert!(e.to_string().contains("/etc/q/cert.pem"), "{e}");
        // Base64 garbage inside the armour.
        let garbled = cert.replacen("MII", "M!I", 1);
        let e = try_creds(&ca.cert, &garbled, &key).unwrap_err();
        assert!(e.to_string().contains("/etc/q/cert.pem"), "{e}");
        // Something else entirely.
        let e = try_creds("hello\n", &cert, &key).unwrap_err();
        assert!(matches!(e, TlsError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("/etc/q/ca.pem"), "{e}");
    }

    #[test]
    fn a_certificate_from_another_ca_or_expired_or_renamed_is_refused() {
        let ca = Ca::new();
        let current = ca.creds("sw1");
        // Signed by another CA, with our CA file: peers would refuse it.
        let stranger = Ca::new();
        let (cert, key) = stranger.issue("sw1", Validity::days(1));
        let e =
            check_replacement(&current, &creds(&ca.cert, &cert, &key), SWITCH, now()).unwrap_err();
        assert!(matches!(e, Refusal::NotFromCa { .. }), "{e}");
        assert!(e.to_string().contains("/etc/q/cert.pem"), "{e}");
        // The same, by a new CA file that lacks our issuer.
        let current_cert = ca.issue("sw1", Validity::days(1));
        let e = check_replacement(
            &current,
            &creds(&stranger.cert, &current_cert.0, &current_cert.1),
            SWITCH,
            now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/etc/q/ca.pem"), "{e}");
        // A CA file with both CAs (the first step of a CA rotation) is fine.
        let both = format!("{}{}", ca.cert, stranger.cert);
        check_replacement(&current, &creds(&both, &cert, &key), SWITCH, now()).unwrap();
        // Expired.
        let past = Validity {
            not_before: now() - time::Duration::days(3),
            not_after: now() - time::Duration::days(1),
        };
        let (cert, key) = ca.issue("sw1", past);
        let e =
            check_replacement(&current, &creds(&ca.cert, &cert, &key), SWITCH, now()).unwrap_err();
        assert!(matches!(e, Refusal::Expired { .. }), "{e}");
        // Not valid yet.
        let future = Validity {
            not_before: now() + time::Duration::hours(2),
            not_after: now() + time::Duration::days(1),
        };
        let (cert, key) = ca.issue("sw1", future);
        let e =
            check_replacement(&current, &creds(&ca.cert, &cert, &key), SWITCH, now()).unwrap_err();
        assert!(matches!(e, Refusal::NotYetValid { .. }), "{e}");
        // Another identity.
        let e = check_replacement(&current, &ca.creds("sw2"), SWITCH, now()).unwrap_err();
        assert!(matches!(e, Refusal::IdentityChanged { .. }), "{e}");
        assert!(e.to_string().contains("\"sw2\""), "{e}");
    }

    #[test]
    fn with_two_cas_the_chain_is_left_to_the_peer() {
        // ovs-pki: the switch trusts the controller CA; its own certificate
        // comes from the switch CA, which only the controller trusts.
        let (controller_ca, switch_ca) = (Ca::new(), Ca::new());
        let (cert, key) = switch_ca.issue("sw1", Validity::days(1));
        let current = creds(&controller_ca.cert, &cert, &key);
        assert!(current.verify_own(Role::Client, unix_time(now())).is_err());
        let (cert, key) = switch_ca.issue("sw1", Validity::days(1));
        check_replacement(
            &current,
            &creds(&controller_ca.cert, &cert, &key),
            SWITCH,
            now(),
        )
        .unwrap();
    }

    /// Counts installs, as an agent would rebuild its TLS configurations.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    impl Install for Recorder {
        fn install(&self, creds: &Credentials) -> Result<(), TlsError> {
            self.0.lock().unwrap().push(creds.serial.clone());
            Ok(())
        }
    }

    fn write_pair(dir: &Path, ca: &Ca, name: &str) {
        let (cert, key) = ca.issue(name, Validity::days(1));
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cert.pem"), cert).unwrap();
        std::fs::write(dir.join("key.pem"), key).unwrap();
        std::fs::write(dir.join("ca.pem"), &ca.cert).unwrap();
    }

    fn serial_in(dir: &Path) -> String {
        use rustls_pki_types::pem::PemObject;
        let pem = std::fs::read(dir.join("cert.pem")).unwrap();
        let der = rustls_pki_types::CertificateDer::pem_slice_iter(&pem)
            .next()
            .unwrap()
            .unwrap();
        crate::identity::parse(&der).unwrap().serial
    }

    /// Kubernetes' secret volume: `cert.pem -> ..data/cert.pem`, and
    /// `..data` is a symlink swapped to a new directory at once.
    #[tokio::test]
    async fn a_kubernetes_style_symlink_swap_is_noticed_and_a_corrupt_one_refused() {
        use std::os::unix::fs::symlink;
        let ca = Ca::new();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_pair(&d.join("..v1"), &ca, "sw1");
        symlink("..v1", d.join("..data")).unwrap();
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            symlink(format!("..data/{f}"), d.join(f)).unwrap();
        }
        let files = TlsFiles {
            ca: d.join("ca.pem"),
            cert: d.join("cert.pem"),
            key: d.join("key.pem"),
        };
        let loaded = Loaded::load(&files).unwrap();
        let first = loaded.creds.serial.clone();
        let recorder = Arc::new(Recorder::default());
        let shutdown = Shutdown::new();
        let (handle, task) = task(
            loaded,
            Rotation {
                policy: SWITCH,
                poll: Some(Duration::from_millis(20)),
                who: "test".into(),
            },
            recorder.clone(),
            shutdown.clone(),
        );
        let task = tokio::spawn(task);
        let swap = |to: &str| {
            symlink(to, d.join("..data.tmp")).unwrap();
            std::fs::rename(d.join("..data.tmp"), d.join("..data")).unwrap();
        };
        // The new version appears beside the old, then `..data` swaps.
        write_pair(&d.join("..v2"), &ca, "sw1");
        let second = serial_in(&d.join("..v2"));
        assert_ne!(second, first);
        swap("..v2");
        let installed = |n: usize| {
            let recorder = recorder.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while recorder.0.lock().unwrap().len() < n {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .is_ok()
            }
        };
        assert!(installed(1).await, "the swap was not noticed");
        assert_eq!(*recorder.0.lock().unwrap(), vec![second.clone()]);
        // A corrupt version: refused, nothing installed; SIGHUP says why.
        std::fs::create_dir_all(d.join("..v3")).unwrap();
        std::fs::write(d.join("..v3/ca.pem"), &ca.cert).unwrap();
        std::fs::write(
            d.join("..v3/cert.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::copy(d.join("..v2/key.pem"), d.join("..v3/key.pem")).unwrap();
        swap("..v3");
        let e = handle.reload().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("cert.pem"), "{e}");
        assert_eq!(recorder.0.lock().unwrap().len(), 1);
        // A SIGHUP with the files unchanged installs nothing either.
        swap("..v2");
        assert_eq!(
            handle.reload().await.unwrap().unwrap(),
            Reloaded::Unchanged {
                serial: second.clone()
            }
        );
        assert_eq!(recorder.0.lock().unwrap().len(), 1);
        shutdown.trigger();
        task.await.unwrap();
    }
}
