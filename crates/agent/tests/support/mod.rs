//! Shared pieces of the agents' loopback integration tests: a throwaway PKI,
//! agent configurations, synthetic OVS and controller endpoints, message
//! generators and a log capture.

#![allow(dead_code)] // Each test binary uses a different subset.

use quicsdn_agent::config::{
    CommonConfig, ControllerConfig, ControllerTarget, ServiceConfig, SwitchConfig,
};
use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_transport::Target;
use quicsdn_transport::tls::TlsFiles;
use quicsdn_wire::{Framer, Framing, openflow};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[allow(unused_imports)] // Each test binary uses a different subset.
pub use quicsdn_transport::testing::{LogCapture, PATIENCE, TestPki};

/// A CA in a temporary directory, with a controller certificate named `ctl`.
pub struct Pki(TestPki);

impl Pki {
    pub fn new() -> Pki {
        Pki(TestPki::new(&["ctl"]))
    }
}

impl std::ops::Deref for Pki {
    type Target = TestPki;

    fn deref(&self) -> &TestPki {
        &self.0
    }
}

pub fn common(tls: TlsFiles, services: &[String]) -> CommonConfig {
    let services = services.iter().map(|s| ServiceConfig::parse(s).unwrap());
    CommonConfig::new(tls, services.collect())
}

pub fn controller_config(pki: &Pki, services: &[String]) -> ControllerConfig {
    ControllerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        relaxed_flow_mods: false,
        session_store: None,
        max_handshakes: quicsdn_agent::admission::DEFAULT_MAX_HANDSHAKES,
        server_id: None,
        common: common(pki.files("ctl"), services),
    }
}

pub fn switch_config(tls: TlsFiles, controller: SocketAddr, services: &[String]) -> SwitchConfig {
    SwitchConfig {
        bind: Some("127.0.0.1:0".parse().unwrap()),
        max_backoff: Duration::from_secs(1),
        reconnect_jitter: Duration::ZERO,
        ..SwitchConfig::new(
            ControllerTarget::new(controller.to_string(), "ctl"),
            common(tls, services),
        )
    }
}

/// A synthetic controller: a TCP listener the controller agent dials.
pub struct FakeController {
    pub listener: TcpListener,
}

impl FakeController {
    pub async fn new() -> FakeController {
        FakeController {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }

    pub fn target(&self) -> String {
        format!("tcp:{}", self.listener.local_addr().unwrap())
    }

    pub async fn accept(&self) -> TcpStream {
        tokio::time::timeout(PATIENCE, self.listener.accept())
            .await
            .expect("the controller agent never connected")
            .unwrap()
            .0
    }
}

/// The `ptcp:` port a switch agent listens on for `service`.
pub fn listen_port(agent: &SwitchAgent, service: &str) -> u16 {
    match agent.listeners().iter().find(|(s, _)| s == service) {
        Some((_, Target::PTcp { port, .. })) => *port,
        other => panic!("service {service} listens at {other:?}"),
    }
}

/// Connects like OVS does to the switch agent's `ptcp:` listener for `service`.
pub async fn ovs_connect(agent: &SwitchAgent, service: &str) -> TcpStream {
    TcpStream::connect(("127.0.0.1", listen_port(agent, service)))
        .await
        .unwrap()
}

/// Starts a controller agent and one switch agent named `switch`, each with its
/// services, and waits until they are connected.
pub async fn pair(
    pki: &Pki,
    switch: &str,
    controller_services: &[String],
    switch_services: &[String],
    tweak: impl FnOnce(&mut ControllerConfig, &mut SwitchConfig),
) -> (ControllerAgent, SwitchAgent) {
    let mut ccfg = controller_config(pki, controller_services);
    let mut scfg = switch_config(
        pki.issue(switch),
        "127.0.0.1:1".parse().unwrap(),
        switch_services,
    );
    tweak(&mut ccfg, &mut scfg);
    let controller = ControllerAgent::start(ccfg).await.unwrap();
    scfg.controllers[0].addr = controller.local_addr().unwrap().to_string();
    let agent = SwitchAgent::start(scfg).await.unwrap();
    assert!(
        agent.wait_connected(PATIENCE).await,
        "switch agent never connected"
    );
    (controller, agent)
}

/// A controller agent and a switch agent `sw1` carrying one service from the
/// switch agent's `ptcp:0` listener to a fake controller.
pub struct OneService {
    pub name: String,
    pub pki: Pki,
    pub fake: FakeController,
    pub controller: ControllerAgent,
    pub agent: SwitchAgent,
}

impl OneService {
    pub async fn start(
        name: &str,
        tweak: impl FnOnce(&mut ControllerConfig, &mut SwitchConfig),
    ) -> OneService {
        let pki = Pki::new();
        let fake = FakeController::new().await;
        let (controller, agent) = pair(
            &pki,
            "sw1",
            &[format!("{name}={}", fake.target())],
            &[format!("{name}=ptcp:0")],
            tweak,
        )
        .await;
        OneService {
            name: name.to_string(),
            pki,
            fake,
            controller,
            agent,
        }
    }

    /// A new session: OVS's end and the controller's end.
    pub async fn connect(&self) -> (TcpStream, TcpStream) {
        let ovs = ovs_connect(&self.agent, &self.name).await;
        (ovs, self.fake.accept().await)
    }

