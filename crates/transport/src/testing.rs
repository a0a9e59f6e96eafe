//! Helpers for the loopback tests of the crates above (the agents', the
//! proxy's): a throwaway PKI and a log capture. Behind the `testing` feature,
//! for dev-dependencies only.

use crate::pki::{self, Validity};
use crate::tls::TlsFiles;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bound for anything a test waits for; reaching it is a failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A CA in a temporary directory (removed on drop), and certificates from it.
pub struct TestPki {
    pub dir: tempfile::TempDir,
}

impl TestPki {
    /// A new CA, with a certificate for each of `names`.
    pub fn new(names: &[&str]) -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        pki::init_ca(dir.path(), "test CA", Validity::days(1)).unwrap();
        let p = TestPki { dir };
        for name in names {
            p.issue(name);
        }
        p
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a certificate for `name` (its DNS name and identity).
    pub fn issue(&self, name: &str) -> TlsFiles {
        pki::issue(self.path(), name, &[], Validity::days(1)).unwrap();
        self.files(name)
    }

    /// The files of `name`'s certificate, issued before.
    pub fn files(&self, name: &str) -> TlsFiles {
        TlsFiles {
            ca: self.path().join("ca.crt"),
            cert: self.path().join(format!("{name}.crt")),
            key: self.path().join(format!("{name}.key")),
        }
    }
}

/// Collects the log output of the current thread (use it with a
/// current-thread runtime, so the tasks under test log on the same thread).
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn install() -> (LogCapture, tracing::subscriber::DefaultGuard) {
        let capture = LogCapture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(capture.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (capture, guard)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Lines containing every one of `words`.
    pub fn lines_with(&self, words: &[&str]) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_string)
            .collect()
    }

    /// Waits until a line with all of `words` is logged.
    pub async fn wait_for(&self, words: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self.lines_with(words).into_iter().next() {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {words:?}; log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
