//! Local byte streams: the connections between an agent and the unmodified Open
//! vSwitch or controller beside it (the role of OVS's `lib/stream`).
//!
//! TCP connections get `TCP_NODELAY`: the agent forwards whole messages as soon as
//! it has them, and Nagle's algorithm would only add delay on loopback.
//!
//! Reads return what arrived at once; coalescing (which messages may wait for
//! others) is the agents' decision, made per message in `quicsdn_lanes::coalesce`.

use crate::target::Target;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
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

    /// Splits into independently owned halves.
    pub fn into_split(self) -> (LocalRead, LocalWrite) {
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
        (LocalRead { inner: r }, w)
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

/// The read half of a [`LocalStream`].
#[derive(Debug)]
pub struct LocalRead {
    inner: ReadHalf,
}

/// The write half of a [`LocalStream`].
#[derive(Debug)]
pub enum LocalWrite {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl LocalRead {
    /// Waits until a read would not block (bytes, end of stream or an error),
    /// without a buffer: an idle session need not keep one while it waits.
    /// Readiness may be spurious; the read after it then simply waits.
    pub async fn readable(&self) -> io::Result<()> {
        match &self.inner {
            ReadHalf::Tcp(r) => r.readable().await,
            ReadHalf::Unix(r) => r.readable().await,
        }
    }
}

impl AsyncRead for LocalRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().inner.poll_read(cx, buf)
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
