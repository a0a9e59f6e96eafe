//! The agents' Prometheus metrics inside a lab.
//!
//! `up` starts every QUIC agent with `--metrics` on its own namespace's
//! loopback ([`SWITCH_METRICS_PORT`], [`CONTROLLER_METRICS_PORT`]), so the endpoint is reachable by the lab (and
//! by anyone who enters the namespace) but by no host and not over the
//! emulated links. The ports are those of the sample configurations
//! (`packaging/etc/`), whose counters would otherwise include the scrapes. Each
//! endpoint is recorded in the lab's state ([`MetricsEndpoint`]); `status`
//! enters the namespace on a short-lived thread, fetches `/metrics` and
//! `/healthz`, and reduces the samples to what an operator asks first
//! ([`SwitchAgentView`], [`ControllerAgentView`]). A scrape that fails says
//! which agent and why; it never fails `status`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

/// The TCP port of a switch agent's `/metrics` on its namespace's loopback.
pub const SWITCH_METRICS_PORT: u16 = 9653;
/// The same for the controller agent.
pub const CONTROLLER_METRICS_PORT: u16 = 9654;

/// How long one scrape may take before `status` reports it failed.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// Where one agent serves its metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsEndpoint {
    /// `controller agent`, or the switch (`sw1`, …) whose agent it is.
    pub agent: String,
    pub netns: String,
    pub addr: SocketAddr,
}

impl MetricsEndpoint {
    pub fn url(&self) -> String {
        format!("http://{}/metrics (in namespace {})", self.addr, self.netns)
    }
}

/// The `--metrics` an agent gets: the one among the user's extra agent options
/// (`--agent-arg=--metrics=…`) if any, else `127.0.0.1:port`. Returns the
/// option to add (none when the user gave one) and the address to scrape.
pub fn metrics_option(extra: &[String], port: u16) -> Result<(Option<String>, SocketAddr)> {
    let mut it = extra.iter();
    while let Some(a) = it.next() {
        let value = if let Some(v) = a.strip_prefix("--metrics=") {
            v.to_string()
        } else if a == "--metrics" {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("--metrics needs IP:PORT"))?
        } else {
            continue;
        };
        let mut addr: SocketAddr = value
            .parse()
            .map_err(|_| anyhow!("--metrics {value:?} is not IP:PORT"))?;
        if addr.port() == 0 {
            bail!("--metrics {value}: the lab scrapes the agents, give it a fixed port");
        }
        // Bound to every address: the lab scrapes it on loopback.
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        return Ok((None, addr));
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    Ok((Some(format!("--metrics={addr}")), addr))
}

/// `GET path` from `addr` inside namespace `netns` (HTTP/1.0, one request per
/// connection): the status code and body.
pub fn http_get(netns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let (netns, path) = (netns.to_string(), path.to_string());
    // setns(2) moves only the calling thread: a thread of its own, so the
    // caller stays where it is.
    std::thread::spawn(move || -> Result<(u16, String)> {
        crate::emulator::sys::enter_netns(&netns)
            .with_context(|| format!("cannot enter namespace {netns}"))?;
        let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)?;
        s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
        s.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let raw = String::from_utf8(raw).context("the reply is not UTF-8")?;
        let (head, body) = raw
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("not an HTTP reply: {:?}", truncate(&raw)))?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("bad HTTP status line: {:?}", truncate(head)))?;
        Ok((code, body.to_string()))
    })
    .join()
    .map_err(|_| anyhow!("the scrape thread panicked"))?
}

/// The first 120 characters of `s`, for error messages.
fn truncate(s: &str) -> &str {
    s.char_indices().nth(120).map_or(s, |(i, _)| &s[..i])
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn has(&self, key: &str, value: &str) -> bool {
        self.labels.get(key).is_some_and(|v| v == value)
    }
}

