//! The agents' control socket (`--control PATH`): a unix socket taking one JSON
//! request per line and answering one JSON line, for operators and tests.
//!
//! ```text
//! {"cmd":"status"}                       → what the agent is connected to, per connection
//! {"cmd":"rebind"}                       → (switch agent) move to a new local UDP port
//! {"cmd":"rebind","bind":"10.0.0.9:0"}   → … or to this address
//! {"cmd":"snoop","switch":"sw1","service":"openflow","follow":false}
//!                                        → the messages as they pass (below)
//! ```
//!
//! Answers are `{"ok":true,...}` or `{"ok":false,"error":"…"}`. The socket is
//! created with mode 0600 (root only, like Open vSwitch's control sockets).
//!
//! `snoop` (`quicsdn snoop`) picks one switch and one service (either may be
//! left out when there is only one) and, after its `ok` answer, turns the
//! connection into a stream of [`crate::tap::Event`] JSON lines until the
//! client closes it, the agent stops, or (without `follow`) the watched
//! session closes. See [`crate::tap`] for its bounds.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::Shutdown;
use crate::link::Link;

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    Status,
    Rebind {
        #[serde(default)]
        bind: Option<SocketAddr>,
    },
    Snoop {
        #[serde(default)]
        switch: Option<String>,
        #[serde(default)]
        service: Option<String>,
        /// Keep watching the switch's next sessions too.
        #[serde(default)]
        follow: bool,
        /// Also send the TLS secrets of the handshakes made while attached.
        #[serde(default)]
        keylog: bool,
    },
}

/// What a snoop is attached to.
pub struct Snoop {
    pub switch: String,
    pub service: String,
    /// `openflow`, `jsonrpc` or `raw`: how the client splits and decodes.
    pub framing: &'static str,
    pub subscription: crate::tap::Subscription,
}

impl Snoop {
    /// Subscribes to `switch`'s messages of the service `wanted` names (or
    /// the only one configured); the error lists the choices.
    pub fn attach(
        taps: &Arc<crate::tap::Taps>,
        services: &crate::services::ServiceTable,
        switch: String,
        wanted: Option<&str>,
        follow: bool,
    ) -> Result<Snoop, String> {
        let names: Vec<String> = services.iter().map(|s| s.name.to_string()).collect();
        let service = pick("service", wanted, &names)?;
        let framing = services.get(&service).expect("picked").framing;
        Ok(Snoop {
            subscription: taps.subscribe(&switch, &service, follow),
            switch,
            service,
            framing: framing.name(),
        })
    }
}

/// Picks the one of `names` that `wanted` names, or the only one there is.
pub fn pick(what: &str, wanted: Option<&str>, names: &[String]) -> Result<String, String> {
    let list = || {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    match wanted {
        Some(w) if names.iter().any(|n| n == w) => Ok(w.to_string()),
        Some(w) => Err(format!("no {what} {w:?} here (there is: {})", list())),
        None if names.len() == 1 => Ok(names[0].clone()),
        None if names.is_empty() => Err(format!("no {what} to snoop on yet")),
        None => Err(format!(
            "several {what}s ({}): choose one with --{what}",
            list()
        )),
    }
}

/// One QUIC connection as `status` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// The switch's identity.
    pub switch: String,
    pub remote: SocketAddr,
    pub rtt_ms: f64,
    /// Sessions carried now.
    pub sessions: usize,
    pub sent_packets: u64,
    pub lost_packets: u64,
    pub udp_tx_bytes: u64,
    pub udp_rx_bytes: u64,
    /// The connection began in 0-RTT (a resumed session used before its
    /// handshake completed).
    pub zero_rtt: bool,
    /// True once the handshake has completed.
    pub confirmed: bool,
    /// Messages that crossed before the handshake completed (replay-safe only).
    pub early_messages: u64,
    /// Sessions that held a message until the handshake completed.
    pub early_held_sessions: u64,
}

