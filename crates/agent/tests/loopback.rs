//! The agents end to end on loopback, with synthetic OVS and controller endpoints.

mod support;

use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_lanes::StreamMode;
use quicsdn_transport::quic;
use quicsdn_transport::tls::Credentials;
use quicsdn_wire::{Framing, openflow};
use rustls_pki_types::pem::PemObject;
use std::collections::HashMap;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Sends `to_ctl` from OVS and `to_ovs` from the controller at the same time and
/// returns what each side received.
async fn exchange(
    ovs: tokio::net::TcpStream,
    ctl: tokio::net::TcpStream,
    to_ctl: &[Vec<u8>],
    to_ovs: &[Vec<u8>],
) -> (Vec<u8>, Vec<u8>) {
    let (mut ovs_r, mut ovs_w) = ovs.into_split();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    let up_len: usize = to_ctl.iter().map(Vec::len).sum();
    let down_len: usize = to_ovs.iter().map(Vec::len).sum();
    let (_, _, at_ctl, at_ovs) = tokio::join!(
        send_all(&mut ovs_w, to_ctl),
        send_all(&mut ctl_w, to_ovs),
        read_exact_len(&mut ctl_r, up_len),
        read_exact_len(&mut ovs_r, down_len),
    );
    (at_ctl, at_ovs)
}

#[tokio::test]
async fn ordered_openflow_is_byte_identical_in_order_both_ways() {
    let setup =
        OneService::start("openflow", |_, sw| sw.common.streams = StreamMode::Ordered).await;
    let (ovs, ctl) = setup.connect().await;
    let up = openflow_messages(1, 3000);
    let down = openflow_messages(2, 3000);
    let (at_ctl, at_ovs) = exchange(ovs, ctl, &up, &down).await;
    assert!(at_ctl == up.concat(), "switch to controller bytes differ");
    assert!(at_ovs == down.concat(), "controller to switch bytes differ");

    // When OVS closes its connection, the controller's connection closes too.
    let (ovs, mut ctl) = setup.connect().await;
    drop(ovs);
    assert_eq!(read_to_close(&mut ctl).await.unwrap(), b"");
    setup.shutdown().await;
}

#[tokio::test]
async fn ovsdb_json_rpc_is_byte_identical_both_ways_in_the_default_mode() {
    let setup = OneService::start("ovsdb", |_, _| {}).await;
    let (ovs, ctl) = setup.connect().await;
    let up = jsonrpc_messages(3, 2000);
    let down = jsonrpc_messages(4, 2000);
    let (at_ctl, at_ovs) = exchange(ovs, ctl, &up, &down).await;
    assert!(at_ctl == up.concat());
    assert!(at_ovs == down.concat());
    setup.shutdown().await;
}

#[tokio::test]
async fn round_robin_over_16_streams_delivers_every_message_whole() {
    let setup = OneService::start("openflow", |_, sw| {
        sw.common.streams = StreamMode::RoundRobin { lanes: 16 }
    })
    .await;
    let (ovs, ctl) = setup.connect().await;
    let up = openflow_messages(5, 4000);
    let down = openflow_messages(6, 4000);
    let (at_ctl, at_ovs) = exchange(ovs, ctl, &up, &down).await;
    for (sent, got) in [(up, at_ctl), (down, at_ovs)] {
        let mut got = split(Framing::OpenFlow, &got);
        let mut sent = sent.clone();
        got.sort();
        sent.sort();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "a message was lost, duplicated or altered");
    }
    setup.shutdown().await;
}

