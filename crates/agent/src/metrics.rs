//! The agents' metrics, in the Prometheus / OpenMetrics text format
//! (`prometheus-client`), served by [`crate::http`] on `--metrics IP:PORT`.
//!
//! Names follow Prometheus' conventions: a `quicsdn_` prefix, base units in the
//! name (`_seconds`, `_bytes`), `_total` on counters, and counters that never go
//! back: the QUIC statistics of a switch's closed connections are added to its
//! live connection's, so a reconnect does not reset them.
//!
//! **Cardinality.** Labels take only bounded values:
//! * `switch`: the certificate identity of a switch that completed a mutually
//!   authenticated handshake, so only switches the CA certified appear (one
//!   per switch, as Faucet's `dp_id`); nothing a stranger sends creates a
//!   series. Handshake refusals, whose claimed identity is not trusted, carry
//!   only a `reason`.
//! * `service`: the configured services (a handful).
//! * `direction`: `to_controller` or `to_switch`.
//! * `type`: an OpenFlow message type name (36 names and `UNKNOWN`, see
//!   [`quicsdn_wire::openflow::Kind`]), only those a switch actually used.
//! * `reason`, `result`, `origin`, `handshake`, `certificate`: fixed sets, below.
//! * The coalescing histograms carry no `switch`: `service`, `direction` and
//!   `reason` only, so their series do not grow with the switches.
//! * `serial` (with `identity` or `switch`): the certificate in use, one
//!   series per agent or switch at a time; a rotation replaces it.
//!
//! With S switches, V services and T message types in use, an agent exports
//! about S × (20 + V × (7 + 2T)) series: for 1,000 switches with OpenFlow
//! only and 15 types in use, about 57,000, the order Faucet's per-datapath
//! metrics reach too. A switch's series stay after it disconnects (its
//! `quicsdn_connected` drops to 0) until the agent restarts, so the count is
//! bounded by the switches the CA certified, not by reconnects.

use crate::Shutdown;
use crate::link::Link;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use quicsdn_lanes::marker;
use quicsdn_lanes::rules::Direction;
use quicsdn_lanes::{Flush, FlushReason};
use quicsdn_transport::tls::{CertRejection, Credentials, RejectionHook};
use quicsdn_wire::openflow::{HEADER_LEN, Header};
use quicsdn_wire::{Framer, Framing};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Why a connection between the agents ended (`reason` of
/// `quicsdn_disconnects_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // The label values, as Prometheus shows them.
pub enum DisconnectReason {
    /// No packet from the peer within the grace period.
    timed_out,
    /// The peer closed it (e.g. it shut down).
    closed_by_peer,
    /// A stateless reset: the peer restarted and lost the connection's state.
    reset_by_peer,
    /// A newer connection of the same switch replaced it.
    superseded,
    /// This agent closed it (shutdown, a rejected 0-RTT reconnecting).
    closed_here,
    /// Refused by the controller agent's admission control.
    refused,
    /// A QUIC or TLS protocol error.
    protocol_error,
}

impl DisconnectReason {
    /// Classifies quinn's reason. `SUPERSEDED` is this project's application code.
    pub fn of(e: &quinn::ConnectionError) -> DisconnectReason {
        use quinn::ConnectionError as E;
        use quinn::TransportErrorCode as T;
        match e {
            E::TimedOut => DisconnectReason::timed_out,
            E::Reset => DisconnectReason::reset_by_peer,
            E::LocallyClosed => DisconnectReason::closed_here,
            E::ApplicationClosed(c)
                if c.error_code
                    == quinn::VarInt::from_u32(quicsdn_wire::preamble::code::SUPERSEDED) =>
            {
                DisconnectReason::superseded
            }
            E::ApplicationClosed(_) => DisconnectReason::closed_by_peer,
            E::ConnectionClosed(c) if c.error_code == T::CONNECTION_REFUSED => {
                DisconnectReason::refused
            }
            E::ConnectionClosed(c) if c.error_code == T::NO_ERROR => {
                DisconnectReason::closed_by_peer
            }
            _ => DisconnectReason::protocol_error,
        }
    }
}

/// Why a handshake was refused (`reason` of `quicsdn_handshake_refusals_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RefusalReason {
    /// The certificate does not chain to the CA.
    unknown_issuer,
    /// The certificate has expired or is not valid yet.
    expired,
    /// The controller agent's certificate does not carry `--server-name`.
    wrong_name,
    /// No certificate was presented.
    no_certificate,
    /// Another certificate problem (signature, usage, revocation).
    bad_certificate,
    /// Admission control (`--max-handshakes`) refused the attempt.
    admission,
    /// The handshake did not complete in time.
    timed_out,
    /// Anything else (protocol errors, no common ALPN or version).
    other,
}

