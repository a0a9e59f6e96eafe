//! Local byte streams: the connections between an agent and the unmodified Open
//! vSwitch or controller beside it (the role of OVS's `lib/stream`).
//!
//! TCP connections get `TCP_NODELAY`: the agent forwards whole messages as soon as
//! it has them, and Nagle's algorithm would only add delay on loopback.
//!
//! **Read coalescing** (off by default; [`set_coalescing`], `quicsdn --coalesce`):
//! when a local peer sends densely (its previous data arrived less than one window
//! ago), a read holds what arrived until the next tick of a process-wide clock of
//! that period, or until [`Coalescing::max_bytes`] have accumulated, then returns
//! all of it at once. Every local connection of the process flushes on the same
//! ticks, so the agent hands QUIC the messages of all services at the same moment
//! and they leave in shared, fuller packets. Isolated data (nothing in the previous
//! window) is never held. Cost: up to one window of added delay while traffic is dense.

use crate::target::Target;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream, tcp, unix};

/// A connected local stream.
#[derive(Debug)]
pub enum LocalStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl LocalStream {
    /// Connects to an active target (`tcp:` or `unix:`).
    pub async fn connect(target: &Target) -> io::Result<LocalStream> {
        match target {
            Target::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Ok(LocalStream::Tcp(stream))
            }
            Target::Unix { path } => Ok(LocalStream::Unix(UnixStream::connect(path).await?)),
            passive => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{passive} is a passive target; cannot connect to it"),
            )),
        }
    }

    /// Splits into independently owned halves. The read half coalesces as set by
    /// [`set_coalescing`].
    pub fn into_split(self) -> (LocalRead, LocalWrite) {
        let co = COALESCING.get().copied();
        self.into_split_with(co)
    }

    /// Splits with the given read coalescing (`None` or a zero window: none).
    pub fn into_split_with(self, coalescing: Option<Coalescing>) -> (LocalRead, LocalWrite) {
        let (r, w) = match self {
            LocalStream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), LocalWrite::Tcp(w))
            }
            LocalStream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), LocalWrite::Unix(w))
            }
        };
        let co = coalescing
            .filter(|c| !c.window.is_zero())
            .map(Coalescer::new);
        (LocalRead { inner: r, co }, w)
    }

    /// The peer's address, for logs (`127.0.0.1:40123`, or the socket path).
    pub fn peer_description(&self) -> String {
        match self {
            LocalStream::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp".into()),
            LocalStream::Unix(_) => "unix".into(),
        }
    }
}

/// Read coalescing settings (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// The flush period; zero turns coalescing off.
    pub window: Duration,
    /// Return at once when this many bytes have accumulated.
    pub max_bytes: usize,
}

static COALESCING: OnceLock<Coalescing> = OnceLock::new();

/// Sets read coalescing for every local connection this process splits from now
/// on. Once per process (the agent's command line); later calls are ignored and
/// return false.
pub fn set_coalescing(c: Coalescing) -> bool {
    COALESCING.set(c).is_ok()
}

/// The read coalescing set for this process, if any.
pub fn coalescing() -> Option<Coalescing> {
    COALESCING.get().copied().filter(|c| !c.window.is_zero())
}

/// Told, at each flush of read coalescing, how long the data was held (zero:
/// isolated data, not held) and how many bytes were handed on.
pub type CoalesceObserver = Box<dyn Fn(Duration, usize) + Send + Sync>;

static OBSERVER: OnceLock<CoalesceObserver> = OnceLock::new();

/// Sets the process's [`CoalesceObserver`] (once; the agent's metrics).
pub fn observe_coalescing(observer: CoalesceObserver) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// The process-wide clock the coalescing windows are aligned to.
fn epoch() -> tokio::time::Instant {
    static EPOCH: OnceLock<tokio::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(tokio::time::Instant::now)
}

/// The first tick of period `window` after `now`.
fn next_tick(now: tokio::time::Instant, window: Duration) -> tokio::time::Instant {
    let e = epoch();
    let since = now.saturating_duration_since(e).as_nanos();
    let w = window.as_nanos().max(1);
    let ticks = since / w + 1;
    e + Duration::from_nanos((ticks * w) as u64)
}

#[derive(Debug)]
enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