#[tokio::test]
async fn a_hundred_switch_agents_share_one_controller_agent() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let controller = ControllerAgent::start(controller_config(
        &pki,
        &[format!("openflow={}", fake.target())],
    ))
    .await
    .unwrap();
    let addr = controller.local_addr().unwrap();
    let mut agents = Vec::new();
    for i in 0..100 {
        let cfg = switch_config(pki.issue(&format!("sw{i}")), addr, &s(&["openflow=ptcp:0"]));
        agents.push(SwitchAgent::start(cfg).await.unwrap());
    }
    for a in &agents {
        assert!(
            a.wait_connected(PATIENCE).await,
            "{} never connected",
            a.identity()
        );
    }
    assert_eq!(controller.switches().await.len(), 100);

    // Each switch sends messages whose xid names it; the controller answers every
    // message on the same connection, and each OVS must get exactly its answers.
    let mut ovs = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let mut conn = ovs_connect(a, "openflow").await;
        let hello = openflow::message(openflow::OFP13_VERSION, 0, i as u32, &[]);
        let echo = openflow::message(openflow::OFP13_VERSION, 2, i as u32, &[i as u8; 64]);
        conn.write_all(&[hello, echo].concat()).await.unwrap();
        ovs.push(conn);
    }
    let mut seen = HashMap::new();
    for _ in 0..100 {
        let mut ctl = fake.accept().await;
        let got = read_exact_len(&mut ctl, 8 + 72).await;
        let msgs = split(Framing::OpenFlow, &got);
        let xid = openflow::Header::parse(&msgs[0]).unwrap().xid;
        assert_eq!(
            openflow::Header::parse(&msgs[1]).unwrap().xid,
            xid,
            "messages of two switches mixed"
        );
        ctl.write_all(&openflow::message(
            openflow::OFP13_VERSION,
            3,
            xid,
            &[xid as u8; 16],
        ))
        .await
        .unwrap();
        assert!(
            seen.insert(xid, ctl).is_none(),
            "switch {xid} connected twice"
        );
    }
    for (i, conn) in ovs.iter_mut().enumerate() {
        let reply = read_exact_len(conn, 24).await;
        assert_eq!(
            reply,
            openflow::message(openflow::OFP13_VERSION, 3, i as u32, &[i as u8; 16])
        );
    }
    for a in agents {
        a.shutdown().await;
    }
    controller.shutdown().await;
}

/// Connects with `creds` straight from a QUIC client, as a switch agent would,
/// and returns the connection error the controller agent caused.
async fn rejected_client(
    creds: &Credentials,
    controller: std::net::SocketAddr,
    name: &str,
) -> String {
    let endpoint =
        quic::client_endpoint("127.0.0.1:0".parse().unwrap(), creds, &Default::default()).unwrap();
    let conn = match endpoint.connect(controller, name).unwrap().await {
        Err(e) => return e.to_string(),
        // TLS 1.3: the client may finish before the server has checked its
        // certificate; the rejection then arrives as the connection's close.
        Ok(conn) => conn,
    };
    let reason = tokio::time::timeout(PATIENCE, conn.closed())
        .await
        .expect("never rejected");
    reason.to_string()
}