    pub async fn shutdown(self) {
        self.agent.shutdown().await;
        self.controller.shutdown().await;
    }
}

/// Deterministic pseudo-random numbers (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` OpenFlow messages of assorted versions, types and sizes (8 to 3,000 bytes,
/// with an occasional 65,535-byte one), each distinct.
pub fn openflow_messages(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let version = [
                openflow::OFP10_VERSION,
                openflow::OFP13_VERSION,
                openflow::OFP15_VERSION,
            ][rng.below(3) as usize];
            let body_len = if rng.below(500) == 0 {
                openflow::MAX_MESSAGE_LEN - openflow::HEADER_LEN
            } else {
                rng.below(3000) as usize
            };
            let body: Vec<u8> = (0..body_len).map(|_| rng.next() as u8).collect();
            openflow::message(version, rng.below(30) as u8, i as u32, &body)
        })
        .collect()
}

/// `n` JSON-RPC messages with nesting, escapes and braces inside strings.
pub fn jsonrpc_messages(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let pad = "x".repeat(rng.below(2000) as usize);
            format!(
                r#"{{"id":{i},"method":"transact","params":["Open_vSwitch",{{"op":"insert","table":"Queue","row":{{"other_config":["map",[["s","}}{{ \"q\\\\ {pad}"]]],"n":[{},-1.5e3,true,null]}}}}]}}"#,
                rng.next()
            )
            .into_bytes()
        })
        .collect()
}

/// Writes all messages, then keeps the write side open.
pub async fn send_all(w: &mut (impl AsyncWrite + Unpin), messages: &[Vec<u8>]) {
    for m in messages {
        w.write_all(m).await.unwrap();
    }
    w.flush().await.unwrap();
}

/// Reads exactly `len` bytes or fails the test.
pub async fn read_exact_len(r: &mut (impl AsyncRead + Unpin), len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    tokio::time::timeout(PATIENCE, r.read_exact(&mut buf))
        .await
        .expect("timed out reading")
        .expect("read failed");
    buf
}

/// Splits a byte stream into whole messages.
pub fn split(framing: Framing, bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut framer = Framer::new(framing, usize::MAX);
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(n) = framer.next_message(&bytes[at..]).unwrap() {
        out.push(bytes[at..at + n].to_vec());
        at += n;
    }
    assert_eq!(at, bytes.len(), "trailing partial message");
    out
}

/// Reads until the peer closes; `Ok(bytes)` on EOF, `Err` on reset.
pub async fn read_to_close(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, r.read_to_end(&mut out))
        .await
        .expect("the connection was never closed")?;
    Ok(out)
}

/// A path for a per-switch socket under a temporary directory.
pub fn socket_template(dir: &Path, service: &str) -> PathBuf {
    dir.join("{switch}").join(format!("{service}.sock"))
}

/// Starts a controller agent on `addr`, once a stopped one has let it go.
pub async fn controller_agent_at(
    pki: &Pki,
    services: &[String],
    addr: SocketAddr,
) -> ControllerAgent {
    let mut cfg = controller_config(pki, services);
    cfg.listen = addr;
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(c) = ControllerAgent::start(cfg.clone()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the controller agent's address never became free")
}

/// One sample's value from an agent's metrics text, by name and exact labels
/// (`name{a="x",b="y"}`); 0 when absent, as Prometheus treats a missing series
/// in a sum. The e2e test parses with a real parser (lab/tests/ops_e2e.rs).
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A UDP relay in front of the controller agent. `hold(true)` keeps the
/// controller agent's packets back (queued, sent on `hold(false)`);
/// [`Relay::lossy`] drops some of them.
pub struct Relay {
    pub addr: SocketAddr,
    pub hold: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(server: SocketAddr) -> Relay {
        Relay::start_with(server, None).await
    }

    /// Drops every `nth` datagram the controller agent sends once `spare`
    /// have passed (the handshake).
    pub async fn lossy(server: SocketAddr, spare: usize, nth: usize) -> Relay {
        Relay::start_with(server, Some((spare, nth))).await
    }

    async fn start_with(server: SocketAddr, loss: Option<(usize, usize)>) -> Relay {
        use tokio::net::UdpSocket;
        let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        back.connect(server).await.unwrap();
        let addr = front.local_addr().unwrap();
        let (hold, mut held) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
            let (mut client, mut from_server) = (None, 0usize);
            let mut queue: Vec<Vec<u8>> = Vec::new();
            loop {
                tokio::select! {
                    r = front.recv_from(&mut a) => {
                        let (n, from) = r.unwrap();
                        client = Some(from);
                        let _ = back.send(&a[..n]).await;
                    }
                    r = back.recv(&mut b) => {
                        // The controller agent restarting refuses packets for a moment.
                        let Ok(n) = r else { continue };
                        from_server += 1;
                        if loss.is_some_and(|(spare, nth)| from_server > spare && from_server % nth == 0) {
                            continue;
                        }
                        match client {
                            Some(c) if !*held.borrow() => { let _ = front.send_to(&b[..n], c).await; }
                            _ => queue.push(b[..n].to_vec()),
                        }
                    }
                    r = held.changed() => {
                        if r.is_err() { return; }
                        if !*held.borrow() && let Some(c) = client {
                            for p in queue.drain(..) {
                                let _ = front.send_to(&p, c).await;
                            }
                        }
                    }
                }
            }
        });
        Relay { addr, hold, task }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends one request line to an agent's control socket and returns its JSON
/// answer.
pub async fn control(path: &Path, request: &str) -> serde_json::Value {
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    s.write_all(format!("{request}\n").as_bytes())
        .await
        .unwrap();
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(s);
    tokio::io::AsyncBufReadExt::read_line(&mut r, &mut line)
        .await
        .unwrap();
    serde_json::from_str(&line).unwrap()
}
