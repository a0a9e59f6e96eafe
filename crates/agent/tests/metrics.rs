//! The agents' metrics on loopback: what crosses is counted by type, size and
//! direction on both agents, `/healthz` follows the real path, malformed input
//! and refused certificates are counted by origin and reason.

mod support;

use quicsdn_wire::openflow::build::{self, FlowMod, msg_type};
use std::net::SocketAddr;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on an agent's metrics endpoint: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// Scrapes until `series` reaches `value` (within [`PATIENCE`]); the text.
async fn eventually(addr: SocketAddr, series: &str, value: f64) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, text) = get(addr, "/metrics").await;
        if sample(&text, series) >= value {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never reached {value}:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn metrics_count_what_crosses_and_healthz_follows_the_path() {
    let setup = OneService::start("openflow", |c, s| {
        c.common.metrics = Some("127.0.0.1:0".parse().unwrap());
        s.common.metrics = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let sw_http = setup.agent.metrics_addr().unwrap();
    let ctl_http = setup.controller.metrics_addr().unwrap();

    // Connected to the controller agent, but OVS has no session yet.
    let (status, body) = get(sw_http, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("OVS has no session open on: openflow"),
        "{body}"
    );
    // The controller agent has the switch, but not yet its session to the controller.
    let (status, body) = get(ctl_http, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("switches without a session to the controller: sw1"),
        "{body}"
    );

    let (ovs, ctl) = setup.connect().await;
    let hello = build::hello(1);
    let flow_mod = build::flow_mod(7, &FlowMod::add(10, vec![], vec![]));
    let up = vec![
        hello.clone(),
        build::echo_request(2, b"ping"),
        hello.clone(),
    ];
    let down = vec![hello.clone(), flow_mod.clone(), flow_mod.clone()];
    let (mut ovs_r, mut ovs_w) = ovs.into_split();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    send_all(&mut ovs_w, &up).await;
    send_all(&mut ctl_w, &down).await;
    read_exact_len(&mut ctl_r, up.iter().map(Vec::len).sum()).await;
    read_exact_len(&mut ovs_r, down.iter().map(Vec::len).sum()).await;

    let (status, body) = get(sw_http, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(ctl_http, "/healthz").await;
    assert_eq!(status, 200, "{body}");

    let up_bytes = up.iter().map(Vec::len).sum::<usize>() as f64;
    let down_bytes = down.iter().map(Vec::len).sum::<usize>() as f64;
    for addr in [sw_http, ctl_http] {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
        let to_ctl = r#"switch="sw1",service="openflow",direction="to_controller""#;
        let to_sw = r#"switch="sw1",service="openflow",direction="to_switch""#;
        let m = |series: String| sample(&text, &series);
        assert_eq!(
            m(format!("quicsdn_messages_total{{{to_ctl}}}")),
            3.0,
            "{text}"
        );
        assert_eq!(
            m(format!("quicsdn_messages_total{{{to_sw}}}")),
            3.0,
            "{text}"
        );
        assert_eq!(
            m(format!("quicsdn_payload_bytes_total{{{to_ctl}}}")),
            up_bytes
        );
        assert_eq!(
            m(format!("quicsdn_payload_bytes_total{{{to_sw}}}")),
            down_bytes
        );
        let of = |dir: &str, t: &str| {
            m(format!(
                "quicsdn_openflow_messages_total{{{dir},type=\"{t}\"}}"
            ))
        };
        assert_eq!(of(to_ctl, "HELLO"), 2.0, "{text}");
        assert_eq!(of(to_ctl, "ECHO_REQUEST"), 1.0, "{text}");
        assert_eq!(of(to_sw, "FLOW_MOD"), 2.0, "{text}");
        assert_eq!(of(to_sw, "HELLO"), 1.0, "{text}");
        assert_eq!(
            m(r#"quicsdn_sessions{switch="sw1",service="openflow"}"#.into()),
            1.0
        );
        assert_eq!(
            m(r#"quicsdn_connected{switch="sw1"}"#.into()),
            1.0,
            "{text}"
        );
        assert_eq!(
            m(r#"quicsdn_connects_total{switch="sw1",handshake="full"}"#.into()),
            1.0,
            "{text}"
        );
        assert!(
            m(r#"quicsdn_quic_rtt_seconds{switch="sw1"}"#.into()) > 0.0,
            "{text}"
        );
        assert!(m(r#"quicsdn_quic_sent_packets_total{switch="sw1"}"#.into()) > 0.0);
        assert!(
            m(r#"quicsdn_certificate_expiry_timestamp_seconds{certificate="own"}"#.into()) > 1.7e9
        );
        assert!(m("process_resident_memory_bytes".into()) > 0.0, "{text}");
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
    }

    // A malformed message from OVS (OpenFlow length 4) closes its session; the
    // switch agent counts it as its local peer's.
    ovs_w
        .write_all(&[4, msg_type::HELLO, 0, 4, 0, 0, 0, 9])
        .await
        .unwrap();
    assert_eq!(read_to_close(&mut ctl_r).await.unwrap(), b"");
    let mal = |origin: &str| {
        format!(
            "quicsdn_malformed_closes_total{{switch=\"sw1\",service=\"openflow\",origin=\"{origin}\"}}"
        )
    };
    let (_, text) = get(sw_http, "/metrics").await;
    assert_eq!(sample(&text, &mal("local")), 1.0, "{text}");
    assert_eq!(
        sample(
            &text,
            r#"quicsdn_sessions{switch="sw1",service="openflow"}"#
        ),
        0.0
    );

    // A switch whose certificate claims our CA (same name) but was signed by
    // another key is refused, and counted by reason under no switch label.
    let intruder = start_intruder(&setup).await;
    let refused = r#"quicsdn_handshake_refusals_total{reason="bad_certificate"}"#;

    let text = eventually(ctl_http, refused, 1.0).await;
    assert!(
        !text.contains("intruder"),
        "no series for a refused name: {text}"
    );
    intruder.shutdown().await;
    let (status, _) = get(sw_http, "/nothing").await;
    assert_eq!(status, 404);

    // Without its controller agent the switch agent is not ready, whatever OVS does.
    let OneService {
        controller, agent, ..
    } = setup;
    controller.shutdown().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(sw_http, "/healthz").await;
        if status == 503 {
            assert!(
                body.contains("not connected to the controller agent"),
                "{body}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    agent.shutdown().await;
}

/// The coalescer reports each release of held messages; the agent records
/// how long they waited and how many they were (agent-wide histograms).
#[tokio::test]
async fn coalescing_releases_are_recorded_in_the_histograms() {
    let window = std::time::Duration::from_millis(200);
    let setup = OneService::start("openflow", |c, _| c.common.coalesce = Some(window)).await;
    let (mut ovs, mut ctl) = setup.connect().await;
    let flow_mod = |xid| build::flow_mod(xid, &FlowMod::add(10, vec![], vec![]));
    // The first is isolated and leaves at once; the second, well within the
    // window after it, waits: until the reads go quiet (8 of the session's
    // gaps, here about a loopback round trip each) or, on a slow machine,
    // until the 200 ms tick.
    ctl.write_all(&flow_mod(1)).await.unwrap();
    read_exact_len(&mut ovs, flow_mod(1).len()).await;
    ctl.write_all(&flow_mod(2)).await.unwrap();
    read_exact_len(&mut ovs, flow_mod(2).len()).await;
    let text = setup.controller.metrics().encode(true);
    let labels =
        |reason: &str| format!(r#"{{service="openflow",direction="to_switch",reason="{reason}"}}"#);
    let both = |metric: &str| -> f64 {
        ["quiet", "tick"]
            .iter()
            .map(|r| sample(&text, &format!("{metric}{}", labels(r))))
            .sum()
    };
    assert_eq!(both("quicsdn_coalesce_hold_seconds_count"), 1.0, "{text}");
    assert_eq!(both("quicsdn_coalesce_flush_messages_sum"), 1.0);
    let held = both("quicsdn_coalesce_hold_seconds_sum");
    assert!(held > 0.0 && held <= 2.0 * window.as_secs_f64(), "{held}");
    setup.shutdown().await;
}

/// A switch agent whose certificate claims the setup's CA (same name) but was
/// signed by another key: the controller agent refuses its handshakes.
async fn start_intruder(setup: &OneService) -> quicsdn_agent::SwitchAgent {
    let stranger = Pki::new();
    let mut tls = stranger.issue("intruder");
    tls.ca = setup.pki.files("ctl").ca;
    let mut cfg = switch_config(
        tls,
        setup.controller.local_addr().unwrap(),
        &["openflow=ptcp:0".to_string()],
    );
    cfg.controllers[0].server_name = "ctl".into();
    quicsdn_agent::SwitchAgent::start(cfg).await.unwrap()
}

/// Metric names in the Grafana dashboard (`docs/grafana/quicsdn.json`): every
/// `quicsdn_…` and `process_…` identifier in its queries and texts.
fn dashboard_metric_names() -> std::collections::BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/quicsdn.json"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fn strings<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
        match v {
            serde_json::Value::String(s) => out.push(s),
            serde_json::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            serde_json::Value::Object(o) => o.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut texts = Vec::new();
    strings(&json, &mut texts);
    texts
        .iter()
        .flat_map(|t| t.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')))
        .filter(|w| w.starts_with("quicsdn_") || w.starts_with("process_"))
        .map(str::to_string)
        .collect()
}

/// The sample names a scrape can hold, from its `# TYPE` lines (a family
/// that has no series yet still declares itself) and its samples, with the
/// suffixes OpenMetrics gives each type.
fn served_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (family, kind) = t.split_once(' ').unwrap();
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The dashboard cannot rot: every metric it queries is served by a real
/// agent (the switch agent's or the controller agent's scrape, over HTTP),
/// after a workload that gives each family a series: traffic, a coalesced
/// release, a certificate reload, a refused handshake and a disconnect.
#[tokio::test(flavor = "current_thread")]
async fn every_metric_the_grafana_dashboard_uses_is_served() {
    let setup = OneService::start("openflow", |c, s| {
        c.common.metrics = Some("127.0.0.1:0".parse().unwrap());
        c.common.coalesce = Some(std::time::Duration::from_millis(200));
        s.common.metrics = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let (sw_http, ctl_http) = (
        setup.agent.metrics_addr().unwrap(),
        setup.controller.metrics_addr().unwrap(),
    );
    let (mut ovs, mut ctl) = setup.connect().await;
    ovs.write_all(&build::hello(1)).await.unwrap();
    read_exact_len(&mut ctl, build::hello(1).len()).await;
    // Two flow mods within the coalescing window: the second waits.
    let flow_mod = |xid| build::flow_mod(xid, &FlowMod::add(10, vec![], vec![]));
    for xid in [1, 2] {
        ctl.write_all(&flow_mod(xid)).await.unwrap();
        read_exact_len(&mut ovs, flow_mod(xid).len()).await;
    }
    assert!(setup.agent.reload_credentials().await.is_some());
    // A stranger's handshake, refused.
    let intruder = start_intruder(&setup).await;
    eventually(
        ctl_http,
        r#"quicsdn_handshake_refusals_total{reason="bad_certificate"}"#,
        1.0,
    )
    .await;
    intruder.shutdown().await;
    let mut served = std::collections::BTreeSet::new();
    let (status, text) = get(sw_http, "/metrics").await;
    assert_eq!(status, 200);
    served.extend(served_names(&text));
    // The switch agent goes: the controller agent counts a disconnect.
    setup.agent.shutdown().await;
    let text = eventually(
        ctl_http,
        r#"quicsdn_disconnects_total{switch="sw1",reason="closed_by_peer"}"#,
        1.0,
    )
    .await;
    served.extend(served_names(&text));
    let used = dashboard_metric_names();
    assert!(
        used.len() >= 15,
        "the dashboard's names were not found: {used:?}"
    );
    let missing: Vec<_> = used.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "docs/grafana/quicsdn.json uses metrics no agent serves: {missing:?}\nserved: {served:?}"
    );
    setup.controller.shutdown().await;
}

/// Over a path that loses datagrams, QUIC's loss counters move (per switch),
/// and every message still arrives in order.
#[tokio::test]
async fn lost_packets_are_counted_per_switch_and_every_message_arrives() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let controller = quicsdn_agent::ControllerAgent::start(controller_config(
        &pki,
        &[format!("openflow={}", fake.target())],
    ))
    .await
    .unwrap();
    let relay = Relay::lossy(controller.local_addr().unwrap(), 12, 4).await;
    let agent = quicsdn_agent::SwitchAgent::start(switch_config(
        pki.issue("sw1"),
        relay.addr,
        &["openflow=ptcp:0".to_string()],
    ))
    .await
    .unwrap();
    assert!(agent.wait_connected(PATIENCE).await);
    let mut ovs = ovs_connect(&agent, "openflow").await;
    let mut ctl = fake.accept().await;
    // Rounds the switch side reads before the next is sent: many packets,
    // whatever the coalescing does.
    for round in 0..40u32 {
        let msgs: Vec<Vec<u8>> = (0..5)
            .map(|i| build::flow_mod(round * 5 + i, &FlowMod::add(10, vec![], vec![])))
            .collect();
        send_all(&mut ctl, &msgs).await;
        let got = read_exact_len(&mut ovs, msgs.iter().map(Vec::len).sum()).await;
        assert_eq!(got, msgs.concat(), "round {round}");
    }
    let text = controller.metrics().encode(true);
    let lost = sample(&text, r#"quicsdn_quic_lost_packets_total{switch="sw1"}"#);
    let sent = sample(&text, r#"quicsdn_quic_sent_packets_total{switch="sw1"}"#);
    assert!(lost >= 1.0 && lost < sent, "lost {lost} of {sent}:\n{text}");
    assert!(sample(&text, r#"quicsdn_quic_lost_bytes_total{switch="sw1"}"#) > 0.0);
    agent.shutdown().await;
    controller.shutdown().await;
}
