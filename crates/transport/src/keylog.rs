//! TLS secrets for Wireshark's QUIC dissector, in the NSS key log format
//! (`LABEL <client_random hex> <secret hex>` per line), through rustls'
//! [`rustls::KeyLog`].
//!
//! Secrets exist only while a handshake runs, so logging applies to the
//! handshakes that happen while it is on, never to connections already up.
//! Two ways to turn it on, both loud (a warning in the log, and in `status`):
//! * `SSLKEYLOGFILE=FILE` in an agent's environment (the convention of
//!   browsers, curl and OpenSSL-based tools): every handshake of the process
//!   is appended to FILE (created mode 0600).
//! * a `quicsdn snoop --keylog` client: the handshakes while it is attached
//!   are sent to it ([`KeyLogHub::subscribe`]).
//!
//! One hub per process ([`hub`]), like the environment variable it reads;
//! every TLS configuration `quic` builds logs to it, and it costs nothing
//! while off (rustls asks [`rustls::KeyLog::will_log`] first).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::mpsc;
use tracing::warn;

/// Lines a subscriber may have waiting; more are dropped (a handshake writes 5).
const SUBSCRIBER_QUEUE: usize = 1024;

/// Where the process's TLS secrets go, if anywhere.
pub struct KeyLogHub {
    file: Option<(PathBuf, Mutex<std::fs::File>)>,
    subscribers: Mutex<Vec<mpsc::Sender<String>>>,
    attached: AtomicUsize,
}

impl std::fmt::Debug for KeyLogHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyLogHub({:?})", self.describe())
    }
}

/// The process's hub; reads `SSLKEYLOGFILE` the first time.
pub fn hub() -> Arc<KeyLogHub> {
    static HUB: OnceLock<Arc<KeyLogHub>> = OnceLock::new();
    HUB.get_or_init(|| {
        let path = std::env::var_os("SSLKEYLOGFILE")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        Arc::new(KeyLogHub::new(path))
    })
    .clone()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl KeyLogHub {
    /// A hub writing to `file` (if given and it can be opened).
    pub fn new(file: Option<PathBuf>) -> KeyLogHub {
        let file = file.and_then(|path| {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => {
                    warn!(
                        "SSLKEYLOGFILE is set: the TLS secrets of every new QUIC handshake are written to {}; \
                         anyone who reads that file can decrypt those connections. Unset it except to debug.",
                        path.display()
                    );
                    Some((path, Mutex::new(f)))
                }
                Err(e) => {
                    warn!("SSLKEYLOGFILE={}: cannot open it ({e}); no TLS secrets are logged", path.display());
                    None
                }
            }
        });
        KeyLogHub {
            file,
            subscribers: Mutex::default(),
            attached: AtomicUsize::new(0),
        }
    }

    /// Sends the secrets of the handshakes from now on to the returned
    /// receiver, until it is dropped.
    pub fn subscribe(&self) -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| !s.is_closed());
        subs.push(tx);
        self.attached.store(subs.len(), Ordering::Relaxed);
        rx
    }

    /// What is being done with secrets, for `status`; `None` when nothing.
    pub fn describe(&self) -> Option<String> {
        let subs = self
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| !s.is_closed())
            .count();
        let mut parts = Vec::new();
        if let Some((path, _)) = &self.file {
            parts.push(format!("written to {} (SSLKEYLOGFILE)", path.display()));
        }
        if subs > 0 {
            parts.push(format!("sent to {subs} snoop client(s)"));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "WARNING: TLS secrets of new handshakes are {}",
                parts.join(" and ")
            )
        })
    }
}

impl rustls::KeyLog for KeyLogHub {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let line = format!("{label} {} {}", hex(client_random), hex(secret));
        if let Some((path, f)) = &self.file {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = writeln!(f, "{line}") {
                warn!("SSLKEYLOGFILE={}: {e}", path.display());
            }
        }
        if self.attached.load(Ordering::Relaxed) > 0 {
            let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
            // A full queue loses the line; a closed one is forgotten.
            subs.retain(|s| {
                !matches!(
                    s.try_send(line.clone()),
                    Err(mpsc::error::TrySendError::Closed(_))
                )
            });
            self.attached.store(subs.len(), Ordering::Relaxed);
        }
    }

    fn will_log(&self, _label: &str) -> bool {
        self.file.is_some() || self.attached.load(Ordering::Relaxed) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::KeyLog;

    #[test]
    fn file_and_subscribers_get_nss_lines_only_while_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let hub = KeyLogHub::new(Some(path.clone()));
        assert!(hub.will_log("CLIENT_HANDSHAKE_TRAFFIC_SECRET"));
        let mut rx = hub.subscribe();
        assert!(
            hub.describe()
                .unwrap()
                .contains("sent to 1 snoop client(s)")
        );
        hub.log("CLIENT_HANDSHAKE_TRAFFIC_SECRET", &[1, 2], &[0xab]);
        assert_eq!(
            rx.try_recv().unwrap(),
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET 0102 ab"
        );
        drop(rx);
        hub.log("EXPORTER_SECRET", &[3], &[4]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET 0102 ab\nEXPORTER_SECRET 03 04\n"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let off = KeyLogHub::new(None);
        assert!(!off.will_log("EXPORTER_SECRET") && off.describe().is_none());
    }

    /// The agents' QUIC configurations log to the hub: a subscriber attached
    /// before a loopback handshake gets its secrets, from both ends.
    #[tokio::test]
    async fn quic_handshakes_log_to_the_hub_while_subscribed() {
        use crate::pki::{self, Validity};
        use crate::quic::{self, QuicOptions};
        use crate::tls::{Credentials, TlsFiles};
        let dir = tempfile::tempdir().unwrap();
        pki::init_ca(dir.path(), "test CA", Validity::days(1)).unwrap();
        let files = |name: &str| {
            pki::issue(dir.path(), name, &[], Validity::days(1)).unwrap();
            Credentials::load(&TlsFiles {
                ca: dir.path().join("ca.crt"),
                cert: dir.path().join(format!("{name}.crt")),
                key: dir.path().join(format!("{name}.key")),
            })
            .unwrap()
        };
        let opts = QuicOptions::default();
        let (server, _) = quic::server_endpoint(
            "127.0.0.1:0".parse().unwrap(),
            &files("ctl"),
            &opts,
            Arc::new(crate::resumption::SessionStore::in_memory(4)),
        )
        .unwrap();
        let client =
            quic::client_endpoint("127.0.0.1:0".parse().unwrap(), &files("sw1"), &opts).unwrap();
        let mut rx = hub().subscribe();
        let addr = server.local_addr().unwrap();
        let accept = tokio::spawn(async move { server.accept().await.unwrap().await.unwrap() });
        let conn = client.connect(addr, "ctl").unwrap().await.unwrap();
        let _server_side = accept.await.unwrap();
        let mut labels = Vec::new();
        while labels.len() < 10 {
            let line = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
                .await
                .expect("the handshake's secrets")
                .unwrap();
            labels.push(line.split(' ').next().unwrap().to_string());
        }
        for label in [
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
            "SERVER_HANDSHAKE_TRAFFIC_SECRET",
            "CLIENT_TRAFFIC_SECRET_0",
            "SERVER_TRAFFIC_SECRET_0",
        ] {
            assert!(
                labels.iter().filter(|l| *l == label).count() >= 2,
                "{labels:?}"
            );
        }
        drop(conn);
    }
}