#[tokio::test(flavor = "current_thread")]
async fn bad_certificates_are_refused_in_the_handshake_and_open_nothing_locally() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let controller = ControllerAgent::start(controller_config(
        &pki,
        &[format!("openflow={}", fake.target())],
    ))
    .await
    .unwrap();
    let addr = controller.local_addr().unwrap();

    // 1. A switch whose certificate comes from another CA.
    let other = Pki::new();
    let mut intruder = other.issue("intruder");
    intruder.ca = pki.path().join("ca.crt"); // It trusts our controller, but we do not trust it.
    let foreign = Credentials::load(&intruder).unwrap();
    let e = rejected_client(&foreign, addr, "ctl").await;
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // Both CAs are called "test CA", so webpki finds the name and fails the signature.
    logs.wait_for(&[
        "rejected the switch agent's certificate",
        "peer=intruder",
        "BadSignature",
    ])
    .await;

    // 2. An expired certificate from the right CA.
    let past = quicsdn_transport::pki::Validity {
        not_before: time::OffsetDateTime::now_utc() - time::Duration::days(10),
        not_after: time::OffsetDateTime::now_utc() - time::Duration::days(1),
    };
    quicsdn_transport::pki::issue(pki.path(), "stale", &[], past).unwrap();
    let expired = Credentials::load(&pki.files("stale")).unwrap();
    let e = rejected_client(&expired, addr, "ctl").await;
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    logs.wait_for(&[
        "rejected the switch agent's certificate",
        "peer=stale",
        "certificate expired",
    ])
    .await;

    // 3. No client certificate at all.
    let mut no_auth = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates({
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pki_types::CertificateDer::pem_file_iter(pki.path().join("ca.crt")).unwrap()
        {
            roots.add(c.unwrap()).unwrap();
        }
        roots
    })
    .with_no_client_auth();
    no_auth.alpn_protocols = vec![b"quicsdn/1".to_vec()];
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(no_auth).unwrap(),
    )));
    let e = match endpoint.connect(addr, "ctl").unwrap().await {
        Err(e) => e.to_string(),
        Ok(c) => tokio::time::timeout(PATIENCE, c.closed())
            .await
            .unwrap()
            .to_string(),
    };
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    logs.wait_for(&["rejected a switch agent during the handshake"])
        .await;

    // 4. A controller whose certificate does not carry --server-name: the switch
    // agent refuses it and logs who it was.
    let mut cfg = switch_config(pki.issue("sw1"), addr, &s(&["openflow=ptcp:0"]));
    cfg.controllers[0].server_name = "not-the-controller".into();
    let wrong = SwitchAgent::start(cfg).await.unwrap();
    logs.wait_for(&[
        "rejected the controller agent's certificate",
        "peer=ctl",
        "expected=not-the-controller",
    ])
    .await;
    assert!(!wrong.is_connected());
    wrong.shutdown().await;

    // None of the above reached the controller: the first local connection the
    // controller agent makes is for a legitimate switch's session.
    let good = SwitchAgent::start(switch_config(
        pki.issue("sw2"),
        addr,
        &s(&["openflow=ptcp:0"]),
    ))
    .await
    .unwrap();
    assert!(good.wait_connected(PATIENCE).await);
    let mut ovs = ovs_connect(&good, "openflow").await;
    ovs.write_all(&openflow::message(4, 0, 0xfeed, &[]))
        .await
        .unwrap();
    let mut first = fake.accept().await;
    let got = read_exact_len(&mut first, 8).await;
    assert_eq!(openflow::Header::parse(&got).unwrap().xid, 0xfeed);
    assert_eq!(controller.switches().await, ["sw2"]);
    good.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_malformed_message_closes_only_its_own_session() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake_of = FakeController::new().await;
    let fake_db = FakeController::new().await;
    let (controller, agent) = pair(
        &pki,
        "sw1",
        &[
            format!("openflow={}", fake_of.target()),
            format!("ovsdb={}", fake_db.target()),
        ],
        &s(&["openflow=ptcp:0", "ovsdb=ptcp:0"]),
        |_, sw| {
            sw.common.max_message = Some(4096);
            // The healthy sessions below exchange random OpenFlow messages and
            // compare bytes: that needs the byte-for-byte mode.
            sw.common.streams = StreamMode::Ordered;
        },
    )
    .await;
    // Healthy sessions: one OpenFlow, one OVSDB.
    let mut good_of = ovs_connect(&agent, "openflow").await;
    good_of
        .write_all(&openflow::message(4, 0, 1, &[]))
        .await
        .unwrap();
    let mut good_of_ctl = fake_of.accept().await;
    read_exact_len(&mut good_of_ctl, 8).await;
    let mut good_db = ovs_connect(&agent, "ovsdb").await;
    good_db
        .write_all(br#"{"id":1,"method":"echo","params":[]}"#)
        .await
        .unwrap();
    let mut good_db_ctl = fake_db.accept().await;
    read_exact_len(&mut good_db_ctl, 36).await;

    // Three bad sessions: a header shorter than itself, JSON garbage, an oversized
    // message. Each is closed on both sides, with one log line saying why.
    let hello = openflow::message(4, 0, 7, &[]);
    let echo = br#"{"id":2,"method":"echo","params":[]}"#.to_vec();
    // (service, controller, valid prefix, bad message, logged reason)
    type BadInput<'a> = (&'a str, &'a FakeController, Vec<u8>, Vec<u8>, &'a str);
    let bad_inputs: [BadInput; 3] = [
        (
            "openflow",
            &fake_of,
            hello.clone(),
            vec![4, 0, 0, 4, 0, 0, 0, 9],
            "declares length 4",
        ),
        (
            "ovsdb",
            &fake_db,
            echo,
            br#"{"id":3,]"#.to_vec(),
            "invalid JSON at byte 8",
        ),
        (
            "openflow",
            &fake_of,
            hello,
            openflow::message(4, 19, 9, &[0; 5000]),
            "exceeds the 4096-byte limit",
        ),
    ];
    for (service, fake, good, bad_part, reason) in bad_inputs {
        let mut bad = ovs_connect(&agent, service).await;
        bad.write_all(&[good.clone(), bad_part].concat())
            .await
            .unwrap();
        let mut bad_ctl = fake.accept().await;
        // What came before the bad message is delivered, as TCP would have; then
        // the session closes on both sides.
        let before = read_to_close(&mut bad_ctl).await.unwrap();
        assert_eq!(before, good, "{service}");
        let _ = read_to_close(&mut bad).await;
        let line = logs
            .wait_for(&["session closed: malformed message from OVS", reason])
            .await;
        assert!(
            line.contains("switch=sw1") && line.contains(&format!("service={service}")),
            "{line}"
        );
        assert!(line.contains("WARN"), "{line}");
    }
    assert_eq!(
        logs.lines_with(&["malformed message"]).len(),
        3,
        "{}",
        logs.text()
    );

    // The healthy sessions never noticed.
    let (of_msgs, db_msgs) = (openflow_messages(9, 200), jsonrpc_messages(10, 200));
    let (of_at_ctl, of_at_ovs) = exchange(good_of, good_of_ctl, &of_msgs, &of_msgs).await;
    assert!(of_at_ctl == of_msgs.concat() && of_at_ovs == of_msgs.concat());
    let (db_at_ctl, db_at_ovs) = exchange(good_db, good_db_ctl, &db_msgs, &db_msgs).await;
    assert!(db_at_ctl == db_msgs.concat() && db_at_ovs == db_msgs.concat());
    agent.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_unknown_service_is_refused_by_name_and_the_rest_works() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let (controller, agent) = pair(
        &pki,
        "sw1",
        &[format!("openflow={}", fake.target())],
        &s(&["openflow=ptcp:0", "snmp=ptcp:0"]),
        |_, _| {},
    )
    .await;
    logs.wait_for(&[
        "\"snmp\" is not configured on the controller agent",
        "switch=sw1",
    ])
    .await;
    logs.wait_for(&[
        "\"snmp\" is configured on the switch agent but not here",
        "switch=sw1",
    ])
    .await;
    let mut snmp = ovs_connect(&agent, "snmp").await;
    snmp.write_all(b"get sysName").await.unwrap();
    let _ = read_to_close(&mut snmp).await;
    logs.wait_for(&[
        "refused a session from the switch agent: unknown service (this agent serves: openflow)",
        "service=snmp",
    ])
    .await;
    logs.wait_for(&[
        "session closed by the controller agent: unknown service",
        "service=snmp",
    ])
    .await;

    let ovs = ovs_connect(&agent, "openflow").await;
    let msgs = openflow_messages(11, 50);
    let (at_ctl, _) = exchange(ovs, fake.accept().await, &msgs, &[]).await;
    assert!(at_ctl == msgs.concat());
    agent.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_controller_closes_the_switch_side_with_a_reason() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    // A port nobody listens on: bound, never listening, and kept bound for
    // the whole test, so a listener of a test running beside this one cannot
    // take the port over (a connect there would then succeed and never close).
    let dead = tokio::net::TcpSocket::new_v4().unwrap();
    dead.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead_target = format!("tcp:{}", dead.local_addr().unwrap());
    let (controller, agent) = pair(
        &pki,
        "sw1",
        &[format!("openflow={dead_target}")],
        &s(&["openflow=ptcp:0"]),
        |_, _| {},
    )
    .await;
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&openflow::message(4, 0, 1, &[]))
        .await
        .unwrap();
    let _ = read_to_close(&mut ovs).await;
    logs.wait_for(&["cannot reach the controller at", &dead_target, "switch=sw1"])
        .await;
    logs.wait_for(&["session closed by the controller agent: local peer unreachable"])
        .await;
    agent.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test]
