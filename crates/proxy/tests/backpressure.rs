//! A peer that stops reading: the proxies stop reading too, so the sender
//! stalls after a bounded amount and the proxies' memory stays bounded.
//! (Its own test binary, so the process's memory is the proxies' and this
//! test's alone.)

mod support;

use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

/// The process's resident memory, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_stalls_the_sender_and_memory_stays_bounded() {
    const MB: u64 = 1 << 20;
    const CONNECTIONS: u64 = 3;
    const OFFERED: u64 = 128 * MB; // per connection, if nothing pushed back
    let pki = Pki::new();
    let (l, t) = target().await;
    let (server, client) = pair(&pki, &[format!("web={t}")], &["web"]).await;
    let before = rss_bytes();

    let mut stalled = Vec::new();
    for seed in 1..=CONNECTIONS {
        let mut app = connect(&client, "web").await;
        let far = accept(&l).await; // and never read, for now
        // Write until a write makes no progress for a second.
        let mut p = Payload::new(seed, OFFERED as usize);
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending = 0..0;
        let mut written = 0u64;
        loop {
            if pending.is_empty() {
                let n = p.fill(&mut buf);
                assert!(n > 0, "all {OFFERED} bytes went out: nothing pushed back");
                pending = 0..n;
            }
            match tokio::time::timeout(Duration::from_secs(1), app.write(&buf[pending.clone()]))
                .await
            {
                Ok(n) => {
                    let n = n.unwrap();
                    pending.start += n;
                    written += n as u64;
                }
                Err(_) => break,
            }
        }
        stalled.push((app, far, p, buf, pending, written, seed));
    }
    let grown = rss_bytes().saturating_sub(before);
    let written: Vec<u64> = stalled.iter().map(|s| s.5).collect();
    eprintln!(
        "stalled after {written:?} bytes; memory grew {} MiB",
        grown / MB
    );
    // In flight per connection: the kernel's buffers of four TCP sockets
    // (receive buffers autotune up to net.ipv4.tcp_rmem's maximum, 32 MiB on
    // Debian 12; send buffers to 4 MiB), plus the proxies' bounded share (one
    // stream window, quinn's send buffer, a chunk per direction).
    for w in &written {
        assert!(*w < 96 * MB, "{w} bytes accepted before the sender stalled");
    }
    // The proxies' own memory: a few MiB per stalled connection at most.
    assert!(
        grown < 16 * MB * CONNECTIONS,
        "memory grew {} MiB while {CONNECTIONS} connections were stalled",
        grown / MB
    );

    // The reader wakes up: everything arrives, in order, and the sender
    // finishes.
    let mut checks = tokio::task::JoinSet::new();
    for (app, mut far, mut p, mut buf, pending, _, seed) in stalled {
        checks.spawn(async move {
            let (_, mut w) = app.into_split();
            let send = async move {
                w.write_all(&buf[pending]).await.unwrap();
                loop {
                    let n = p.fill(&mut buf);
                    if n == 0 {
                        break;
                    }
                    w.write_all(&buf[..n]).await.unwrap();
                }
                w.shutdown().await.unwrap();
                w
            };
            let (_w, (n, sha, _)) = tokio::join!(send, read_hashed(&mut far));
            assert_eq!(n as u64, OFFERED);
            assert_eq!(sha, Payload::sha256(seed, OFFERED as usize));
        });
    }
    let done = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(r) = checks.join_next().await {
            r.unwrap();
        }
    })
    .await;
    assert!(done.is_ok(), "the transfers did not finish");
    client.shutdown().await;
    server.shutdown().await;
}