impl From<CertRejection> for RefusalReason {
    fn from(r: CertRejection) -> RefusalReason {
        match r {
            CertRejection::UnknownIssuer => RefusalReason::unknown_issuer,
            CertRejection::Expired => RefusalReason::expired,
            CertRejection::WrongName => RefusalReason::wrong_name,
            CertRejection::NoCertificate => RefusalReason::no_certificate,
            CertRejection::Other => RefusalReason::bad_certificate,
        }
    }
}

impl RefusalReason {
    /// How a handshake failed, as this side saw it; `None` when this side's own
    /// certificate verifier refused (it counted the refusal already).
    pub fn of_failed_handshake(e: &quinn::ConnectionError) -> Option<RefusalReason> {
        use quinn::ConnectionError as E;
        let alert = |code: u64| {
            // RFC 9001 §4.8: a TLS alert travels as CRYPTO_ERROR 0x0100 + alert.
            (0x100..0x200).contains(&code).then(|| (code - 0x100) as u8)
        };
        Some(match e {
            E::TimedOut => RefusalReason::timed_out,
            E::ConnectionClosed(c)
                if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
            {
                RefusalReason::admission
            }
            // The peer's verifier refused our certificate: its alert says why
            // (RFC 8446 §6.2).
            E::ConnectionClosed(c) => match alert(u64::from(c.error_code)) {
                Some(48) => RefusalReason::unknown_issuer,
                Some(45) => RefusalReason::expired,
                Some(116) => RefusalReason::no_certificate,
                Some(42..=46) => RefusalReason::bad_certificate,
                _ => RefusalReason::other,
            },
            // Our own verifier's refusal ends the handshake with a local crypto error.
            E::TransportError(t) if alert(u64::from(t.code)).is_some() => return None,
            _ => RefusalReason::other,
        })
    }
}