/// Parses the Prometheus text exposition format 0.0.4 (what the agents serve
/// without an OpenMetrics `Accept`): `name{label="value",…} value [timestamp]`
/// per line, `#` lines skipped. The e2e tests check the same endpoint with
/// the reference parsers; this one only has to read it back.
pub fn parse_text(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).with_context(|| format!("line {}: {line:?}", n + 1))?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or_else(|| anyhow!("no value"))?;
    let name = &line[..name_end];
    if name.is_empty() {
        bail!("no metric name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        loop {
            let Some((i, c)) = chars.next() else {
                bail!("unterminated labels")
            };
            match c {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next().map(|(_, c)| c) != Some('"') {
                        bail!("label {key} has no quoted value");
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next().map(|(_, c)| c) {
                            Some('"') => break,
                            Some('\\') => match chars.next().map(|(_, c)| c) {
                                Some('n') => value.push('\n'),
                                Some(c) => value.push(c),
                                None => bail!("unterminated label value"),
                            },
                            Some(c) => value.push(c),
                            None => bail!("unterminated label value"),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        }
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("no value"))?;
    let value: f64 = value.parse().map_err(|_| anyhow!("bad value {value:?}"))?;
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The samples of one scrape, with the lookups `status` needs.
struct Samples(Vec<Sample>);

impl Samples {
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0
            .iter()
            .filter(move |s| s.name == name && labels.iter().all(|(k, v)| s.has(k, v)))
    }

    fn one(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Values of `name` by the value of label `by`.
    fn by(&self, name: &str, labels: &[(&str, &str)], by: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for s in self.matching(name, labels) {
            if let Some(k) = s.labels.get(by) {
                *m.entry(k.clone()).or_insert(0) += s.value as u64;
            }
        }
        m
    }
}

/// Messages and payload bytes one way, summed over the services.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
    /// OpenFlow messages by type (`PACKET_IN`, `FLOW_MOD`, …).
    pub openflow: BTreeMap<String, u64>,
}

/// What a switch agent's metrics say about its switch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchAgentView {
    /// `/healthz`: connected to the controller agent and OVS to this agent.
    pub ready: bool,
    /// `/healthz`'s reason.
    pub health: String,
    /// QUIC connection to the controller agent up (`quicsdn_connected`).
    pub connected_to_peer: bool,
    /// OVS's sessions open on this agent, by service (the local side).
    pub local_sessions: BTreeMap<String, u64>,
    /// Since the current connection came up (OVS's `sec_since_connect`).
    pub seconds_since_connect: Option<f64>,
    pub connects: u64,
    /// Connections after the first one.
    pub reconnects: u64,
    /// Disconnects by reason.
    pub disconnects: BTreeMap<String, u64>,
    pub migrations: u64,
    pub to_controller: Traffic,
    pub to_switch: Traffic,
    pub rtt_seconds: Option<f64>,
    pub congestion_window_bytes: Option<u64>,
    pub sent_packets: u64,
    pub lost_packets: u64,
    /// The switch agent's own certificate, Unix time.
    pub certificate_expiry_timestamp_seconds: Option<f64>,
    /// The controller agent's certificate as last presented, Unix time.
    pub peer_certificate_expiry_timestamp_seconds: Option<f64>,
}

/// What the controller agent's metrics say, over all switches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControllerAgentView {
    pub ready: bool,
    pub health: String,
    /// Switches with a live connection.
    pub switches_connected: u64,
    /// Handshakes refused, by reason.
    pub handshake_refusals: BTreeMap<String, u64>,
    pub certificate_expiry_timestamp_seconds: Option<f64>,
}

/// One agent's scrape in `status`: the view, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scraped<T> {
    pub endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Fetches `/metrics` and `/healthz`: the samples, readiness and its reason.