async fn losing_the_controller_agent_closes_ovs_connections_and_the_switch_reconnects() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let services = [format!("openflow={}", fake.target())];
    let (controller, agent) =
        pair(&pki, "sw1", &services, &s(&["openflow=ptcp:0"]), |_, _| {}).await;
    let addr = controller.local_addr().unwrap();
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&openflow::message(4, 0, 1, &[]))
        .await
        .unwrap();
    let mut ctl = fake.accept().await;
    read_exact_len(&mut ctl, 8).await;

    controller.shutdown().await;
    // OVS's connection is closed, as a lost TCP connection to a controller would be;
    // so is the controller's.
    let _ = read_to_close(&mut ovs).await;
    let _ = read_to_close(&mut ctl).await;
    assert!(!agent.is_connected());

    // The controller agent comes back on the same address; the switch agent finds it.
    let mut cfg = controller_config(&pki, &services);
    cfg.listen = addr;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let controller = loop {
        match ControllerAgent::start(cfg.clone()).await {
            Ok(c) => break c,
            // The old socket may take a moment to be released.
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(agent.wait_connected(PATIENCE).await);
    let ovs = ovs_connect(&agent, "openflow").await;
    let msgs = openflow_messages(12, 20);
    let (at_ctl, at_ovs) = exchange(ovs, fake.accept().await, &msgs, &msgs).await;
    assert!(at_ctl == msgs.concat() && at_ovs == msgs.concat());
    agent.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test]
async fn without_flow_control_credit_the_agent_stops_reading() {
    let setup = OneService::start("openflow", |_, _| {}).await;
    let (ovs, ctl) = setup.connect().await;
    let (_ovs_r, mut ovs_w) = ovs.into_split();
    // The controller reads nothing. OVS writes as fast as it can, up to 256 MiB.
    let msg = openflow::message(4, 10, 0, &[0x42; 65_527]);
    let total_msgs = (256 << 20) / msg.len();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = written.clone();
    let writer = tokio::spawn(async move {
        for _ in 0..total_msgs {
            ovs_w.write_all(&msg).await.unwrap();
            w.fetch_add(msg.len(), std::sync::atomic::Ordering::Relaxed);
        }
        ovs_w
    });
    // Wait until writing stalls: no progress for one second.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = written.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            !writer.is_finished(),
            "all 256 MiB were accepted with nobody reading"
        );
        if now == last {
            break;
        }
        last = now;
    }
    // What was accepted sits in bounded buffers: socket buffers, the stream's
    // flow-control window, one read buffer.
    assert!(last < 64 << 20, "{last} bytes buffered");
    // Nothing is lost: once the controller reads, everything arrives intact.
    let (mut ctl_r, _ctl_w) = ctl.into_split();
    let got = read_exact_len(&mut ctl_r, total_msgs * 65_535).await;
    assert!(
        split(Framing::OpenFlow, &got)
            .iter()
            .all(|m| m.len() == 65_535 && m[8..].iter().all(|b| *b == 0x42))
    );
    writer.await.unwrap();
    setup.shutdown().await;
}