impl ConnectionStatus {
    pub fn of(link: &Link) -> ConnectionStatus {
        let s = link.conn.stats();
        ConnectionStatus {
            switch: link.switch.to_string(),
            remote: link.conn.remote_address(),
            rtt_ms: s.path.rtt.as_secs_f64() * 1000.0,
            sessions: link.session_count(),
            sent_packets: s.path.sent_packets,
            lost_packets: s.path.lost_packets,
            udp_tx_bytes: s.udp_tx.bytes,
            udp_rx_bytes: s.udp_rx.bytes,
            zero_rtt: link.early_start,
            confirmed: link.is_confirmed(),
            early_messages: link.early.messages.load(Ordering::Relaxed),
            early_held_sessions: link.early.held_sessions.load(Ordering::Relaxed),
        }
    }
}

/// What an agent answers `status` with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// `switch` or `controller`.
    pub role: String,
    pub local_addr: SocketAddr,
    pub connections: Vec<ConnectionStatus>,
    /// (controller agent) handshake admission control: `--max-handshakes`,
    /// handshakes under way, attempts admitted and refused since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<crate::admission::AdmissionStats>,
    /// A warning while TLS secrets are being logged (`SSLKEYLOGFILE`,
    /// `snoop --keylog`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keylog: Option<String>,
}

/// A future a [`Handler`] returns.
pub type Answer<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What an agent does for control requests.
pub trait Handler: Send + Sync + 'static {
    fn status(&self) -> Answer<'_, Status>;
    fn rebind(&self, bind: Option<SocketAddr>) -> Result<SocketAddr, String>;
    /// Attaches a snoop to `switch`'s `service` (each defaulting to the only
    /// one there is).
    fn snoop(
        &self,
        switch: Option<String>,
        service: Option<String>,
        follow: bool,
    ) -> Answer<'_, Result<Snoop, String>> {
        let _ = (switch, service, follow);
        Box::pin(async { Err("this agent cannot be snooped on".to_string()) })
    }
}

async fn answer(handler: &dyn Handler, line: &str) -> serde_json::Value {
    let request: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return serde_json::json!({"ok": false, "error": format!("bad request: {e}")}),
    };
    match request {
        Request::Status => {
            let mut status = handler.status().await;
            status.keylog = quicsdn_transport::keylog::hub().describe();
            let mut v = serde_json::to_value(status).expect("status serialises");
            v["ok"] = true.into();
            v
        }
        Request::Rebind { bind } => match handler.rebind(bind) {
            Ok(addr) => serde_json::json!({"ok": true, "local_addr": addr}),
            Err(e) => serde_json::json!({"ok": false, "error": e}),
        },
        Request::Snoop { .. } => unreachable!("snoop is served by serve_connection"),
    }
}

/// Serves one control connection: requests and answers, until a snoop takes
/// it over.
async fn serve_connection(
    stream: tokio::net::UnixStream,
    handler: Arc<dyn Handler>,
    shutdown: Shutdown,
) {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let snoop = match serde_json::from_str(&line) {
            Ok(Request::Snoop {
                switch,
                service,
                follow,
                keylog,
            }) => Some((handler.snoop(switch, service, follow).await, keylog)),
            _ => None,
        };
        let (snoop, keylog) = match snoop {
            Some((s, k)) => (Some(s), k),
            None => (None, false),
        };
        let answer = match &snoop {
            None => answer(handler.as_ref(), &line).await,
            Some(Err(e)) => serde_json::json!({"ok": false, "error": e}),
            Some(Ok(s)) => serde_json::json!({
                "ok": true, "switch": s.switch, "service": s.service, "framing": s.framing,
            }),
        };
        let mut out = answer.to_string();
        out.push('\n');
        if w.write_all(out.as_bytes()).await.is_err() {
            return;
        }
        if let Some(Ok(s)) = snoop {
            info!(switch = %s.switch, service = %s.service, "snoop client attached");
            let keys = keylog.then(|| {
                warn!(
                    "a snoop client asked for TLS secrets: those of every QUIC handshake until it \
                     detaches are sent to it; whoever holds them can decrypt those connections"
                );
                quicsdn_transport::keylog::hub().subscribe()
            });
            stream_snoop(&s.subscription, keys, &mut lines, &mut w, &shutdown).await;
            info!(switch = %s.switch, service = %s.service, "snoop client detached");
            return;
        }
    }
}

