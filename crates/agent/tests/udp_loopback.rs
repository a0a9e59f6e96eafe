//! Both agents over `--transport udp` on loopback, with a synthetic OVS and
//! controller: messages cross whole and in order, EOF passes, a malformed
//! message closes only its session, and UDP needs --allow-unauthenticated.

use quicsdn_agent::config::{
    AgentTransport, CommonConfig, ControllerConfig, ControllerTarget, ServiceConfig, SwitchConfig,
};
use quicsdn_agent::udp::{UdpControllerAgent, UdpSwitchAgent};
use quicsdn_transport::tls::TlsFiles;
use quicsdn_udp::Profile;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn common(services: &[String], profile: Profile) -> CommonConfig {
    let tls = TlsFiles {
        ca: "".into(),
        cert: "".into(),
        key: "".into(),
    };
    let mut c = CommonConfig::new(
        tls,
        services
            .iter()
            .map(|s| ServiceConfig::parse(s).unwrap())
            .collect(),
    );
    c.transport = AgentTransport::Udp(profile);
    c.allow_unauthenticated = true;
    c
}

/// The controller agent's configuration with `common` and defaults.
fn controller_config(common: CommonConfig) -> ControllerConfig {
    ControllerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        relaxed_flow_mods: false,
        session_store: None,
        max_handshakes: quicsdn_agent::admission::DEFAULT_MAX_HANDSHAKES,
        server_id: None,
        common,
    }
}

/// An OpenFlow message of `len` bytes with xid `n`.
fn of(n: u32, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[0] = 4;
    m[1] = 2; // ECHO_REQUEST
    m[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    m[4..8].copy_from_slice(&n.to_be_bytes());
    m
}

async fn pair(profile: Profile) -> (UdpControllerAgent, UdpSwitchAgent, TcpListener, String) {
    let ctl = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = ctl.local_addr().unwrap().port();
    let c = controller_config(common(&[format!("openflow=tcp:127.0.0.1:{port}")], profile));
    let cagent = UdpControllerAgent::start(c, profile).await.unwrap();
    let s = SwitchConfig {
        switch_name: Some("sw-udp".into()),
        bind: Some("127.0.0.1:0".parse().unwrap()),
        max_backoff: Duration::from_secs(1),
        reconnect_jitter: Duration::ZERO,
        ..SwitchConfig::new(
            ControllerTarget::new(cagent.local_addr.to_string(), "ctl"),
            common(&["openflow=ptcp:0:127.0.0.1".to_string()], profile),
        )
    };
    let sagent = UdpSwitchAgent::start(s, profile).await.unwrap();
    let target = sagent.listeners[0].1.to_string();
    let addr = target.trim_start_matches("ptcp:").to_string();
    // ptcp:PORT:IP → IP:PORT
    let (p, ip) = addr.split_once(':').unwrap();
    (cagent, sagent, ctl, format!("{ip}:{p}"))
}

#[tokio::test]
async fn messages_cross_in_order_and_eof_passes_both_profiles() {
    for profile in [Profile::Robust, Profile::Seed] {
        let (cagent, sagent, ctl, sw_addr) = pair(profile).await;
        let mut ovs = TcpStream::connect(&sw_addr).await.unwrap();
        let (mut controller, _) = tokio::time::timeout(Duration::from_secs(10), ctl.accept())
            .await
            .unwrap()
            .unwrap();
        // A 65,535-byte message is fragmented (robust); seed carries at most one
        // datagram's worth.
        let big = if profile == Profile::Robust {
            65_535
        } else {
            60_000
        };
        let sent: Vec<Vec<u8>> = (0..200u32)
            .map(|n| of(n, if n == 100 { big } else { 8 + (n as usize % 50) }))
            .collect();
        let all: Vec<u8> = sent.concat();
        let writer = tokio::spawn(async move {
            ovs.write_all(&all).await.unwrap();
            ovs.shutdown().await.unwrap();
            ovs
        });
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), controller.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(
            got == sent.concat(),
            "{profile}: {} bytes arrived of {}",
            got.len(),
            sent.concat().len()
        );
        // The other way, then the controller closes.
        controller.write_all(&of(7, 16)).await.unwrap();
        controller.shutdown().await.unwrap();
        let mut ovs = writer.await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), ovs.read_to_end(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, of(7, 16));
        assert!(sagent.is_connected());
        sagent.shutdown().await;
        cagent.shutdown().await;
    }
}

#[tokio::test]
async fn a_malformed_message_closes_only_its_session_after_what_came_before() {
    let (cagent, sagent, ctl, sw_addr) = pair(Profile::Robust).await;
    let mut bad = TcpStream::connect(&sw_addr).await.unwrap();
    let (mut c1, _) = ctl.accept().await.unwrap();
    let mut good = TcpStream::connect(&sw_addr).await.unwrap();
    let (mut c2, _) = ctl.accept().await.unwrap();
    // A valid message, then a length below 8.
    let mut b = of(1, 8);
    b.extend_from_slice(&[4, 0, 0, 4, 0, 0, 0, 0]);
    bad.write_all(&b).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c1.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, of(1, 8));
    // The other session still works.
    good.write_all(&of(2, 24)).await.unwrap();
    let mut m = vec![0u8; 24];
    tokio::time::timeout(Duration::from_secs(10), c2.read_exact(&mut m))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m, of(2, 24));
    sagent.shutdown().await;
    cagent.shutdown().await;
}