#[tokio::test]
async fn ovsdb_towards_a_listening_ovs_through_a_per_switch_socket() {
    let pki = Pki::new();
    let sockets = tempfile::tempdir().unwrap();
    // OVS's ovsdb-server listening (set-manager ptcp:6640), played by a fake that
    // answers every JSON-RPC request with a reply carrying the same id.
    let ovsdb = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ovsdb_target = format!("tcp:{}", ovsdb.local_addr().unwrap());
    let template = socket_template(sockets.path(), "ovsdb");
    let (controller, agent) = pair(
        &pki,
        "sw7",
        &[format!("ovsdb=punix:{}", template.display())],
        &[format!("ovsdb={ovsdb_target}")],
        |_, _| {},
    )
    .await;
    let per_switch = sockets.path().join("sw7/ovsdb.sock");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !per_switch.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no per-switch socket"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut tool = UnixStream::connect(&per_switch).await.unwrap();
    let request = br#"{"id":"q1","method":"list_dbs","params":[]}"#;
    tool.write_all(request).await.unwrap();
    let (mut server, _) = tokio::time::timeout(PATIENCE, ovsdb.accept())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read_exact_len(&mut server, request.len()).await, request);
    let reply = br#"{"id":"q1","result":["Open_vSwitch"],"error":null}"#;
    server.write_all(reply).await.unwrap();
    assert_eq!(read_exact_len(&mut tool, reply.len()).await, reply);
    // The tool disconnects; the switch side's connection to ovsdb-server closes too.
    drop(tool);
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, server.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    // When the switch goes, so does its socket.
    agent.shutdown().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while per_switch.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "per-switch socket left behind"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    controller.shutdown().await;
}

