//! Local connection targets in Open vSwitch's syntax.
//!
//! Open vSwitch names connection methods `tcp:IP[:PORT]`, `unix:PATH` (active) and
//! `ptcp:[PORT][:IP]`, `punix:PATH` (passive); see ovs-vswitchd.conf.db(5),
//! "Controller" and "Manager" tables. quicsdn uses the same words for the local side
//! of each service, so an operator writes the same thing on both sides of an agent.
//!
//! One deliberate difference: OVS's `ptcp:PORT` with no IP listens on every
//! address. The local side of an agent is unauthenticated (only the QUIC side uses
//! TLS), so quicsdn listens on 127.0.0.1 unless an IP is given.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

/// Placeholder replaced by a switch's certificate identity in per-switch paths.
pub const SWITCH_PLACEHOLDER: &str = "{switch}";

/// A local connection target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// `tcp:HOST:PORT` — connect to this address.
    Tcp { host: String, port: u16 },
    /// `unix:PATH` — connect to this unix socket.
    Unix { path: PathBuf },
    /// `ptcp:PORT[:IP]` — listen on this TCP port.
    PTcp { port: u16, ip: IpAddr },
    /// `punix:PATH` — listen on this unix socket path.
    PUnix { path: PathBuf },
}

/// Why a target string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid target {target:?}: {reason}")]
pub struct TargetError {
    pub target: String,
    pub reason: String,
}

impl Target {
    /// Parses `s`. `default_port` fills in an omitted port (OVS's defaults are 6653
    /// for OpenFlow and 6640 for OVSDB); without one, the port is required.
    pub fn parse(s: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
        let err = |reason: &str| TargetError {
            target: s.to_string(),
            reason: reason.to_string(),
        };
        let (method, rest) = s
            .split_once(':')
            .ok_or_else(|| err("expected METHOD:ARGS with METHOD one of tcp, unix, ptcp, punix"))?;
        let port = |p: &str| -> Result<u16, TargetError> {
            if p.is_empty() {
                return default_port.ok_or_else(|| err("a port is required for this service"));
            }
            p.parse::<u16>()
                .map_err(|_| err("the port must be a number from 0 to 65535"))
        };
        match method {
            "tcp" => {
                let (host, p) = split_host_port(rest).map_err(&err)?;
                if host.is_empty() {
                    return Err(err("tcp: needs a host, as in tcp:127.0.0.1:6653"));
                }
                let port = port(p)?;
                if port == 0 {
                    return Err(err("cannot connect to port 0"));
                }
                Ok(Target::Tcp {
                    host: host.to_string(),
                    port,
                })
            }
            "ptcp" => {
                // ptcp:[PORT][:IP], where an IPv6 IP may be bracketed.
                let (p, ip) = match rest.split_once(':') {
                    Some((p, ip)) => (p, ip),
                    None => (rest, ""),
                };
                let ip = if ip.is_empty() {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    ip.trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse()
                        .map_err(|_| err("ptcp: takes an IP address, not a host name"))?
                };
                Ok(Target::PTcp { port: port(p)?, ip })
            }
            "unix" | "punix" => {
                if rest.is_empty() {
                    return Err(err("a socket path is required"));
                }
                let path = PathBuf::from(rest);
                if !path.is_absolute() {
                    // OVS would resolve a relative path against its run directory;
                    // the agent has none, so it insists on an absolute path.
                    return Err(err("use an absolute socket path"));
                }
                Ok(if method == "unix" {
                    Target::Unix { path }
                } else {
                    Target::PUnix { path }
                })
            }
            "ssl" | "pssl" => Err(err(
                "the local side of an agent is plain; TLS protects the QUIC side (use tcp/ptcp or unix/punix)",
            )),
            _ => Err(err(&format!(
                "unknown method {method:?}; expected METHOD:ARGS with METHOD one of tcp, unix, ptcp, punix"
            ))),
        }
    }

    /// Passive targets accept local connections; active ones make them.
    pub fn is_passive(&self) -> bool {
        matches!(self, Target::PTcp { .. } | Target::PUnix { .. })
    }

    /// True when the target's path contains [`SWITCH_PLACEHOLDER`].
    pub fn is_per_switch(&self) -> bool {
        match self {
            Target::Unix { path } | Target::PUnix { path } => {
                path.to_string_lossy().contains(SWITCH_PLACEHOLDER)
            }
            _ => false,
        }
    }

    /// The target with [`SWITCH_PLACEHOLDER`] replaced by `switch` (made safe for
    /// a file name first).
    pub fn for_switch(&self, switch: &str) -> Target {
        let safe = sanitize_for_path(switch);
        let sub =
            |p: &PathBuf| PathBuf::from(p.to_string_lossy().replace(SWITCH_PLACEHOLDER, &safe));
        match self {
            Target::Unix { path } => Target::Unix { path: sub(path) },
            Target::PUnix { path } => Target::PUnix { path: sub(path) },
            other => other.clone(),
        }
    }
}