fn fetch(ep: &MetricsEndpoint) -> Result<(Samples, bool, String)> {
    let (code, body) = http_get(&ep.netns, ep.addr, "/metrics")?;
    if code != 200 {
        bail!("/metrics answered HTTP {code}: {}", truncate(body.trim()));
    }
    let samples = Samples(parse_text(&body).context("cannot parse /metrics")?);
    let (code, body) = http_get(&ep.netns, ep.addr, "/healthz")?;
    let health: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("/healthz is not JSON: {body:?}"))?;
    let reason = health["reason"].as_str().unwrap_or("").to_string();
    Ok((samples, code == 200, reason))
}

fn scraped<T>(
    ep: &MetricsEndpoint,
    view: impl FnOnce(&MetricsEndpoint) -> Result<T>,
) -> Scraped<T> {
    let (metrics, error) = match view(ep) {
        Ok(v) => (Some(v), None),
        Err(e) => (
            None,
            Some(format!(
                "scraping the {} at {}: {e:#}",
                agent_label(ep),
                ep.url()
            )),
        ),
    };
    Scraped {
        endpoint: ep.url(),
        metrics,
        error,
    }
}

fn agent_label(ep: &MetricsEndpoint) -> String {
    if ep.agent.starts_with("controller") {
        ep.agent.clone()
    } else {
        format!("switch agent of {}", ep.agent)
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Scrapes the switch agent of `switch` (its certificate identity).
pub fn scrape_switch(ep: &MetricsEndpoint, switch: &str) -> Scraped<SwitchAgentView> {
    scraped(ep, |ep| {
        let (s, ready, health) = fetch(ep)?;
        Ok(switch_view(&s, switch, ready, health, unix_now()))
    })
}

fn switch_view(
    s: &Samples,
    switch: &str,
    ready: bool,
    health: String,
    now: f64,
) -> SwitchAgentView {
    let sw = ("switch", switch);
    let traffic = |direction: &str| {
        let d = ("direction", direction);
        Traffic {
            messages: s.sum("quicsdn_messages_total", &[sw, d]) as u64,
            bytes: s.sum("quicsdn_payload_bytes_total", &[sw, d]) as u64,
            openflow: s.by("quicsdn_openflow_messages_total", &[sw, d], "type"),
        }
    };
    let connected = s.one("quicsdn_connected", &[sw]) == Some(1.0);
    let connects = s.sum("quicsdn_connects_total", &[sw]) as u64;
    SwitchAgentView {
        ready,
        health,
        connected_to_peer: connected,
        local_sessions: s.by("quicsdn_sessions", &[sw], "service"),
        seconds_since_connect: s
            .one("quicsdn_connection_start_time_seconds", &[sw])
            .filter(|_| connected)
            .map(|t| (now - t).max(0.0)),
        connects,
        reconnects: connects.saturating_sub(1),
        disconnects: s.by("quicsdn_disconnects_total", &[sw], "reason"),
        migrations: s.sum("quicsdn_migrations_total", &[sw]) as u64,
        to_controller: traffic("to_controller"),
        to_switch: traffic("to_switch"),
        rtt_seconds: s.one("quicsdn_quic_rtt_seconds", &[sw]),
        congestion_window_bytes: s
            .one("quicsdn_quic_congestion_window_bytes", &[sw])
            .map(|v| v as u64),
        sent_packets: s.sum("quicsdn_quic_sent_packets_total", &[sw]) as u64,
        lost_packets: s.sum("quicsdn_quic_lost_packets_total", &[sw]) as u64,
        certificate_expiry_timestamp_seconds: s.one(
            "quicsdn_certificate_expiry_timestamp_seconds",
            &[("certificate", "own")],
        ),
        peer_certificate_expiry_timestamp_seconds: s
            .one("quicsdn_peer_certificate_expiry_timestamp_seconds", &[sw]),
    }
}

/// Scrapes the controller agent.
pub fn scrape_controller(ep: &MetricsEndpoint) -> Scraped<ControllerAgentView> {
    scraped(ep, |ep| {
        let (s, ready, health) = fetch(ep)?;
        Ok(ControllerAgentView {
            ready,
            health,
            switches_connected: s.sum("quicsdn_connected", &[]) as u64,
            handshake_refusals: s.by("quicsdn_handshake_refusals_total", &[], "reason"),
            certificate_expiry_timestamp_seconds: s.one(
                "quicsdn_certificate_expiry_timestamp_seconds",
                &[("certificate", "own")],
            ),
        })
    })
}

fn days_left(expiry: Option<f64>) -> String {
    match expiry {
        Some(t) => format!("{:.0} d", (t - unix_now()) / 86_400.0),
        None => "-".into(),
    }
}

impl Scraped<SwitchAgentView> {
    /// `status`'s lines for one switch agent (indented under its switch).
    pub fn render(&self) -> String {
        let Some(v) = &self.metrics else {
            return format!(
                "         agent metrics UNAVAILABLE: {}\n",
                self.error.as_deref().unwrap_or("?")
            );
        };
        let yes = |b: bool| if b { "yes" } else { "NO" };
        let local = if v.local_sessions.is_empty() {
            "none".to_string()
        } else {
            v.local_sessions
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut o = format!(
            "         agent: peer connected {}, OVS sessions {local}, ready {} ({}), up {}, reconnects {}, migrations {}\n",
            yes(v.connected_to_peer),
            yes(v.ready),
            v.health,
            v.seconds_since_connect
                .map_or("-".into(), |s| format!("{s:.0} s")),
            v.reconnects,
            v.migrations,
        );
        for (name, t) in [("sw->ctl", &v.to_controller), ("ctl->sw", &v.to_switch)] {
            o += &format!(
                "         {name} {} messages {} B{}\n",
                t.messages,
                t.bytes,
                if t.openflow.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (OpenFlow: {})",
                        t.openflow
                            .iter()
                            .map(|(k, n)| format!("{k} {n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
        }
        o += &format!(
            "         QUIC rtt {}, cwnd {}, lost {} of {} packets; certificate expires in {} (controller agent's: {})\n",
            v.rtt_seconds
                .map_or("-".into(), |r| format!("{:.1} ms", r * 1e3)),
            v.congestion_window_bytes
                .map_or("-".into(), |c| format!("{c} B")),
            v.lost_packets,
            v.sent_packets,
            days_left(v.certificate_expiry_timestamp_seconds),
            days_left(v.peer_certificate_expiry_timestamp_seconds),
        );
        o
    }
}

impl Scraped<ControllerAgentView> {
    /// `status`'s line for the controller agent.
    pub fn render(&self) -> String {
        match &self.metrics {
            None => format!(
                "  metrics UNAVAILABLE: {}\n",
                self.error.as_deref().unwrap_or("?")
            ),
            Some(v) => format!(
                "  metrics {}: {} switch(es) connected, ready {} ({}), handshake refusals {:?}, certificate expires in {}\n",
                self.endpoint,
                v.switches_connected,
                if v.ready { "yes" } else { "NO" },
                v.health,
                v.handshake_refusals,
                days_left(v.certificate_expiry_timestamp_seconds),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_with_escapes_and_timestamps() {
        let text = "# HELP x help\n# TYPE x counter\n\
            quicsdn_x_total{switch=\"sw1\",reason=\"a \\\"b\\\", c\\\\d\\n\"} 3 1700000000000\n\
            quicsdn_rtt_seconds{switch=\"sw1\"} 0.012\n\
            process_open_fds 9\n\
            h_bucket{le=\"+Inf\"} +Inf\n";
        let s = parse_text(text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "quicsdn_x_total");
        assert_eq!(s[0].labels["reason"], "a \"b\", c\\d\n");
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].value, 0.012);
        assert!(s[2].labels.is_empty() && s[2].value == 9.0);
        assert!(s[3].value.is_infinite());
        for bad in [
            "x{a=\"1\" 2",
            "x{a=1} 2",
            "x",
            "x{a=\"1\"} y",
            "{a=\"1\"} 2",
        ] {
            assert!(parse_text(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_switch_view_from_samples() {
        let text = r#"
quicsdn_connected{switch="sw1"} 1
quicsdn_connection_start_time_seconds{switch="sw1"} 1000
quicsdn_connects_total{switch="sw1"} 3
quicsdn_disconnects_total{switch="sw1",reason="timed_out"} 2
quicsdn_sessions{switch="sw1",service="openflow"} 1
quicsdn_messages_total{switch="sw1",service="openflow",direction="to_controller"} 10
quicsdn_messages_total{switch="sw1",service="ovsdb",direction="to_controller"} 5
quicsdn_payload_bytes_total{switch="sw1",service="openflow",direction="to_controller"} 800
quicsdn_openflow_messages_total{switch="sw1",service="openflow",direction="to_controller",type="PACKET_IN"} 4
quicsdn_messages_total{switch="sw1",service="openflow",direction="to_switch"} 7
quicsdn_quic_rtt_seconds{switch="sw1"} 0.02
quicsdn_quic_congestion_window_bytes{switch="sw1"} 14720
quicsdn_quic_lost_packets_total{switch="sw1"} 2
quicsdn_certificate_expiry_timestamp_seconds{certificate="own"} 2000000000
"#;
        let s = Samples(parse_text(text).unwrap());
        let v = switch_view(&s, "sw1", true, "ok".into(), 1010.0);
        assert!(v.connected_to_peer && v.ready);
        assert_eq!(v.seconds_since_connect, Some(10.0));
        assert_eq!((v.connects, v.reconnects), (3, 2));
        assert_eq!(v.disconnects["timed_out"], 2);
        assert_eq!(v.local_sessions["openflow"], 1);
        assert_eq!((v.to_controller.messages, v.to_controller.bytes), (15, 800));
        assert_eq!(v.to_controller.openflow["PACKET_IN"], 4);
        assert_eq!(v.to_switch.messages, 7);
        assert_eq!(v.congestion_window_bytes, Some(14720));
        assert_eq!(v.lost_packets, 2);
        assert_eq!(v.certificate_expiry_timestamp_seconds, Some(2e9));
        // Another switch's name finds nothing of this one.
        let other = switch_view(&s, "sw2", false, String::new(), 1010.0);
        assert!(!other.connected_to_peer && other.to_controller.messages == 0);
        assert_eq!(other.seconds_since_connect, None);
    }

    #[test]
    fn the_metrics_option() {
        let (add, addr) = metrics_option(&[], SWITCH_METRICS_PORT).unwrap();
        assert_eq!(add.as_deref(), Some("--metrics=127.0.0.1:9653"));
        assert_eq!(addr.port(), SWITCH_METRICS_PORT);
        let user = [
            "--streams=ordered".to_string(),
            "--metrics=0.0.0.0:9000".into(),
        ];
        let (add, addr) = metrics_option(&user, 1).unwrap();
        assert!(add.is_none());
        assert_eq!(addr.to_string(), "127.0.0.1:9000");
        let user = ["--metrics".to_string(), "10.0.0.1:9001".into()];
        assert_eq!(
            metrics_option(&user, 1).unwrap().1.to_string(),
            "10.0.0.1:9001"
        );
        assert!(metrics_option(&["--metrics=127.0.0.1:0".into()], 1).is_err());
        assert!(metrics_option(&["--metrics=nope".into()], 1).is_err());
    }

    #[test]
    fn a_failed_scrape_names_the_agent_and_why() {
        let ep = MetricsEndpoint {
            agent: "sw3".into(),
            netns: "qsdnNoSuchNs-sw3".into(),
            addr: "127.0.0.1:9653".parse().unwrap(),
        };
        let s = scrape_switch(&ep, "sw3");
        let e = s.error.clone().unwrap();
        assert!(
            e.contains("switch agent of sw3") && e.contains("qsdnNoSuchNs-sw3"),
            "{e}"
        );
        assert!(s.render().contains("UNAVAILABLE"));
    }
}