/// A PACKET_IN (OpenFlow 1.3) of IPv4 flow `flow`, unique by `seq`.
fn packet_in(flow: u8, seq: u32) -> Vec<u8> {
    let mut frame = vec![0xaa; 6];
    frame.extend_from_slice(&[0xbb; 6]);
    frame.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 0, 0, 0, 64, 17, 0, 0]);
    frame.extend_from_slice(&[10, 0, 0, flow, 10, 0, 0, 1, 0x10, 0x00, 0x00, 0x35]);
    frame.extend_from_slice(&seq.to_be_bytes());
    let mut body = vec![0xff; 4];
    body.extend_from_slice(&(frame.len() as u16).to_be_bytes());
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(&openflow::build::ofp_match(&[
        openflow::build::Oxm::InPort(1),
    ]));
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&frame);
    openflow::message(openflow::OFP13_VERSION, 10, 0, &body)
}

#[tokio::test]
async fn safe_mode_through_the_agents_keeps_openflow_order_and_closes_cleanly() {
    use openflow::build::{self, msg_type};
    let setup = OneService::start("openflow", |_, _| {}).await;
    let (ovs, ctl) = setup.connect().await;
    let (mut ovs_r, mut ovs_w) = ovs.into_split();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    // The handshake, then a burst: packet-ins of 5 flows with barrier replies
    // among them, an echo, more packet-ins.
    let mut sent = vec![
        build::hello(1),
        openflow::message(4, msg_type::FEATURES_REPLY, 2, &[0; 24]),
    ];
    for seq in 0..2000u32 {
        sent.push(match seq % 100 {
            50 => openflow::message(4, msg_type::BARRIER_REPLY, seq, &[]),
            77 => build::echo_request(seq, b"alive?"),
            _ => packet_in((seq % 5) as u8, seq),
        });
    }
    let total: usize = sent.iter().map(Vec::len).sum();
    send_all(&mut ovs_w, &sent).await;
    // The controller answers something: it arrives in order too.
    let down = vec![build::features_request(3), build::barrier_request(4)];
    send_all(&mut ctl_w, &down).await;
    let got = split(Framing::OpenFlow, &read_exact_len(&mut ctl_r, total).await);
    assert_eq!(got.len(), sent.len(), "every message once");
    let pos = |m: &Vec<u8>| got.iter().position(|g| g == m).expect("delivered");
    // Handshake first, in order.
    assert_eq!((&got[0], &got[1]), (&sent[0], &sent[1]));
    // Each barrier reply after everything sent before it and before everything after.
    for (i, m) in sent.iter().enumerate() {
        if m[1] == msg_type::BARRIER_REPLY {
            let p = pos(m);
            for (j, other) in sent.iter().enumerate() {
                if other[1] == msg_type::ECHO_REQUEST {
                    continue;
                }
                assert_eq!(
                    j < i,
                    pos(other) < p,
                    "message {j} crossed the barrier reply {i}"
                );
            }
        }
    }
    // Packet-ins of one flow in order.
    for flow in 0..5u32 {
        let of_flow: Vec<usize> = (0..2000u32)
            .filter(|seq| seq % 5 == flow && !matches!(seq % 100, 50 | 77))
            .map(|seq| pos(&packet_in(flow as u8, seq)))
            .collect();
        assert!(of_flow.len() > 350);
        assert!(
            of_flow.windows(2).all(|w| w[0] < w[1]),
            "flow {flow} reordered"
        );
    }
    assert_eq!(read_exact_len(&mut ovs_r, 16).await, down.concat());
    // OVS closes: every lane ends, the controller sees the close.
    drop(ovs_w);
    drop(ovs_r);
    assert_eq!(read_to_close(&mut ctl_r).await.unwrap(), b"");
    setup.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_rebinding_switch_agent_migrates_and_loses_nothing() {
    let (logs, _guard) = LogCapture::install();
    // Random message types: compare bytes in the byte-for-byte mode.
    let setup =
        OneService::start("openflow", |_, sw| sw.common.streams = StreamMode::Ordered).await;
    let (ovs, ctl) = setup.connect().await;
    let (mut ovs_r, mut ovs_w) = ovs.into_split();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    let before = setup.agent.local_addr().unwrap();
    let (first, second) = (openflow_messages(21, 500), openflow_messages(22, 500));
    let first_len: usize = first.iter().map(Vec::len).sum();
    send_all(&mut ovs_w, &first).await;
    send_all(&mut ctl_w, &first).await;
    // Move to a new port while the first batch may still be in flight.
    let after = setup.agent.rebind("127.0.0.1:0".parse().unwrap()).unwrap();
    assert_ne!(before.port(), after.port());
    send_all(&mut ovs_w, &second).await;
    send_all(&mut ctl_w, &second).await;
    let total = first_len + second.iter().map(Vec::len).sum::<usize>();
    let (at_ctl, at_ovs) = tokio::join!(
        read_exact_len(&mut ctl_r, total),
        read_exact_len(&mut ovs_r, total)
    );
    let all = [first.concat(), second.concat()].concat();
    assert!(
        at_ctl == all && at_ovs == all,
        "bytes lost, duplicated or reordered across the migration"
    );
    // One connection, one session: nothing reconnected.
    assert_eq!(
        logs.lines_with(&["connected to the controller agent"])
            .len(),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.lines_with(&["switch agent connected"]).len(), 1);
    assert!(
        logs.lines_with(&["session closed"]).is_empty(),
        "{}",
        logs.text()
    );
    assert!(setup.agent.is_connected());
    setup.shutdown().await;
}

#[tokio::test]
async fn the_control_sockets_report_and_rebind() {
    let dir = tempfile::tempdir().unwrap();
    let (sw_sock, ctl_sock) = (dir.path().join("sw.ctl"), dir.path().join("ctl.ctl"));
    let (a, b) = (sw_sock.clone(), ctl_sock.clone());
    let setup = OneService::start("openflow", move |ctl, sw| {
        sw.common.control = Some(a);
        ctl.common.control = Some(b);
    })
    .await;
    let (mut ovs, mut ctl) = setup.connect().await;
    ovs.write_all(&openflow::message(4, 0, 1, &[]))
        .await
        .unwrap();
    read_exact_len(&mut ctl, 8).await;
    let s = control(&sw_sock, r#"{"cmd":"status"}"#).await;
    assert_eq!(
        (s["ok"].clone(), s["role"].clone()),
        (true.into(), "switch".into()),
        "{s}"
    );
    assert_eq!(s["connections"][0]["switch"], "sw1");
    assert_eq!(s["connections"][0]["sessions"], 1);
    let c = control(&ctl_sock, r#"{"cmd":"status"}"#).await;
    assert_eq!(c["connections"][0]["switch"], "sw1", "{c}");
    assert_eq!(c["connections"][0]["remote"], s["local_addr"]);
    // Rebind through the socket: a new port, seen by the controller agent.
    let r = control(&sw_sock, r#"{"cmd":"rebind"}"#).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_ne!(r["local_addr"], s["local_addr"]);
    ovs.write_all(&openflow::message(4, 2, 2, b"after"))
        .await
        .unwrap();
    read_exact_len(&mut ctl, 13).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let c = control(&ctl_sock, r#"{"cmd":"status"}"#).await;
        if c["connections"][0]["remote"] == r["local_addr"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller agent never saw the new address: {c}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The controller agent does not move; bad requests are answered, not fatal.
    assert_eq!(control(&ctl_sock, r#"{"cmd":"rebind"}"#).await["ok"], false);
    assert_eq!(control(&sw_sock, "nonsense").await["ok"], false);
    setup.shutdown().await;
    assert!(
        !sw_sock.exists() && !ctl_sock.exists(),
        "control sockets left behind"
    );
}