#[tokio::test]
async fn udp_needs_allow_unauthenticated() {
    let mut c = common(&["openflow=tcp:127.0.0.1:6653".to_string()], Profile::Seed);
    c.allow_unauthenticated = false;
    let cfg = controller_config(c);
    let err = UdpControllerAgent::start(cfg, Profile::Seed)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("--allow-unauthenticated")
            && err.contains("neither authenticates nor encrypts"),
        "{err}"
    );
}

/// `--control`, `--metrics` and `--qlog-dir` belong to the QUIC agents: over
/// UDP each is refused by name, on both agents, instead of being ignored.
#[tokio::test]
async fn udp_refuses_what_only_the_quic_agents_have() {
    type Ask = fn(&mut CommonConfig);
    let asks: [(&str, Ask); 3] = [
        ("--control", |c| {
            c.control = Some("/tmp/quicsdn-udp-refused.sock".into())
        }),
        ("--metrics", |c| {
            c.metrics = Some("127.0.0.1:0".parse().unwrap())
        }),
        ("--qlog-dir or QLOGDIR", |c| {
            c.qlog = Some(quicsdn_transport::quic::Qlog {
                dir: "/tmp/quicsdn-udp-refused-qlog".into(),
            })
        }),
    ];
    for (flag, ask) in asks {
        let mut c = common(&["openflow=tcp:127.0.0.1:6653".to_string()], Profile::Seed);
        ask(&mut c);
        let controller = UdpControllerAgent::start(controller_config(c.clone()), Profile::Seed)
            .await
            .err()
            .expect("the controller agent refuses");
        let mut switch = SwitchConfig::new(ControllerTarget::new("127.0.0.1:1", "ctl"), c);
        switch.switch_name = Some("sw-udp".into());
        let switch = UdpSwitchAgent::start(switch, Profile::Seed)
            .await
            .err()
            .expect("the switch agent refuses");
        for err in [controller.to_string(), switch.to_string()] {
            assert!(
                err.contains(flag) && err.contains("not available with --transport udp"),
                "{err}"
            );
        }
    }
    assert!(!std::path::Path::new("/tmp/quicsdn-udp-refused-qlog").exists());
}

#[tokio::test]
async fn a_message_seed_cannot_carry_closes_its_session_on_both_sides() {
    let (cagent, sagent, ctl, sw_addr) = pair(Profile::Seed).await;
    let mut ovs = TcpStream::connect(&sw_addr).await.unwrap();
    let (mut controller, _) = ctl.accept().await.unwrap();
    let mut b = of(1, 8);
    b.extend_from_slice(&of(2, 65_535));
    ovs.write_all(&b).await.unwrap();
    // What came before arrives; then the controller's connection closes too.
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), controller.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, of(1, 8));
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), ovs.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(n.is_ok_and(|n| n == 0) || rest.is_empty());
    sagent.shutdown().await;
    cagent.shutdown().await;
}

#[tokio::test]
async fn malformed_and_foreign_datagrams_change_nothing() {
    let (cagent, sagent, ctl, sw_addr) = pair(Profile::Robust).await;
    let mut ovs = TcpStream::connect(&sw_addr).await.unwrap();
    let (mut controller, _) = ctl.accept().await.unwrap();
    // Garbage, a truncated DATA, an ACK for an association nobody has, and a
    // DATA claiming to continue a message, all to the controller agent.
    let junk = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for d in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        &[0xD5, 3, 0, 0, 0, 1, 0][..],
        &[0xD5, 4, 1, 2, 3, 4, 0, 1, 0, 0, 0, 9, 0, 9, 0][..],
        &[0xD5, 3, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 2, 0xFF][..],
    ] {
        junk.send_to(d, cagent.local_addr).await.unwrap();
    }
    // The session carries on in both directions.
    ovs.write_all(&of(5, 40)).await.unwrap();
    let mut m = vec![0u8; 40];
    tokio::time::timeout(Duration::from_secs(10), controller.read_exact(&mut m))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m, of(5, 40));
    controller.write_all(&of(6, 16)).await.unwrap();
    let mut m = vec![0u8; 16];
    tokio::time::timeout(Duration::from_secs(10), ovs.read_exact(&mut m))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m, of(6, 16));
    // A datagram for an unknown association is answered with a CLOSE.
    let mut buf = [0u8; 128];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), junk.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let (id, p) = quicsdn_udp::packet::decode(&buf[..n]).unwrap();
    assert!(matches!(
        p,
        quicsdn_udp::packet::Packet::Close {
            code: quicsdn_udp::assoc::code::UNKNOWN_ASSOCIATION,
            ..
        }
    ));
    assert!(id == 0x0102_0304 || id == 1, "{id:#x}");
    assert!(sagent.is_connected());
    sagent.shutdown().await;
    cagent.shutdown().await;
}
