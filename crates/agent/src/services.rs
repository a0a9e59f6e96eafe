//! The services an agent carries, and how its set compares with its peer's.

use crate::config::{CommonConfig, ServiceConfig};
use quicsdn_lanes::StreamMode;
use quicsdn_transport::Target;
use quicsdn_transport::quic::{QuicOptions, StreamLimits};
use quicsdn_wire::Framing;
use quicsdn_wire::preamble::{Hello, Opener, ServiceOffer};
use std::sync::Arc;

/// A service, resolved for one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Shared with the metrics' label sets of every switch's sessions.
    pub name: Arc<str>,
    pub framing: Framing,
    /// Where local connections come from (passive) or go to (active).
    pub target: Target,
    /// Which side accepts local connections and opens sessions.
    pub opener: Opener,
    pub max_message: usize,
}

/// Everything an agent serves.
#[derive(Debug, Clone)]
pub struct ServiceTable {
    services: Vec<Arc<Service>>,
    /// The side this table describes.
    pub role: Opener,
    /// `--max-sessions`.
    max_sessions: u32,
}

impl ServiceTable {
    pub fn new(common: &CommonConfig, role: Opener) -> ServiceTable {
        let on_switch = role == Opener::Switch;
        let services = common
            .services
            .iter()
            .map(|s: &ServiceConfig| {
                Arc::new(Service {
                    name: s.name.as_str().into(),
                    framing: s.framing,
                    target: s.target.clone(),
                    opener: s.opener(on_switch),
                    max_message: s.max_message(common.max_message),
                })
            })
            .collect();
        ServiceTable {
            services,
            role,
            max_sessions: common.max_sessions,
        }
    }

    /// The agent's QUIC settings, with the stream limits its own mode needs.
    pub fn quic_options(&self, common: &CommonConfig) -> QuicOptions {
        QuicOptions {
            streams: self.stream_limits(common.streams),
            ..common.quic
        }
    }

