//! The QUIC connection under the proxied TCP connections: its loss resets
//! them (they never hang), the client reconnects, and mutual TLS refuses
//! what the agents refuse.

mod support;

use quicsdn_proxy::config::default_quic;
use quicsdn_proxy::{ProxyClient, ProxyServer};
use std::io::ErrorKind;
use std::time::Duration;
use support::*;

/// Short keepalive and grace period, so a silent path is noticed in a second.
fn quick_grace(q: &mut quicsdn_transport::quic::QuicOptions) {
    q.keepalive = Duration::from_millis(200);
    q.idle_timeout = Duration::from_secs(1);
}

#[tokio::test(flavor = "current_thread")]
async fn losing_the_quic_connection_resets_the_tcp_connections_and_the_client_reconnects() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let (l, t) = target().await;
    let mut sc = server_config(&pki, &[format!("web={t}")]);
    quick_grace(&mut sc.quic);
    let server = ProxyServer::start(sc.clone()).await.unwrap();
    let server_addr = server.local_addr().unwrap();
    let relay = Relay::start(server_addr).await;
    let mut cc = client_config(pki.files("client"), relay.addr, &["web"]);
    quick_grace(&mut cc.quic);
    let client = ProxyClient::start(cc).await.unwrap();
    assert!(client.wait_connected(PATIENCE).await);

    // 1. The path goes silent: both proxies give up after their grace
    // period and reset the TCP connections on their side.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    ping(&mut app, &mut far).await;
    relay.set_blackhole(true);
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "application: {e}");
    let e = read_some(&mut far).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "target: {e}");
    logs.wait_for(&["connection to the proxy server lost", "timed out"])
        .await;
    logs.wait_for(&["proxy client disconnected", "timed out"])
        .await;

    // A TCP connection while the server is unreachable is reset at once
    // (after one connection attempt), with a log line.
    let mut app = connect(&client, "web").await;
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    logs.wait_for(&[
        "no connection to the proxy server",
        "timed out",
        "resetting the TCP connection",
    ])
    .await;

    // 2. The path comes back: the client reconnects by itself.
    relay.set_blackhole(false);
    assert!(client.wait_connected(PATIENCE).await, "no reconnection");
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    ping(&mut app, &mut far).await;

    // 3. The server stops: its close resets the connections at once.
    let started = std::time::Instant::now();
    server.shutdown().await;
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "application: {e}");
    let e = read_some(&mut far).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "target: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // 4. A new server on the same address: the client comes back to it.
    // (quinn releases the old socket once its closing connections drain.)
    sc.listen = server_addr;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let server = loop {
        match ProxyServer::start(sc.clone()).await {
            Ok(s) => break s,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(client.wait_connected(PATIENCE).await, "no reconnection");
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    ping(&mut app, &mut far).await;

    client.shutdown().await;
    let e = read_some(&mut far).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "target: {e}");
    server.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn mutual_tls_refuses_strangers_and_their_tcp_connections_are_reset() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let (l, t) = target().await;
    let server = ProxyServer::start(server_config(&pki, &[format!("web={t}")]))
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();

    let refused = |tls, server_name: &str, app: quicsdn_transport::tls::Application| {
        let mut cc = client_config(tls, addr, &["web"]);
        cc.server_name = server_name.into();
        cc.quic.application = app;
        cc.max_backoff = Duration::from_secs(30);
        cc
    };
    let try_once = |client: ProxyClient| async move {
        let mut app = connect(&client, "web").await;
        let e = read_some(&mut app).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
        client.shutdown().await;
    };

    // 1. A client whose certificate comes from another CA.
    let other = Pki::new();
    let mut intruder = other.issue("intruder");
    intruder.ca = pki.path().join("ca.crt"); // It trusts our server; we do not trust it.
    let c = ProxyClient::start(refused(intruder, "server", default_quic().application))
        .await
        .unwrap();
    try_once(c).await;
    logs.wait_for(&["rejected the proxy client's certificate", "peer=intruder"])
        .await;

    // 2. A server whose certificate does not carry --server-name.
    let c = ProxyClient::start(refused(
        pki.files("client"),
        "elsewhere",
        default_quic().application,
    ))
    .await
    .unwrap();
    try_once(c).await;
    logs.wait_for(&[
        "rejected the proxy server's certificate",
        "peer=server",
        "expected=elsewhere",
    ])
    .await;

    // 3. A switch agent (the agents' protocol name) is not a proxy client.
    let c = ProxyClient::start(refused(
        pki.files("client"),
        "server",
        quicsdn_transport::tls::AGENTS,
    ))
    .await
    .unwrap();
    try_once(c).await;
    logs.wait_for(&[
        "handshake with a proxy client failed",
        "peer doesn't support any known protocol",
    ])
    .await;

    // None of them reached the target.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), l.accept())
            .await
            .is_err(),
        "a refused client's connection reached the target"
    );
    server.shutdown().await;
}