impl ReadHalf {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

#[derive(Debug)]
struct Coalescer {
    cfg: Coalescing,
    /// Bytes read and not yet returned.
    held: Vec<u8>,
    /// Bytes of `held` already returned.
    taken: usize,
    /// Return `held` now (tick passed, enough bytes, end of stream or error).
    flushing: bool,
    /// End of stream or an error seen while holding bytes: reported after them.
    deferred: Option<io::Result<()>>,
    last_data: Option<tokio::time::Instant>,
    tick: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the bytes held now began to be held.
    held_since: Option<tokio::time::Instant>,
}

impl Coalescer {
    fn new(cfg: Coalescing) -> Coalescer {
        Coalescer {
            cfg,
            held: Vec::new(),
            taken: 0,
            flushing: false,
            deferred: None,
            last_data: None,
            tick: None,
            held_since: None,
        }
    }

    fn poll_read(
        &mut self,
        inner: &mut ReadHalf,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.flushing
                && self.taken == 0
                && let Some(since) = self.held_since.take()
                && let Some(observe) = OBSERVER.get()
            {
                observe(since.elapsed(), self.held.len());
            }
            if self.flushing {
                let rest = &self.held[self.taken..];
                if !rest.is_empty() {
                    let n = rest.len().min(buf.remaining());
                    buf.put_slice(&rest[..n]);
                    self.taken += n;
                    if self.taken == self.held.len() {
                        self.held.clear();
                        self.taken = 0;
                        self.flushing = false;
                        self.tick = None;
                    }
                    return Poll::Ready(Ok(()));
                }
                self.flushing = false;
            }
            if let Some(d) = self.deferred.take() {
                return Poll::Ready(d);
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match inner.poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    // End of stream: what is held goes first.
                    if self.held.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    self.deferred = Some(Ok(()));
                    self.flushing = true;
                }
                Poll::Ready(Ok(())) => {
                    let now = tokio::time::Instant::now();
                    let dense = self
                        .last_data
                        .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.window);
                    self.last_data = Some(now);
                    if self.held.is_empty() {
                        self.held_since = Some(now);
                    }
                    self.held.extend_from_slice(rb.filled());
                    if !dense && self.tick.is_none() {
                        // Isolated data: never held.
                        self.flushing = true;
                    } else if self.held.len() >= self.cfg.max_bytes {
                        self.flushing = true;
                    } else if self.tick.is_none() {
                        self.tick = Some(Box::pin(tokio::time::sleep_until(next_tick(
                            now,
                            self.cfg.window,
                        ))));
                    }
                }
                Poll::Ready(Err(e)) => {
                    if self.held.is_empty() {
                        return Poll::Ready(Err(e));
                    }
                    self.deferred = Some(Err(e));
                    self.flushing = true;
                }
                Poll::Pending => {
                    let Some(tick) = self.tick.as_mut() else {
                        return Poll::Pending;
                    };
                    ready!(tick.as_mut().poll(cx));
                    self.flushing = true;
                }
            }
        }
    }
}

/// The read half of a [`LocalStream`].
#[derive(Debug)]
pub struct LocalRead {
    inner: ReadHalf,
    co: Option<Coalescer>,
}

/// The write half of a [`LocalStream`].
#[derive(Debug)]
pub enum LocalWrite {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl AsyncRead for LocalRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        match &mut me.co {
            None => me.inner.poll_read(cx, buf),
            Some(co) => co.poll_read(&mut me.inner, cx, buf),
        }
    }
}

impl AsyncWrite for LocalWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LocalWrite::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            LocalWrite::Unix(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LocalWrite::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            LocalWrite::Unix(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LocalWrite::Tcp(w) => Pin::new(w).poll_flush(cx),
            LocalWrite::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LocalWrite::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            LocalWrite::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// A listening local socket. A unix socket file is removed when the listener drops.
#[derive(Debug)]
pub enum LocalListener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl LocalListener {
    /// Listens on a passive target (`ptcp:` or `punix:`). A stale unix socket file
    /// (one nobody listens on any more) is replaced; a live one is an error, so two
    /// agents never steal each other's socket. Missing parent directories are created.
    pub async fn bind(target: &Target) -> io::Result<LocalListener> {
        match target {
            Target::PTcp { port, ip } => {
                let listener = TcpListener::bind((*ip, *port)).await.map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot listen on {target}: {e}"))
                })?;
                Ok(LocalListener::Tcp(listener))
            }
            Target::PUnix { path } => Ok(LocalListener::Unix(bind_unix(path).await?, path.clone())),
            active => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{active} is an active target; cannot listen on it"),
            )),
        }
    }

    pub async fn accept(&self) -> io::Result<LocalStream> {
        match self {
            LocalListener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(LocalStream::Tcp(s))
            }
            LocalListener::Unix(l, _) => Ok(LocalStream::Unix(l.accept().await?.0)),
        }
    }

    /// Where the listener actually listens (with the real port for `ptcp:0`).
    pub fn local_target(&self) -> Target {
        match self {
            LocalListener::Tcp(l) => {
                let a = l.local_addr().expect("bound listener has an address");
                Target::PTcp {
                    port: a.port(),
                    ip: a.ip(),
                }
            }
            LocalListener::Unix(_, path) => Target::PUnix { path: path.clone() },
        }
    }
}