/// A switch's or service's name in a label set. Shared, not copied: every
/// series of a switch names it, and the copies were 1.7 of the 4.8 KiB a
/// controller agent's metrics kept per switch with one OpenFlow session
/// (counted in glibc's chunks; docs/scale.md, issue 18).
type Name = Arc<str>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwitchLabels {
    switch: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum HandshakeKind {
    full,
    zero_rtt,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectLabels {
    switch: Name,
    handshake: HandshakeKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisconnectLabels {
    switch: Name,
    reason: DisconnectReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum ZeroRttResult {
    accepted,
    rejected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZeroRttLabels {
    switch: Name,
    result: ZeroRttResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    switch: Name,
    service: Name,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Way {
    to_controller,
    to_switch,
}

impl From<Direction> for Way {
    fn from(d: Direction) -> Way {
        match d {
            Direction::ToController => Way::to_controller,
            Direction::ToSwitch => Way::to_switch,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLabels {
    switch: Name,
    service: Name,
    direction: Way,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    switch: Name,
    service: Name,
    direction: Way,
    r#type: &'static str,
}

/// Who sent a malformed message (`origin` of `quicsdn_malformed_closes_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Origin {
    /// This agent's local peer (OVS, or the controller).
    local,
    /// The other agent's local peer, as that agent reported it.
    remote,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MalformedLabels {
    switch: Name,
    service: Name,
    origin: Origin,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: RefusalReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Which {
    own,
    ca,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabels {
    certificate: Which,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertInfoLabels {
    identity: String,
    serial: String,
}

/// Why held messages left (`reason` of the coalescing histograms).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum FlushLabel {
    urgent,
    bytes,
    tick,
    quiet,
}

impl From<FlushReason> for FlushLabel {
    fn from(r: FlushReason) -> FlushLabel {
        match r {
            FlushReason::Urgent => FlushLabel::urgent,
            FlushReason::Bytes => FlushLabel::bytes,
            FlushReason::Tick => FlushLabel::tick,
            FlushReason::Quiet => FlushLabel::quiet,
        }
    }
}

/// Agent-wide, not per switch: a histogram per switch would multiply its
/// buckets by the switches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CoalesceLabels {
    service: Name,
    direction: Way,
    reason: FlushLabel,
}

type Histograms = Family<CoalesceLabels, Histogram, fn() -> Histogram>;

fn hold_histogram() -> Histogram {
    // Around the default 10 ms window: a message waits at most one window.
    Histogram::new([0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1])
}

fn flush_size_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0])
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerCertLabels {
    switch: Name,
    serial: String,
}

/// An agent's metrics. Always kept (the counters cost an atomic add each);
/// served only with `--metrics`.
pub struct Metrics {
    registry: Registry,
    connects: Family<ConnectLabels, Counter>,
    disconnects: Family<DisconnectLabels, Counter>,
    zero_rtt: Family<ZeroRttLabels, Counter>,
    sessions: Family<ServiceLabels, Gauge>,
    sessions_opened: Family<ServiceLabels, Counter>,
    messages: Family<FlowLabels, Counter>,
    bytes: Family<FlowLabels, Counter>,
    openflow: Family<TypeLabels, Counter>,
    malformed: Family<MalformedLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    cert_expiry: Family<CertLabels, Gauge>,
    cert_info: Family<CertInfoLabels, Gauge>,
    cert_reloads: Family<ReloadLabels, Counter>,
    peer_cert: Family<PeerCertLabels, Gauge>,
    peer_cert_expiry: Family<SwitchLabels, Gauge>,
    coalesce_hold: Histograms,
    coalesce_messages: Histograms,
    /// The serial in `peer_cert` per switch, so a new one replaces it (one
    /// series per switch).
    peer_serials: Mutex<HashMap<Name, String>>,
    links: Arc<Links>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum ReloadResult {
    success,
    failure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// `role`: `switch` or `controller`.
    pub fn new(role: &'static str) -> Arc<Metrics> {
        let mut root = Registry::default();
        // The standard process_* names carry no prefix.
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("quicsdn");
        let m = Metrics {
            connects: Family::default(),
            disconnects: Family::default(),
            zero_rtt: Family::default(),
            sessions: Family::default(),
            sessions_opened: Family::default(),
            messages: Family::default(),
            bytes: Family::default(),
            openflow: Family::default(),
            malformed: Family::default(),
            refusals: Family::default(),
            cert_expiry: Family::default(),
            cert_info: Family::default(),
            cert_reloads: Family::default(),
            peer_cert: Family::default(),
            peer_cert_expiry: Family::default(),
            peer_serials: Mutex::default(),
            coalesce_hold: Family::new_with_constructor(hold_histogram),
            coalesce_messages: Family::new_with_constructor(flush_size_histogram),
            links: Arc::default(),
            registry: Registry::default(),
        };
        registry.register(
            "build",
            "The agent's version and role",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION")), ("role", role)]),
        );
        registry.register(
            "connects",
            "Connections between the agents that came up, by handshake (full or zero_rtt)",
            m.connects.clone(),
        );
        registry.register(
            "disconnects",
            "Connections between the agents that ended, by reason",
            m.disconnects.clone(),
        );
        registry.register(
            "zero_rtt",
            "Resumptions in 0-RTT, by whether the controller agent accepted the early data (the controller agent counts only those it accepted)",
            m.zero_rtt.clone(),
        );
        registry.register(
            "sessions",
            "Sessions (local connections carried) open now",
            m.sessions.clone(),
        );
        registry.register(
            "sessions_opened",
            "Sessions opened",
            m.sessions_opened.clone(),
        );
        registry.register(
            "messages",
            "Messages carried (OpenFlow and JSON-RPC; none for raw services)",
            m.messages.clone(),
        );
        registry.register_with_unit(
            "payload",
            "Bytes of the local peers' messages carried (without QUIC overhead)",
            Unit::Bytes,
            m.bytes.clone(),
        );
        registry.register(
            "openflow_messages",
            "OpenFlow messages carried, by type (OFPT_ name without the prefix)",
            m.openflow.clone(),
        );
        registry.register(
            "malformed_closes",
            "Sessions closed because a local peer sent a malformed message, by whose peer it was",
            m.malformed.clone(),
        );
        registry.register(
            "handshake_refusals",
            "Connection attempts refused during the handshake, by reason",
            m.refusals.clone(),
        );
        registry.register_with_unit(
            "certificate_expiry_timestamp",
            "When this agent's certificate (own) and its CA certificate (ca) expire, Unix time",
            Unit::Seconds,
            m.cert_expiry.clone(),
        );
        registry.register(
            "certificate",
            "The certificate this agent presents to new handshakes (always 1)",
            m.cert_info.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Reads of the CA, certificate and key files after SIGHUP or a change on disk, by result (failure: refused, the certificate in use kept)",
            m.cert_reloads.clone(),
        );
        registry.register(
            "peer_certificate",
            "The certificate the other agent presented on the switch's current connection, by serial (always 1): the switch's on the controller agent, the controller agent's on the switch agent",
            m.peer_cert.clone(),
        );
        registry.register_with_unit(
            "peer_certificate_expiry_timestamp",
            "When the certificate the other agent presented on the switch's current connection expires, Unix time",
            Unit::Seconds,
            m.peer_cert_expiry.clone(),
        );
        registry.register_with_unit(
            "coalesce_hold",
            "How long held messages waited (the oldest of each release) before leaving, by why they left: an urgent message took them along, the byte limit, or the tick (--coalesce)",
            Unit::Seconds,
            m.coalesce_hold.clone(),
        );
        registry.register(
            "coalesce_flush_messages",
            "Messages per release of held messages, by why they left",
            m.coalesce_messages.clone(),
        );
        registry.register_collector(Box::new(LinkCollector(m.links.clone())));
        Arc::new(Metrics {
            registry: root,
            ..m
        })
    }

    /// The text exposition: OpenMetrics if `openmetrics`, else Prometheus' text
    /// format 0.0.4.
    pub fn encode(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        let r = if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        };
        r.expect("writing to a String cannot fail");
        out
    }

    /// The credentials new handshakes use now.
    pub fn set_credentials(&self, creds: &Credentials) {
        for (which, at) in [
            (Which::own, creds.not_after),
            (Which::ca, creds.ca_not_after),
        ] {
            self.cert_expiry
                .get_or_create(&CertLabels { certificate: which })
                .set(at.unix_timestamp());
        }
        self.cert_info.clear();
        self.cert_info
            .get_or_create(&CertInfoLabels {
                identity: creds.identity.clone(),
                serial: creds.serial.clone(),
            })
            .set(1);
    }

    pub fn reloaded(&self, ok: bool) {
        let result = if ok {
            ReloadResult::success
        } else {
            ReloadResult::failure
        };
        self.cert_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    /// Counts the refusals of this agent's certificate verifier.
    pub fn rejection_hook(self: &Arc<Self>) -> RejectionHook {
        let me = Arc::downgrade(self);
        RejectionHook(Arc::new(move |r: CertRejection| {
            if let Some(m) = me.upgrade() {
                m.refused(r.into());
            }
        }))
    }

    pub fn refused(&self, reason: RefusalReason) {
        self.refusals.get_or_create(&RefusalLabels { reason }).inc();
    }

    pub fn zero_rtt(&self, switch: &Name, accepted: bool) {
        let result = if accepted {
            ZeroRttResult::accepted
        } else {
            ZeroRttResult::rejected
        };
        self.zero_rtt
            .get_or_create(&ZeroRttLabels {
                switch: switch.clone(),
                result,
            })
            .inc();
    }

    /// A connection between the agents came up (for the controller agent: it
    /// became the switch's current one).
    pub fn link_up(&self, link: &Arc<Link>) {
        let handshake = if link.early_start {
            HandshakeKind::zero_rtt
        } else {
            HandshakeKind::full
        };
        self.connects
            .get_or_create(&ConnectLabels {
                switch: link.switch.clone(),
                handshake,
            })
            .inc();
        self.links.up(link);
        if let Some(cert) = quicsdn_transport::identity::peer_certificate(&link.conn) {
            self.peer_certificate(&link.switch, &cert);
        }
    }

    /// The certificate the other agent presented on the switch's connection.
    pub fn peer_certificate(&self, switch: &Name, cert: &quicsdn_transport::identity::CertSummary) {
        let mut serials = self.peer_serials.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = serials.insert(switch.clone(), cert.serial.clone()) {
            self.peer_cert.remove(&PeerCertLabels {
                switch: switch.clone(),
                serial: old,
            });
        }
        self.peer_cert
            .get_or_create(&PeerCertLabels {
                switch: switch.clone(),
                serial: cert.serial.clone(),
            })
            .set(1);
        self.peer_cert_expiry
            .get_or_create(&SwitchLabels {
                switch: switch.clone(),
            })
            .set(cert.not_after.unix_timestamp());
    }

    /// A connection ended; counted only if [`Metrics::link_up`] reported it
    /// (a 0-RTT attempt that never completed its handshake was never up).
    pub fn link_down(&self, link: &Arc<Link>, reason: &quinn::ConnectionError) {
        if self.links.down(link) {
            self.disconnects
                .get_or_create(&DisconnectLabels {
                    switch: link.switch.clone(),
                    reason: DisconnectReason::of(reason),
                })
                .inc();
        }
    }

    /// The switch agent moved to a new local address (`rebind`).
    pub fn rebound(&self, switch: &str) {
        self.links.rebound(switch);
    }

    /// Notices migrations (the switch's address changed) every `period`, so
    /// that two moves between scrapes count as two.
    pub(crate) async fn watch_migrations(self: Arc<Self>, period: Duration, shutdown: Shutdown) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.links.check_addresses(),
                _ = shutdown.wait() => return,
            }
        }
    }

    /// Switches whose current connection is up, with their open sessions by
    /// service (for `/healthz`).
    pub fn connected(&self) -> Vec<(String, HashMap<String, i64>)> {
        let links = self.links.map();
        let mut v: Vec<_> = links
            .iter()
            .filter(|(_, s)| s.live().is_some_and(|l| l.is_alive()))
            .map(|(name, s)| {
                let sessions = s.services.iter().map(|(svc, g)| (svc.to_string(), g.get()));
                (name.to_string(), sessions.collect())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The meters of one session: the session itself (open, malformed
    /// closes), what this agent sends to the other agent (`sent`, travelling
    /// in direction `sent`) and what it delivers to its local peer.
    pub fn session(
        &self,
        switch: &Name,
        service: &Name,
        framing: Framing,
        sent: Direction,
    ) -> (SessionMeter, Meter, Meter) {
        let labels = ServiceLabels {
            switch: switch.clone(),
            service: service.clone(),
        };
        self.sessions_opened.get_or_create(&labels).inc();
        let open = self.sessions.get_or_create(&labels).clone();
        open.inc();
        self.links
            .map()
            .entry(switch.clone())
            .or_default()
            .services
            .entry(service.clone())
            .or_insert_with(|| open.clone());
        let received = match sent {
            Direction::ToController => Direction::ToSwitch,
            Direction::ToSwitch => Direction::ToController,
        };
        let meter = |d: Direction| {
            let labels = FlowLabels {
                switch: switch.clone(),
                service: service.clone(),
                direction: d.into(),
            };
            Meter {
                framing,
                messages: self.messages.get_or_create(&labels).clone(),
                bytes: self.bytes.get_or_create(&labels).clone(),
                labels,
                types: Vec::new(),
                openflow: self.openflow.clone(),
                coalesce_hold: self.coalesce_hold.clone(),
                coalesce_messages: self.coalesce_messages.clone(),
            }
        };
        let session = SessionMeter {
            open,
            malformed: self.malformed.clone(),
            labels,
        };
        (session, meter(sent), meter(received))
    }
}

/// One session's open-sessions gauge (decremented when dropped) and its
/// malformed closes.
pub struct SessionMeter {
    open: Gauge,
    malformed: Family<MalformedLabels, Counter>,
    labels: ServiceLabels,
}

/// Messages and bytes of one direction of a session, counted on the hot path
/// without locks (each counter is an atomic shared with the registry).
pub struct Meter {
    framing: Framing,
    labels: FlowLabels,
    messages: Counter,
    bytes: Counter,
    /// Counters per OpenFlow message type, found once per session.
    types: Vec<(&'static str, Counter)>,
    openflow: Family<TypeLabels, Counter>,
    coalesce_hold: Histograms,
    coalesce_messages: Histograms,
}

impl Meter {
    /// Held messages left (what this direction's coalescer reported).
    pub fn flushed(&self, f: &Flush) {
        let labels = CoalesceLabels {
            service: self.labels.service.clone(),
            direction: self.labels.direction,
            reason: f.reason.into(),
        };
        self.coalesce_hold
            .get_or_create(&labels)
            .observe(f.held_for.as_secs_f64());
        self.coalesce_messages
            .get_or_create(&labels)
            .observe(f64::from(f.messages));
    }

    fn of_type(&mut self, name: &'static str) -> &Counter {
        let i = match self.types.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                let c = self
                    .openflow
                    .get_or_create(&TypeLabels {
                        switch: self.labels.switch.clone(),
                        service: self.labels.service.clone(),
                        direction: self.labels.direction,
                        r#type: name,
                    })
                    .clone();
                self.types.push((name, c));
                self.types.len() - 1
            }
        };
        &self.types[i].1
    }

    /// Counts a run of whole messages (markers of `safe` mode skipped).
    pub fn count(&mut self, run: &[u8]) {
        match self.framing {
            Framing::OpenFlow => {
                let mut at = 0;
                while let Some(h) = Header::parse(&run[at..]) {
                    let len = usize::from(h.length).max(HEADER_LEN);
                    if !marker::is_marker(&run[at..]) {
                        self.messages.inc();
                        self.bytes.inc_by(len.min(run.len() - at) as u64);
                        self.of_type(h.kind().name()).inc();
                    }
                    at += len;
                    if at >= run.len() {
                        break;
                    }
                }
            }
            Framing::JsonRpc => {
                let mut framer = Framer::new(Framing::JsonRpc, usize::MAX);
                let mut at = 0;
                while let Ok(Some(n)) = framer.next_message(&run[at..]) {
                    self.messages.inc();
                    at += n;
                }
                self.bytes.inc_by(run.len() as u64);
            }
            Framing::Raw => {
                self.bytes.inc_by(run.len() as u64);
            }
        }
    }
}

impl SessionMeter {
    /// The session closed on a malformed message.
    pub fn malformed(&self, origin: Origin) {
        self.malformed
            .get_or_create(&MalformedLabels {
                switch: self.labels.switch.clone(),
                service: self.labels.service.clone(),
                origin,
            })
            .inc();
    }
}

impl Drop for SessionMeter {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// QUIC statistics that only grow.
#[derive(Debug, Default, Clone, Copy)]
struct QuicTotals {
    sent_packets: u64,
    lost_packets: u64,
    lost_bytes: u64,
    congestion_events: u64,
    udp_tx_bytes: u64,
    udp_rx_bytes: u64,
    udp_tx_datagrams: u64,
    udp_rx_datagrams: u64,
}

impl QuicTotals {
    fn of(s: &quinn::ConnectionStats) -> QuicTotals {
        QuicTotals {
            sent_packets: s.path.sent_packets,
            lost_packets: s.path.lost_packets,
            lost_bytes: s.path.lost_bytes,
            congestion_events: s.path.congestion_events,
            udp_tx_bytes: s.udp_tx.bytes,
            udp_rx_bytes: s.udp_rx.bytes,
            udp_tx_datagrams: s.udp_tx.datagrams,
            udp_rx_datagrams: s.udp_rx.datagrams,
        }
    }

    fn add(&mut self, o: QuicTotals) {
        self.sent_packets += o.sent_packets;
        self.lost_packets += o.lost_packets;
        self.lost_bytes += o.lost_bytes;
        self.congestion_events += o.congestion_events;
        self.udp_tx_bytes += o.udp_tx_bytes;
        self.udp_rx_bytes += o.udp_rx_bytes;
        self.udp_tx_datagrams += o.udp_tx_datagrams;
        self.udp_rx_datagrams += o.udp_rx_datagrams;
    }
}

/// One switch's connection as the metrics see it.
#[derive(Default)]
struct SwitchState {
    /// Weak: the link holds the metrics, and a link the agent dropped (at
    /// shutdown) must not be kept, with its endpoint, by them.
    live: Option<Weak<Link>>,
    /// The peer address last seen on the live connection.
    remote: Option<SocketAddr>,
    /// Unix time the live connection came up.
    since: f64,
    closed: QuicTotals,
    migrations: u64,
    services: HashMap<Name, Gauge>,
}

impl SwitchState {
    fn live(&self) -> Option<Arc<Link>> {
        self.live.as_ref()?.upgrade()
    }
}

#[derive(Default)]
struct Links(Mutex<HashMap<Name, SwitchState>>);

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Links")
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Links {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Name, SwitchState>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn up(&self, link: &Arc<Link>) {
        let mut map = self.map();
        let s = map.entry(link.switch.clone()).or_default();
        // A connection that replaced one still open: keep what the old one counted.
        if let Some(old) = s.live.take().and_then(|l| l.upgrade()) {
            s.closed.add(QuicTotals::of(&old.conn.stats()));
        }
        s.remote = Some(link.conn.remote_address());
        s.since = unix_now();
        s.live = Some(Arc::downgrade(link));
    }

    /// True if `link` was the switch's live connection.
    fn down(&self, link: &Arc<Link>) -> bool {
        let mut map = self.map();
        if let Some(s) = map.get_mut(&*link.switch)
            && s.live
                .as_ref()
                .is_some_and(|l| std::ptr::eq(l.as_ptr(), Arc::as_ptr(link)))
        {
            s.closed.add(QuicTotals::of(&link.conn.stats()));
            s.live = None;
            return true;
        }
        false
    }

    fn rebound(&self, switch: &str) {
        if let Some(s) = self.map().get_mut(switch) {
            s.migrations += 1;
        }
    }

    /// Counts changes of a live connection's peer address (the controller
    /// agent sees the switch move; RFC 9000 §9).
    fn check_addresses(&self) {
        for s in self.map().values_mut() {
            if let Some(l) = s.live() {
                let now = l.conn.remote_address();
                if s.remote.is_some_and(|r| r != now) {
                    s.migrations += 1;
                }
                s.remote = Some(now);
            }
        }
    }
}

/// Per-switch connection metrics, read from quinn at each scrape.
#[derive(Debug)]
struct LinkCollector(Arc<Links>);

/// Encodes one family of per-switch values.
fn per_switch<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(Name, M)],
) -> Result<(), std::fmt::Error> {
    let Some(first) = values.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, unit, first.1.metric_type())?;
    for (switch, v) in values {
        let labels = SwitchLabels {
            switch: switch.clone(),
        };
        v.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for LinkCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.check_addresses();
        let map = self.0.map();
        let mut names: Vec<&Name> = map.keys().collect();
        names.sort();
        type Row<T> = Vec<(Name, T)>;
        let (mut up, mut cwnd, mut mtu): (Row<ConstGauge>, Row<ConstGauge>, Row<ConstGauge>) =
            Default::default();
        let (mut since, mut rtt): (Row<ConstGauge<f64>>, Row<ConstGauge<f64>>) = Default::default();
        let mut totals: Vec<(Name, QuicTotals, u64)> = Vec::new();
        for name in names {
            let s = &map[name];
            let link = s.live();
            let live = link.as_ref().filter(|l| l.is_alive());
            up.push((name.clone(), ConstGauge::new(i64::from(live.is_some()))));
            let mut t = s.closed;
            if let Some(l) = live {
                let stats = l.conn.stats();
                t.add(QuicTotals::of(&stats));
                since.push((name.clone(), ConstGauge::new(s.since)));
                rtt.push((name.clone(), ConstGauge::new(stats.path.rtt.as_secs_f64())));
                cwnd.push((name.clone(), ConstGauge::new(stats.path.cwnd as i64)));
                mtu.push((
                    name.clone(),
                    ConstGauge::new(i64::from(stats.path.current_mtu)),
                ));
            } else if let Some(l) = &link {
                // Closed but not yet reported down: its final numbers.
                t.add(QuicTotals::of(&l.conn.stats()));
            }
            totals.push((name.clone(), t, s.migrations));
        }
        drop(map);
        let e = &mut encoder;
        per_switch(
            e,
            "connected",
            "1 while the switch's QUIC connection is up (OVS's is_connected)",
            None,
            &up,
        )?;
        per_switch(
            e,
            "connection_start_time_seconds",
            "When the switch's current connection came up, Unix time (time() minus it is OVS's sec_since_connect)",
            None,
            &since,
        )?;
        per_switch(
            e,
            "quic_rtt_seconds",
            "Smoothed round-trip time of the switch's connection",
            None,
            &rtt,
        )?;
        per_switch(
            e,
            "quic_congestion_window_bytes",
            "Congestion window of the switch's connection",
            None,
            &cwnd,
        )?;
        per_switch(
            e,
            "quic_mtu_bytes",
            "Path MTU in use (UDP payload)",
            None,
            &mtu,
        )?;
        let counter = |f: fn(&QuicTotals) -> u64| -> Row<ConstCounter> {
            totals
                .iter()
                .map(|(n, t, _)| (n.clone(), ConstCounter::new(f(t))))
                .collect()
        };
        per_switch(
            e,
            "quic_sent_packets",
            "QUIC packets sent",
            None,
            &counter(|t| t.sent_packets),
        )?;
        per_switch(
            e,
            "quic_lost_packets",
            "QUIC packets declared lost; QUIC retransmits their frames in new packets (RFC 9000 §13.3), so this also counts retransmissions",
            None,
            &counter(|t| t.lost_packets),
        )?;
        per_switch(
            e,
            "quic_lost",
            "Bytes in QUIC packets declared lost (and retransmitted)",
            Some(&Unit::Bytes),
            &counter(|t| t.lost_bytes),
        )?;
        per_switch(
            e,
            "quic_congestion_events",
            "Congestion events (window reductions)",
            None,
            &counter(|t| t.congestion_events),
        )?;
        per_switch(
            e,
            "udp_sent",
            "UDP payload bytes sent for the switch's connections",
            Some(&Unit::Bytes),
            &counter(|t| t.udp_tx_bytes),
        )?;
        per_switch(
            e,
            "udp_received",
            "UDP payload bytes received for the switch's connections",
            Some(&Unit::Bytes),
            &counter(|t| t.udp_rx_bytes),
        )?;
        per_switch(
            e,
            "udp_sent_datagrams",
            "UDP datagrams sent for the switch's connections",
            None,
            &counter(|t| t.udp_tx_datagrams),
        )?;
        per_switch(
            e,
            "udp_received_datagrams",
            "UDP datagrams received for the switch's connections",
            None,
            &counter(|t| t.udp_rx_datagrams),
        )?;
        let migrations: Row<ConstCounter> = totals
            .iter()
            .map(|(n, _, m)| (n.clone(), ConstCounter::new(*m)))
            .collect();
        per_switch(
            e,
            "migrations",
            "Connection migrations: on the controller agent, changes of the switch's address; on the switch agent, rebinds to a new local address",
            None,
            &migrations,
        )?;
        Ok(())
    }
}

/// The standard `process_*` metrics, from /proc/self.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let e = &mut encoder;
        let counter = ConstCounter::new(p.cpu_seconds);
        counter.encode(e.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time of the agent",
            None,
            counter.metric_type(),
        )?)?;
        for (name, help, v) in [
            (
                "process_resident_memory_bytes",
                "Resident memory",
                p.rss_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory",
                p.vsize_bytes,
            ),
            ("process_open_fds", "Open file descriptors", p.open_fds),
        ] {
            let g = ConstGauge::new(v as i64);
            g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let g = ConstGauge::new(p.start_time_seconds);
        g.encode(e.encode_descriptor(
            "process_start_time_seconds",
            "When the agent started, Unix time",
            None,
            g.metric_type(),
        )?)?;
        Ok(())
    }
}

/// What /proc says about this process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub vsize_bytes: u64,
    pub open_fds: u64,
    pub start_time_seconds: f64,
}

impl ProcessStats {
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24 (1-based,
        // counting pid and comm), so index - 3 here.
        let num = |i: usize| f.get(i - 3)?.parse::<u64>().ok();
        // SAFETY: sysconf reads a constant.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        Some(ProcessStats {
            cpu_seconds: (num(14)? + num(15)?) as f64 / ticks,
            rss_bytes: num(24)? * page,
            vsize_bytes: num(23)?,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
            start_time_seconds: boot + num(22)? as f64 / ticks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::{ConnectionClose, ConnectionError, TransportErrorCode};
    use quinn_proto::TransportError;

    fn closed_by_peer(code: TransportErrorCode) -> ConnectionError {
        ConnectionError::ConnectionClosed(ConnectionClose {
            error_code: code,
            frame_type: None,
            reason: bytes::Bytes::new(),
        })
    }

    /// The peer's TLS alert names the reason (RFC 8446 §6.2: 48
    /// unknown_ca, 45 certificate_expired, 116 certificate_required, 42–46
    /// the other certificate alerts); admission is CONNECTION_REFUSED.
    #[test]
    fn a_failed_handshake_is_counted_under_the_reason_the_peer_gave() {
        let alert = |a: u8| closed_by_peer(TransportErrorCode::crypto(a));
        let cases = [
            (ConnectionError::TimedOut, RefusalReason::timed_out),
            (
                closed_by_peer(TransportErrorCode::CONNECTION_REFUSED),
                RefusalReason::admission,
            ),
            (alert(48), RefusalReason::unknown_issuer),
            (alert(45), RefusalReason::expired),
            (alert(116), RefusalReason::no_certificate),
            (alert(42), RefusalReason::bad_certificate),
            (alert(44), RefusalReason::bad_certificate),
            // handshake_failure and no_application_protocol: not a certificate.
            (alert(40), RefusalReason::other),
            (alert(120), RefusalReason::other),
            (
                closed_by_peer(TransportErrorCode::PROTOCOL_VIOLATION),
                RefusalReason::other,
            ),
        ];
        for (error, reason) in cases {
            assert_eq!(
                RefusalReason::of_failed_handshake(&error),
                Some(reason),
                "{error}"
            );
        }
        // Our own verifier refused: it has counted the refusal already.
        let own = ConnectionError::TransportError(TransportError {
            code: TransportErrorCode::crypto(48),
            frame: None,
            reason: "invalid peer certificate: UnknownIssuer".into(),
        });
        assert_eq!(RefusalReason::of_failed_handshake(&own), None);
    }

    #[test]
    fn a_lost_connection_is_counted_under_why_it_ended() {
        let app_closed = |code: u32| {
            ConnectionError::ApplicationClosed(quinn::ApplicationClose {
                error_code: quinn::VarInt::from_u32(code),
                reason: bytes::Bytes::new(),
            })
        };
        let cases = [
            (ConnectionError::TimedOut, DisconnectReason::timed_out),
            (ConnectionError::Reset, DisconnectReason::reset_by_peer),
            (
                ConnectionError::LocallyClosed,
                DisconnectReason::closed_here,
            ),
            (
                app_closed(quicsdn_wire::preamble::code::SUPERSEDED),
                DisconnectReason::superseded,
            ),
            (app_closed(0), DisconnectReason::closed_by_peer),
            (
                closed_by_peer(TransportErrorCode::NO_ERROR),
                DisconnectReason::closed_by_peer,
            ),
            (
                closed_by_peer(TransportErrorCode::CONNECTION_REFUSED),
                DisconnectReason::refused,
            ),
            (
                closed_by_peer(TransportErrorCode::PROTOCOL_VIOLATION),
                DisconnectReason::protocol_error,
            ),
        ];
        for (error, reason) in cases {
            assert_eq!(DisconnectReason::of(&error), reason, "{error}");
        }
    }

    #[test]
    fn refusals_are_served_by_reason_with_no_switch_label() {
        let m = Metrics::new("controller");
        m.refused(CertRejection::Expired.into());
        m.refused(CertRejection::Expired.into());
        m.refused(CertRejection::UnknownIssuer.into());
        m.refused(CertRejection::Other.into());
        let text = m.encode(true);
        for line in [
            r#"quicsdn_handshake_refusals_total{reason="expired"} 2"#,
            r#"quicsdn_handshake_refusals_total{reason="unknown_issuer"} 1"#,
            r#"quicsdn_handshake_refusals_total{reason="bad_certificate"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("reason=\"wrong_name\""), "{text}");
    }
}
