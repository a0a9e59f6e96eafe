//! Shared pieces of the proxy's loopback tests: a throwaway PKI, a proxy pair,
//! deterministic payloads with their sha256, TCP helpers and a log capture.

#![allow(dead_code)] // Each test binary uses a different subset.

use quicsdn_proxy::config::default_quic;
use quicsdn_proxy::{ClientConfig, Forward, ProxyClient, ProxyServer, ServerConfig, Side};
use quicsdn_transport::tls::TlsFiles;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[allow(unused_imports)] // Each test binary uses a different subset.
pub use quicsdn_transport::testing::{LogCapture, PATIENCE, TestPki};

/// A CA in a temporary directory, with certificates `server` and `client`.
pub struct Pki(TestPki);

impl Pki {
    pub fn new() -> Pki {
        Pki(TestPki::new(&["server", "client"]))
    }
}

impl std::ops::Deref for Pki {
    type Target = TestPki;

    fn deref(&self) -> &TestPki {
        &self.0
    }
}

pub fn server_config(pki: &Pki, forwards: &[String]) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: pki.files("server"),
        quic: default_quic(),
        forwards: forwards
            .iter()
            .map(|f| Forward::parse(f, Side::Server).unwrap())
            .collect(),
        connect_timeout: Duration::from_secs(5),
    }
}

pub fn client_config(tls: TlsFiles, server: SocketAddr, forwards: &[&str]) -> ClientConfig {
    ClientConfig {
        server: server.to_string(),
        server_name: "server".into(),
        bind: Some("127.0.0.1:0".parse().unwrap()),
        tls,
        quic: default_quic(),
        forwards: forwards
            .iter()
            .map(|f| Forward::parse(&format!("{f}=ptcp:0"), Side::Client).unwrap())
            .collect(),
        max_backoff: Duration::from_secs(1),
    }
}

/// A server with `forwards` (`NAME=tcp:…`) and a client listening for each
/// of `names`, connected.
pub async fn pair(pki: &Pki, forwards: &[String], names: &[&str]) -> (ProxyServer, ProxyClient) {
    let server = ProxyServer::start(server_config(pki, forwards))
        .await
        .unwrap();
    let client = ProxyClient::start(client_config(
        pki.files("client"),
        server.local_addr().unwrap(),
        names,
    ))
    .await
    .unwrap();
    assert!(
        client.wait_connected(PATIENCE).await,
        "the client never connected"
    );
    (server, client)
}

/// A TCP target: a listener on loopback, port 0.
pub async fn target() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = format!("tcp:{}", l.local_addr().unwrap());
    (l, t)
}

pub async fn accept(l: &TcpListener) -> TcpStream {
    tokio::time::timeout(PATIENCE, l.accept())
        .await
        .expect("the proxy server never connected to the target")
        .unwrap()
        .0
}

pub async fn connect(client: &ProxyClient, forward: &str) -> TcpStream {
    TcpStream::connect(client.listen_addr(forward).unwrap())
        .await
        .unwrap()
}

/// Reads to the end of the stream, with patience.
pub async fn read_to_end(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut v))
        .await
        .expect("no end of stream")?;
    Ok(v)
}

/// Waits for what a read returns (data, end of stream, or an error).
pub async fn read_some(s: &mut TcpStream) -> std::io::Result<usize> {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(PATIENCE, s.read(&mut buf))
        .await
        .expect("the read never returned")
}

/// Sends a byte each way between `a` and `b`, proving the path is up.
pub async fn ping(a: &mut TcpStream, b: &mut TcpStream) {
    a.write_all(b"?").await.unwrap();
    let mut x = [0u8];
    tokio::time::timeout(PATIENCE, b.read_exact(&mut x))
        .await
        .unwrap()
        .unwrap();
    b.write_all(b"!").await.unwrap();
    tokio::time::timeout(PATIENCE, a.read_exact(&mut x))
        .await
        .unwrap()
        .unwrap();
}

/// Resets a TCP connection (SO_LINGER 0, close), as an application can.
pub fn reset(s: TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

/// Deterministic payloads: `len` bytes from `seed` (the seed's own bytes
/// first, so a receiver can tell which payload it got, then xorshift64*).
pub struct Payload {
    seed: u64,
    state: u64,
    at: usize,
    pub len: usize,
}

impl Payload {
    pub fn new(seed: u64, len: usize) -> Payload {
        Payload {
            seed,
            state: seed | 1,
            at: 0,
            len,
        }
    }

    /// Fills `buf` with the next bytes; returns how many (0 at the end).
    pub fn fill(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.len - self.at);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let pos = self.at + i;
            *b = if pos < 8 {
                self.seed.to_le_bytes()[pos]
            } else {
                if pos.is_multiple_of(8) {
                    self.state ^= self.state >> 12;
                    self.state ^= self.state << 25;
                    self.state ^= self.state >> 27;
                }
                (self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> ((pos % 8) * 8)) as u8
            };
        }
        self.at += n;
        n
    }

    pub fn sha256(seed: u64, len: usize) -> Vec<u8> {
        let mut p = Payload::new(seed, len);
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = p.fill(&mut buf);
            if n == 0 {
                return ctx.finish().as_ref().to_vec();
            }
            ctx.update(&buf[..n]);
        }
    }
}

/// Writes `Payload::new(seed, len)` to `w`.
pub async fn write_payload<W: AsyncWriteExt + Unpin>(w: &mut W, seed: u64, len: usize) {
    let mut p = Payload::new(seed, len);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = p.fill(&mut buf);
        if n == 0 {
            return;
        }
        w.write_all(&buf[..n]).await.unwrap();
    }
}

/// Reads `r` to its end: (bytes, sha256, the first 8 bytes).
pub async fn read_hashed<R: AsyncReadExt + Unpin>(r: &mut R) -> (usize, Vec<u8>, Vec<u8>) {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut total, mut head) = (0, Vec::new());
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            return (total, ctx.finish().as_ref().to_vec(), head);
        }
        if head.len() < 8 {
            head.extend_from_slice(&buf[..n.min(8 - head.len())]);
        }
        ctx.update(&buf[..n]);
        total += n;
    }
}

/// A UDP relay between a proxy client and its server that can be told to
/// drop everything, as a path that goes silent does.
pub struct Relay {
    pub addr: SocketAddr,
    blackhole: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(server: SocketAddr) -> Relay {
        use std::sync::atomic::Ordering;
        let outer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let inner = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        inner.connect(server).await.unwrap();
        let addr = outer.local_addr().unwrap();
        let blackhole = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drop_all = blackhole.clone();
        let task = tokio::spawn(async move {
            let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
            let mut client = None;
            loop {
                tokio::select! {
                    r = outer.recv_from(&mut a) => {
                        let (n, from) = r.unwrap();
                        client = Some(from);
                        if !drop_all.load(Ordering::Relaxed) {
                            let _ = inner.send(&a[..n]).await;
                        }
                    }
                    r = inner.recv(&mut b) => {
                        let Ok(n) = r else { continue };
                        if let (Some(c), false) = (client, drop_all.load(Ordering::Relaxed)) {
                            let _ = outer.send_to(&b[..n], c).await;
                        }
                    }
                }
            }
        });
        Relay {
            addr,
            blackhole,
            task,
        }
    }

    pub fn set_blackhole(&self, on: bool) {
        self.blackhole
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