impl Drop for LocalListener {
    fn drop(&mut self) {
        if let LocalListener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Listens on a unix socket path, creating missing parent directories and
/// replacing a stale socket file; a live socket or a non-socket file is an error.
pub async fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    remove_stale_socket(path).await?;
    UnixListener::bind(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", path.display()),
        )
    })
}

async fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; not replacing it",
                path.display()
            ),
        ));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is in use by another process", path.display()),
        )),
        Err(_) => std::fs::remove_file(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn unix_listener_replaces_stale_sockets_but_not_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/of.sock");
        let target = Target::PUnix { path: path.clone() };
        let live = LocalListener::bind(&target).await.unwrap();
        let e = LocalListener::bind(&target).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        // A socket file left behind by a dead process is replaced.
        let std_listener =
            std::os::unix::net::UnixListener::bind(dir.path().join("stale.sock")).unwrap();
        drop(std_listener);
        let stale = Target::PUnix {
            path: dir.path().join("stale.sock"),
        };
        let replaced = LocalListener::bind(&stale).await.unwrap();
        drop(replaced);
        assert!(
            !dir.path().join("stale.sock").exists(),
            "socket file removed on drop"
        );
        drop(live);
        assert!(!path.exists());
        std::fs::write(&path, b"not a socket").unwrap();
        let e = LocalListener::bind(&target).await.unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
    }

    #[tokio::test]
    async fn coalescing_holds_dense_data_and_never_isolated_data() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let mut w = b;
        // A window far longer than the test: only the byte limit can release a held read.
        let co = Coalescing {
            window: Duration::from_secs(3600),
            max_bytes: 3,
        };
        let (mut rd, _wr) = LocalStream::Unix(a).into_split_with(Some(co));
        let mut buf = [0u8; 64];
        // Isolated data is returned at once.
        w.write_all(b"a").await.unwrap();
        let n = rd.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"a");
        // Data right behind it is dense: held, not returned.
        w.write_all(b"b").await.unwrap();
        {
            let held = tokio::time::timeout(Duration::from_millis(50), rd.read(&mut buf)).await;
            assert!(held.is_err(), "dense data was returned at once");
        }
        // The dropped read left "b" held; more data reaching the byte limit releases all.
        w.write_all(b"cd").await.unwrap();
        let n = rd.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"bcd");
        // Held data comes before the end of the stream.
        w.write_all(b"e").await.unwrap();
        w.shutdown().await.unwrap();
        let n = rd.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"e");
        assert_eq!(rd.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn coalescing_releases_held_data_on_the_tick() {
        let (a, mut w) = tokio::net::UnixStream::pair().unwrap();
        let co = Coalescing {
            window: Duration::from_millis(20),
            max_bytes: 1 << 20,
        };
        let (mut rd, _wr) = LocalStream::Unix(a).into_split_with(Some(co));
        let mut buf = [0u8; 64];
        w.write_all(b"x").await.unwrap();
        assert_eq!(rd.read(&mut buf).await.unwrap(), 1);
        w.write_all(b"yz").await.unwrap();
        let n = rd.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"yz");
        assert!(next_tick(tokio::time::Instant::now(), co.window) > tokio::time::Instant::now());
    }

    #[tokio::test]
    async fn tcp_round_trip_and_half_close() {
        let listener = LocalListener::bind(&Target::PTcp {
            port: 0,
            ip: "127.0.0.1".parse().unwrap(),
        })
        .await
        .unwrap();
        let Target::PTcp { port, .. } = listener.local_target() else {
            unreachable!()
        };
        let connect = Target::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        let (client, server) = tokio::join!(LocalStream::connect(&connect), listener.accept());
        let (mut cr, mut cw) = client.unwrap().into_split();
        let (mut sr, mut sw) = server.unwrap().into_split();
        cw.write_all(b"hello").await.unwrap();
        cw.shutdown().await.unwrap();
        let mut got = Vec::new();
        sr.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        sw.write_all(b"back").await.unwrap();
        drop(sw);
        let mut got = Vec::new();
        cr.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"back");
    }
}
