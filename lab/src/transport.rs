//! How each switch's OpenFlow channel reaches the controller.
//!
//! * `tcp`: OVS `tcp:CTL:PORT` straight to the controller.
//! * `tls`: OVS `ssl:CTL:PORT` with the lab's certificates (`ovs-vsctl
//!   set-ssl`), to the controller's TLS listener, which requires a client
//!   certificate from the same CA: mutual authentication.
//! * `quic`: through the quicsdn agents (a switch agent beside each OVS, a
//!   controller agent beside the controller). Not available until the agents
//!   exist: [`Transport::check_available`] says so. When they do, `quic`
//!   plugs in here (the switch's target becomes the local switch agent) and in
//!   `topology::up` (start the agents).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Tls,
    Quic,
}

/// The error for `--transport quic` until the agents are built.
pub const QUIC_NOT_AVAILABLE: &str = "transport `quic` is not available yet: the quicsdn agents are not built into the lab. \
     Use --transport tcp or --transport tls.";

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
        }
    }

    /// Ok when the lab can build this transport now.
    pub fn check_available(self) -> Result<()> {
        match self {
            Transport::Tcp | Transport::Tls => Ok(()),
            Transport::Quic => bail!("{QUIC_NOT_AVAILABLE}"),
        }
    }

    /// Whether the lab generates certificates for it.
    pub fn needs_pki(self) -> bool {
        matches!(self, Transport::Tls | Transport::Quic)
    }

    /// The OVS controller target for a controller at `ctl:port`.
    pub fn ovs_target(self, ctl: Ipv4Addr, port: u16) -> Result<String> {
        match self {
            Transport::Tcp => Ok(format!("tcp:{ctl}:{port}")),
            Transport::Tls => Ok(format!("ssl:{ctl}:{port}")),
            Transport::Quic => bail!("{QUIC_NOT_AVAILABLE}"),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Transport {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "tls" => Ok(Transport::Tls),
            "quic" => Ok(Transport::Quic),
            _ => bail!("unknown transport {s:?} (tcp, tls or quic)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let ip = Ipv4Addr::new(10, 254, 1, 1);
        assert_eq!(
            Transport::Tcp.ovs_target(ip, 6653).unwrap(),
            "tcp:10.254.1.1:6653"
        );
        assert_eq!(
            Transport::Tls.ovs_target(ip, 6653).unwrap(),
            "ssl:10.254.1.1:6653"
        );
        let e = Transport::Quic.ovs_target(ip, 6653).unwrap_err();
        assert!(e.to_string().contains("not available yet"));
        assert!(Transport::Quic.check_available().is_err());
        assert_eq!("tls".parse::<Transport>().unwrap(), Transport::Tls);
        assert!("udp".parse::<Transport>().is_err());
    }
}
