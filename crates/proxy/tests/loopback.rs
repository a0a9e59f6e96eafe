//! The proxy pair on loopback: TCP's semantics through it, end to end, with
//! real TCP sockets on both sides.

mod support;

use quicsdn_proxy::{ProxyClient, ProxyServer};
use std::io::ErrorKind;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// A target that, for every connection, reads the upload to its end (so it
/// needs the client's FIN), checks its sha256 against the payload its first
/// bytes name, then sends `down` bytes of the matching reply and closes.
async fn payload_target(listener: TcpListener, up: usize, down: usize) {
    loop {
        let (mut s, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let (n, sha, head) = read_hashed(&mut s).await;
            assert_eq!(n, up, "upload length");
            let seed = seed_of(&head);
            assert_eq!(sha, Payload::sha256(seed, up), "upload sha256, seed {seed}");
            write_payload(&mut s, seed ^ REPLY, down).await;
            s.shutdown().await.unwrap();
        });
    }
}

const REPLY: u64 = 0x5a5a_0000;

/// The seed a payload's first bytes carry: 8 bytes, or 1 for a 1-byte payload
/// (seeds stay below 256), or none.
fn seed_of(head: &[u8]) -> u64 {
    match head.len() {
        0 => 0,
        8 => u64::from_le_bytes(head.try_into().unwrap()),
        _ => head[0] as u64,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_are_byte_identical_both_ways_over_many_concurrent_connections() {
    const MB: usize = 1 << 20;
    // (forward, bytes each way, concurrent connections)
    let cases: [(&str, usize, u64); 4] = [
        ("empty", 0, 4),
        ("one", 1, 4),
        ("k64", 64 * 1024, 8),
        ("m50", 50 * MB, 3),
    ];
    let pki = Pki::new();
    let mut forwards = Vec::new();
    for (name, size, _) in cases {
        let (l, t) = target().await;
        tokio::spawn(payload_target(l, size, size));
        forwards.push(format!("{name}={t}"));
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let (server, client) = pair(&pki, &forwards, &names).await;
    let client = std::sync::Arc::new(client);
    let mut all = tokio::task::JoinSet::new();
    let mut seed = 1u64;
    for (name, size, conns) in cases {
        // All seeds differ (and stay below 256, see seed_of), so a stream
        // delivered to the wrong connection fails its sha256.
        for _ in 0..conns {
            seed += 1;
            let client = client.clone();
            all.spawn(async move {
                let s = connect(&client, name).await;
                let (mut r, mut w) = s.into_split();
                let upload = async {
                    write_payload(&mut w, seed, size).await;
                    w.shutdown().await.unwrap();
                };
                let (_, (n, sha, _)) = tokio::join!(upload, read_hashed(&mut r));
                assert_eq!(n, size, "{name}: download length");
                assert_eq!(
                    sha,
                    Payload::sha256(seed ^ REPLY, size),
                    "{name}: download sha256"
                );
            });
        }
    }
    let done = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while let Some(r) = all.join_next().await {
            r.unwrap();
        }
    })
    .await;
    assert!(done.is_ok(), "transfers did not finish in 120 s");
    stop(server, client).await;
}

async fn stop(server: ProxyServer, client: std::sync::Arc<ProxyClient>) {
    std::sync::Arc::into_inner(client).unwrap().shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn half_close_passes_as_half_close_both_ways() {
    let pki = Pki::new();
    let (l, t) = target().await;
    let (server, client) = pair(&pki, &[format!("web={t}")], &["web"]).await;

    // The application half-closes first: the target sees the end of the
    // request, and its reply still arrives.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    app.write_all(b"request").await.unwrap();
    app.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut far).await.unwrap(), b"request");
    far.write_all(b"reply after your FIN").await.unwrap();
    far.shutdown().await.unwrap();
    assert_eq!(
        read_to_end(&mut app).await.unwrap(),
        b"reply after your FIN"
    );

    // The target half-closes first: the application sees the end, and what
    // it sends afterwards still arrives.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    far.write_all(b"banner").await.unwrap();
    far.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut app).await.unwrap(), b"banner");
    app.write_all(b"still talking").await.unwrap();
    app.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut far).await.unwrap(), b"still talking");

    stop(server, client.into()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn reset_passes_as_reset_both_ways() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let (l, t) = target().await;
    let (server, client) = pair(&pki, &[format!("web={t}")], &["web"]).await;

    // The application resets: the target's connection is reset, not closed.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    ping(&mut app, &mut far).await;
    reset(app);
    let e = read_some(&mut far).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    logs.wait_for(&["forward=web", "reset by the local TCP peer"])
        .await;

    // The target resets: the application's connection is reset, not closed.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    ping(&mut app, &mut far).await;
    reset(far);
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");

    // A reset after a half-close: the application sent its FIN, the target
    // has not answered yet, then the application resets.
    let mut app = connect(&client, "web").await;
    let mut far = accept(&l).await;
    app.write_all(b"request").await.unwrap();
    app.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut far).await.unwrap(), b"request");
    reset(app);
    // Only a reset raises an error on a socket whose FIN was already read.
    tokio::time::timeout(PATIENCE, far.ready(tokio::io::Interest::ERROR))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the target's connection was never reset; log:\n{}",
                logs.text()
            )
        })
        .unwrap();
    let e = far
        .take_error()
        .unwrap()
        .expect("an error event without an error");
    // Linux reports a reset of a connection whose FIN it had received
    // (CLOSE_WAIT) as EPIPE, as it would without the proxies.
    assert_eq!(e.kind(), ErrorKind::BrokenPipe, "{e}");

    // A reset while data is in flight towards the resetting side.
    let mut app = connect(&client, "web").await;
    let far = accept(&l).await;
    app.write_all(&vec![7u8; 1 << 20]).await.unwrap();
    reset(far);
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");

    stop(server, client.into()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_target_resets_the_connection_at_once_and_says_why() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    // A port nothing listens on: bind one, then close it.
    let (l, t) = target().await;
    drop(l);
    let (server, client) = pair(&pki, &[format!("web={t}")], &["web", "nope"]).await;

    let started = std::time::Instant::now();
    let mut app = connect(&client, "web").await;
    app.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "the reset took {:?}",
        started.elapsed()
    );
    let addr = t.trim_start_matches("tcp:");
    logs.wait_for(&[
        "forward=web",
        addr,
        "cannot connect to the target",
        "refused",
    ])
    .await;
    logs.wait_for(&[
        "forward=web",
        "the proxy server could not connect this forward",
        "the target refused the connection",
    ])
    .await;

    // A forward the server does not have: reset, and both sides say so.
    let mut app = connect(&client, "nope").await;
    let e = read_some(&mut app).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    logs.wait_for(&["forward=nope", "does not have", "it has: web"])
        .await;
    logs.wait_for(&["forward=nope", "the proxy server has no such forward"])
        .await;

    // The connection and the other forwards are unaffected.
    assert!(client.is_connected());
    stop(server, client.into()).await;
}