/// Replaces every character other than `[A-Za-z0-9._-]` with `_`, and a leading
/// dot too, so an identity from a certificate cannot climb out of a directory.
pub fn sanitize_for_path(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// Splits `HOST:PORT`, `HOST`, `[V6]:PORT` or `[V6]`.
fn split_host_port(s: &str) -> Result<(&str, &str), &'static str> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed '[' in IPv6 address")?;
        return match after {
            "" => Ok((host, "")),
            _ => after
                .strip_prefix(':')
                .map(|p| (host, p))
                .ok_or("expected ':' after ']'"),
        };
    }
    match s.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => {
            Err("write IPv6 addresses in brackets, as in tcp:[::1]:6653")
        }
        Some((host, port)) => Ok((host, port)),
        None => Ok((s, "")),
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Target::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Target::Unix { path } => write!(f, "unix:{}", path.display()),
            Target::PTcp {
                port,
                ip: IpAddr::V6(ip),
            } => write!(f, "ptcp:{port}:[{ip}]"),
            Target::PTcp { port, ip } => write!(f, "ptcp:{port}:{ip}"),
            Target::PUnix { path } => write!(f, "punix:{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str, default: Option<u16>) -> Target {
        Target::parse(s, default).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn ovs_syntax_parses() {
        assert_eq!(
            ok("tcp:127.0.0.1:6653", None),
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 6653
            }
        );
        assert_eq!(
            ok("tcp:[::1]:6640", None),
            Target::Tcp {
                host: "::1".into(),
                port: 6640
            }
        );
        assert_eq!(
            ok("tcp:controller.example", Some(6653)),
            Target::Tcp {
                host: "controller.example".into(),
                port: 6653
            }
        );
        assert_eq!(
            ok("ptcp:6640:127.0.0.1", None),
            Target::PTcp {
                port: 6640,
                ip: "127.0.0.1".parse().unwrap()
            }
        );
        assert_eq!(
            ok("ptcp:6640:[::1]", None),
            Target::PTcp {
                port: 6640,
                ip: "::1".parse().unwrap()
            }
        );
        // Unlike OVS, an omitted IP means loopback: the local side is unauthenticated.
        assert_eq!(
            ok("ptcp:", Some(6640)),
            Target::PTcp {
                port: 6640,
                ip: "127.0.0.1".parse().unwrap()
            }
        );
        assert_eq!(
            ok("punix:/run/quicsdn/of.sock", None),
            Target::PUnix {
                path: "/run/quicsdn/of.sock".into()
            }
        );
        assert_eq!(
            ok("unix:/a b/c", None),
            Target::Unix {
                path: "/a b/c".into()
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "tcp:127.0.0.1:6653",
            "tcp:[::1]:6640",
            "unix:/x/y.sock",
            "ptcp:6640:127.0.0.1",
            "ptcp:6653:[::1]",
            "punix:/run/q/{switch}.sock",
        ] {
            assert_eq!(ok(s, None).to_string(), s);
        }
    }

    #[test]
    fn mistakes_are_explained() {
        let cases = [
            ("127.0.0.1:6653", "METHOD:ARGS"),
            ("tcp:127.0.0.1", "port is required"),
            ("tcp:127.0.0.1:66530", "0 to 65535"),
            ("tcp::6653", "needs a host"),
            ("tcp:::1:6653", "brackets"),
            ("tcp:[::1:6653", "unclosed"),
            ("tcp:1.2.3.4:0", "port 0"),
            ("ptcp:6640:localhost", "IP address"),
            ("unix:relative.sock", "absolute"),
            ("punix:", "path is required"),
            ("ssl:1.2.3.4:6653", "TLS protects the QUIC side"),
            ("udp:1.2.3.4:6653", "unknown method \"udp\""),
        ];
        for (input, words) in cases {
            let e = Target::parse(input, None).unwrap_err().to_string();
            assert!(e.contains(words), "{input}: {e}");
            assert!(e.contains(input), "{input}: {e}");
        }
    }

    #[test]
    fn per_switch_paths_are_substituted_safely() {
        let t = ok("punix:/run/quicsdn/{switch}/ovsdb.sock", None);
        assert!(t.is_passive() && t.is_per_switch());
        assert_eq!(
            t.for_switch("sw1.example"),
            Target::PUnix {
                path: "/run/quicsdn/sw1.example/ovsdb.sock".into()
            }
        );
        assert_eq!(
            t.for_switch("../../etc"),
            Target::PUnix {
                path: "/run/quicsdn/_.._.._etc/ovsdb.sock".into()
            }
        );
        assert_eq!(sanitize_for_path(""), "_");
        assert!(!ok("tcp:1.2.3.4:1", None).is_per_switch());
    }
}