    /// Streams the peer needs to open at once for `--max-sessions` sessions
    /// in `mode` (ours for the sessions we open, the peer's, from its hello,
    /// for those it opens): one bidirectional stream per session plus the
    /// control stream, and each session's further lanes as unidirectional
    /// streams, for the service with the most. quinn allocates an entry for
    /// every stream the peer may open, so these limits are what an idle
    /// connection costs (issue 18: 4,096 of each took 600 KiB).
    pub fn stream_limits(&self, mode: StreamMode) -> StreamLimits {
        let lanes = self
            .services
            .iter()
            .map(|s| mode.lanes_for(s.framing))
            .max()
            .unwrap_or(1);
        let further = u32::try_from(lanes - 1).unwrap_or(u32::MAX);
        StreamLimits {
            bidi: self.max_sessions + 1,
            uni: self.max_sessions.saturating_mul(further),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Service>> {
        self.services.iter().find(|s| &*s.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.iter()
    }

    /// Services whose local connections this agent accepts.
    pub fn opened_here(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.iter().filter(move |s| s.opener == self.role)
    }

    pub fn names(&self) -> String {
        self.services
            .iter()
            .map(|s| &*s.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn hello(&self, streams: StreamMode) -> Hello {
        Hello {
            agent: format!("quicsdn {}", env!("CARGO_PKG_VERSION")),
            services: self
                .services
                .iter()
                .map(|s| ServiceOffer {
                    name: s.name.to_string(),
                    framing: s.framing.name().to_string(),
                    opener: s.opener,
                })
                .collect(),
            streams: streams.to_string(),
        }
    }

    /// Differences between our services and the peer's, each said as a sentence
    /// naming the service. Sessions of a mismatched service will be refused; the
    /// rest work.
    pub fn compare(&self, theirs: &Hello) -> Vec<String> {
        let peer = match self.role {
            Opener::Switch => "the controller agent",
            Opener::Controller => "the switch agent",
        };
        let mut problems = Vec::new();
        for s in &self.services {
            match theirs.services.iter().find(|o| *o.name == *s.name) {
                None => problems.push(format!(
                    "service {:?} is not configured on {peer}; its sessions will be refused",
                    s.name
                )),
                Some(o) if o.framing != s.framing.name() => problems.push(format!(
                    "service {:?} uses {} framing here but {} on {peer}",
                    s.name,
                    s.framing.name(),
                    o.framing
                )),
                Some(o) if o.opener != s.opener => problems.push(format!(
                    "service {:?}: both agents have {} targets; one side must listen (ptcp:/punix:) and the other connect (tcp:/unix:)",
                    s.name,
                    if s.target.is_passive() { "listening" } else { "connecting" }
                )),
                Some(_) => {}
            }
        }
        for o in &theirs.services {
            if self.get(&o.name).is_none() {
                problems.push(format!(
                    "service {:?} is configured on {peer} but not here; its sessions will be refused",
                    o.name
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_transport::tls::TlsFiles;

    fn table(role: Opener, specs: &[&str]) -> ServiceTable {
        let tls = TlsFiles {
            ca: "/ca".into(),
            cert: "/c".into(),
            key: "/k".into(),
        };
        let services = specs.iter().map(|s| ServiceConfig::parse(s).unwrap());
        let common = CommonConfig::new(tls, services.collect());
        ServiceTable::new(&common, role)
    }

    #[test]
    fn stream_limits_follow_the_mode_and_the_services() {
        let of_db = table(
            Opener::Switch,
            &["openflow=punix:/r/of.sock", "ovsdb=tcp:127.0.0.1:6640"],
        );
        let limits = |t: &ServiceTable, m: &str| {
            let l = t.stream_limits(m.parse().unwrap());
            (l.bidi, l.uni)
        };
        // 8 sessions and the control stream; safe: OpenFlow's main and
        // priority lanes and 8 keyed ones, 9 of them unidirectional.
        assert_eq!(limits(&of_db, "safe"), (9, 8 * 9));
        assert_eq!(
            of_db.stream_limits(StreamMode::default()),
            StreamLimits::default()
        );
        assert_eq!(limits(&of_db, "safe:2"), (9, 8 * 3));
        assert_eq!(limits(&of_db, "ordered"), (9, 0));
        assert_eq!(limits(&of_db, "rr:16"), (9, 8 * 15));
        // OVSDB alone in safe mode: its main lane and echo.
        let db = table(Opener::Switch, &["ovsdb=tcp:127.0.0.1:6640"]);
        assert_eq!(limits(&db, "safe"), (9, 8));
        // Raw services always use one stream.
        let raw = table(Opener::Switch, &["x=tcp:127.0.0.1:1"]);
        assert_eq!(limits(&raw, "rr:16"), (9, 0));
        let mut common = CommonConfig::new(
            TlsFiles {
                ca: "/ca".into(),
                cert: "/c".into(),
                key: "/k".into(),
            },
            vec![ServiceConfig::parse("openflow=ptcp:").unwrap()],
        );
        common.max_sessions = 2;
        let t = ServiceTable::new(&common, Opener::Switch);
        assert_eq!(limits(&t, "safe"), (3, 18));
        assert_eq!(
            t.quic_options(&common).streams,
            t.stream_limits(common.streams)
        );
    }

    #[test]
    fn matching_sets_agree() {
        let sw = table(
            Opener::Switch,
            &["openflow=punix:/r/of.sock", "ovsdb=tcp:127.0.0.1:6640"],
        );
        let ctl = table(
            Opener::Controller,
            &[
                "openflow=tcp:127.0.0.1:6653",
                "ovsdb=punix:/r/{switch}/db.sock",
            ],
        );
        assert_eq!(
            sw.opened_here().map(|s| &*s.name).collect::<Vec<_>>(),
            ["openflow"]
        );
        assert_eq!(
            ctl.opened_here().map(|s| &*s.name).collect::<Vec<_>>(),
            ["ovsdb"]
        );
        assert!(sw.compare(&ctl.hello(StreamMode::Ordered)).is_empty());
        assert!(ctl.compare(&sw.hello(StreamMode::Ordered)).is_empty());
    }

    #[test]
    fn every_mismatch_is_named() {
        let sw = table(
            Opener::Switch,
            &[
                "openflow=punix:/r/of.sock",
                "gauge:openflow=punix:/r/g.sock",
                "snmp=ptcp:161",
                "x=ptcp:1",
            ],
        );
        let ctl = table(
            Opener::Controller,
            &[
                "openflow=tcp:127.0.0.1:6653",
                "gauge=tcp:127.0.0.1:6654",
                "snmp=punix:/r/{switch}.sock",
                "y=tcp:1.1.1.1:1",
            ],
        );
        let p = sw.compare(&ctl.hello(StreamMode::Ordered)).join("\n");
        assert!(
            p.contains("\"gauge\" uses openflow framing here but raw"),
            "{p}"
        );
        assert!(
            p.contains("\"snmp\": both agents have listening targets"),
            "{p}"
        );
        assert!(
            p.contains("\"x\" is not configured on the controller agent"),
            "{p}"
        );
        assert!(
            p.contains("\"y\" is configured on the controller agent but not here"),
            "{p}"
        );
        assert!(!p.contains("\"openflow\""), "{p}");
    }
}