/// Writes a snoop's events as they come, until the client goes away (or
/// writes anything), the watched session ends, or the agent stops. Writes
/// never hold a session back: what piles up meanwhile is bounded by the tap.
async fn stream_snoop(
    sub: &crate::tap::Subscription,
    mut keys: Option<tokio::sync::mpsc::Receiver<String>>,
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    w: &mut tokio::net::unix::OwnedWriteHalf,
    shutdown: &Shutdown,
) {
    loop {
        let mut out = Vec::new();
        let key = async {
            match &mut keys {
                Some(k) => k.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sub.ready() => {}
            Some(line) = key => {
                serde_json::to_writer(&mut out, &serde_json::json!({"ev": "keylog", "line": line}))
                    .expect("serialises");
                out.push(b'\n');
            }
            _ = lines.next_line() => return,
            () = shutdown.wait() => return,
        }
        let (events, ended) = sub.take();
        for e in &events {
            serde_json::to_writer(&mut out, e).expect("events serialise");
            out.push(b'\n');
        }
        if w.write_all(&out).await.is_err() || ended {
            return;
        }
    }
}

/// Binds the control socket (replacing a stale one, refusing a live one).
pub(crate) async fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let listener = quicsdn_transport::local::bind_unix(path).await?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves control requests until `shutdown`; removes the socket file at the end.
pub(crate) async fn serve(
    listener: UnixListener,
    path: std::path::PathBuf,
    handler: Arc<dyn Handler>,
    shutdown: Shutdown,
) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = shutdown.wait() => break,
        };
        let (stream, _) = match conn {
            Ok(c) => c,
            Err(e) => {
                warn!("control socket {}: {e}", path.display());
                continue;
            }
        };
        tokio::spawn(serve_connection(stream, handler.clone(), shutdown.clone()));
    }
    let _ = std::fs::remove_file(&path);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;

    impl Handler for Fake {
        fn status(&self) -> Answer<'_, Status> {
            Box::pin(async {
                Status {
                    role: "switch".into(),
                    local_addr: "127.0.0.1:1".parse().unwrap(),
                    connections: vec![],
                    admission: None,
                    keylog: None,
                }
            })
        }
        fn rebind(&self, bind: Option<SocketAddr>) -> Result<SocketAddr, String> {
            bind.ok_or_else(|| "no".to_string())
        }
    }

    #[tokio::test]
    async fn requests_and_answers() {
        assert_eq!(answer(&Fake, r#"{"cmd":"status"}"#).await["role"], "switch");
        assert_eq!(answer(&Fake, r#"{"cmd":"status"}"#).await["ok"], true);
        let r = answer(&Fake, r#"{"cmd":"rebind","bind":"127.0.0.1:9"}"#).await;
        assert_eq!(r["local_addr"], "127.0.0.1:9");
        assert_eq!(answer(&Fake, r#"{"cmd":"rebind"}"#).await["error"], "no");
        let bad = answer(&Fake, r#"{"cmd":"reboot"}"#).await;
        assert_eq!(bad["ok"], false);
        assert!(
            bad["error"].as_str().unwrap().contains("bad request"),
            "{bad}"
        );
    }

    /// A handler whose only switch is `sw1` with one service, `openflow`.
    struct Snoopable(Arc<crate::tap::Taps>);

    impl Handler for Snoopable {
        fn status(&self) -> Answer<'_, Status> {
            Fake.status()
        }
        fn rebind(&self, bind: Option<SocketAddr>) -> Result<SocketAddr, String> {
            Fake.rebind(bind)
        }
        fn snoop(
            &self,
            switch: Option<String>,
            service: Option<String>,
            follow: bool,
        ) -> Answer<'_, Result<Snoop, String>> {
            let r = pick("switch", switch.as_deref(), &["sw1".into()]).and_then(|switch| {
                let service = pick("service", service.as_deref(), &["openflow".into()])?;
                Ok(Snoop {
                    subscription: self.0.subscribe(&switch, &service, follow),
                    switch,
                    service,
                    framing: "openflow",
                })
            });
            Box::pin(async move { r })
        }
    }

    #[test]
    fn picks_the_only_one_or_lists_the_choices() {
        let two = ["a".to_string(), "b".to_string()];
        assert_eq!(pick("switch", None, &two[..1]), Ok("a".into()));
        assert_eq!(pick("switch", Some("b"), &two), Ok("b".into()));
        assert!(
            pick("switch", None, &two)
                .unwrap_err()
                .contains("(a, b): choose one with --switch")
        );
        assert!(
            pick("service", Some("c"), &two)
                .unwrap_err()
                .contains("no service \"c\" here (there is: a, b)")
        );
        assert!(
            pick("switch", None, &[])
                .unwrap_err()
                .contains("no switch to snoop on yet")
        );
    }

    #[tokio::test]
    async fn snoop_streams_messages_and_secrets_until_the_client_goes() {
        use quicsdn_wire::openflow::build;
        use tokio::io::AsyncBufReadExt;
        let taps = crate::tap::Taps::new();
        let (client, server) = tokio::net::UnixStream::pair().unwrap();
        let task = tokio::spawn(serve_connection(
            server,
            Arc::new(Snoopable(taps.clone())),
            Shutdown::new(),
        ));
        let (r, mut w) = client.into_split();
        let mut lines = BufReader::new(r).lines();
        let mut next = async || -> serde_json::Value {
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap()
        };
        // Status still answers on the same connection; a bad choice is refused.
        w.write_all(b"{\"cmd\":\"status\"}\n{\"cmd\":\"snoop\",\"switch\":\"sw2\"}\n")
            .await
            .unwrap();
        assert_eq!(next().await["ok"], true);
        let refused = next().await;
        assert!(
            refused["error"].as_str().unwrap().contains("sw2"),
            "{refused}"
        );
        w.write_all(b"{\"cmd\":\"snoop\",\"keylog\":true}\n")
            .await
            .unwrap();
        let ok = next().await;
        assert_eq!(
            (&ok["switch"], &ok["service"], &ok["framing"]),
            (&"sw1".into(), &"openflow".into(), &"openflow".into())
        );
        let tap = crate::tap::SessionTap::new(
            taps.clone(),
            "sw1".into(),
            "openflow",
            4,
            quicsdn_wire::Framing::OpenFlow,
        );
        tap.run(
            quicsdn_lanes::rules::Direction::ToSwitch,
            1,
            Some(7),
            &build::barrier_request(9),
        );
        let msg = next().await;
        assert_eq!(
            (&msg["ev"], &msg["session"], &msg["lane"], &msg["stream"]),
            (&"msg".into(), &4.into(), &1.into(), &7.into())
        );
        rustls::KeyLog::log(
            &*quicsdn_transport::keylog::hub(),
            "CLIENT_TRAFFIC_SECRET_0",
            &[1],
            &[2],
        );
        let mut key = next().await;
        // Another test's handshake may log too; ours comes.
        while key["line"] != "CLIENT_TRAFFIC_SECRET_0 01 02" {
            key = next().await;
        }
        assert_eq!(key["ev"], "keylog");
        assert!(
            quicsdn_transport::keylog::hub()
                .describe()
                .unwrap()
                .contains("snoop client")
        );
        // The client goes: the agent forgets it.
        drop((lines, w));
        task.await.unwrap();
        assert_eq!(taps.attached(), 0);
    }
}
