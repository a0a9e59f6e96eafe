//! How each switch's OpenFlow channel reaches the controller.
//!
//! * `tcp`: OVS `tcp:CTL:PORT` straight to the controller.
//! * `tls`: OVS `ssl:CTL:PORT` with the lab's certificates (`ovs-vsctl
//!   set-ssl`), to the controller's TLS listener, which requires a client
//!   certificate from the same CA: mutual authentication.
//! * `quic`: through the quicsdn agents (see [`crate::agents`]): a switch
//!   agent beside each OVS, reached by a unix socket in OVS's run directory,
//!   and one controller agent beside the controller, which then listens only on
//!   its namespace's loopback. Mutual TLS with the lab's certificates.
//! * `kcptun`: through kcptun (Debian package `kcptun`), a generic TCP tunnel over
//!   KCP (reliable UDP): a `kcptun-client` beside each OVS listening on the switch
//!   namespace's loopback, one `kcptun-server` beside the controller. Its defaults
//!   (AES, FEC 10+3, mode `fast`), without compression. No authentication beyond a
//!   pre-shared key: the tool a user might pick instead of quicsdn.
//! * `udp-seed`, `udp-robust`: the same quicsdn agents as `quic`, but with
//!   `--transport udp --udp-profile seed|robust --allow-unauthenticated`:
//!   OpenFlow over plain UDP with an application-level reliability layer (the
//!   paper `openflow-over-udp-ryu-ovs`'s mechanism, and a robust one). Neither
//!   authenticates nor encrypts; the switch's name comes from its certificate
//!   file, which is only read, never presented.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::str::FromStr;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Tls,
    Quic,
    Kcptun,
    #[serde(rename = "udp-seed")]
    UdpSeed,
    #[serde(rename = "udp-robust")]
    UdpRobust,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
            Transport::Kcptun => "kcptun",
            Transport::UdpSeed => "udp-seed",
            Transport::UdpRobust => "udp-robust",
        }
    }

    /// True for transports carried by the quicsdn agents (`quic`, `udp-*`).
    pub fn uses_agents(self) -> bool {
        matches!(
            self,
            Transport::Quic | Transport::UdpSeed | Transport::UdpRobust
        )
    }

    /// The agents' options selecting this transport (none for `quic`).
    pub fn agent_transport_args(self) -> Vec<String> {
        let profile = match self {
            Transport::UdpSeed => "seed",
            Transport::UdpRobust => "robust",
            _ => return Vec::new(),
        };
        vec![
            "--transport=udp".into(),
            format!("--udp-profile={profile}"),
            "--allow-unauthenticated".into(),
        ]
    }

    /// Ok when the lab can build this transport now (for `quic`: the `quicsdn`
    /// binary is there).
    pub fn check_available(self) -> Result<()> {
        match self {
            Transport::Tcp | Transport::Tls => Ok(()),
            Transport::Quic | Transport::UdpSeed | Transport::UdpRobust => {
                crate::agents::quicsdn_binary().map(|_| ())
            }
            Transport::Kcptun => crate::bench::pair::kcptun_binaries().map(|_| ()),
        }
    }

    /// Whether the lab generates certificates for it.
    pub fn needs_pki(self) -> bool {
        matches!(self, Transport::Tls) || self.uses_agents()
    }

    /// The OVS controller target for a controller at `ctl:port`, for a switch
    /// whose OVS runs in `ovs_dir`.
    pub fn ovs_target(self, ctl: Ipv4Addr, port: u16, ovs_dir: &Path) -> String {
        match self {
            Transport::Tcp => format!("tcp:{ctl}:{port}"),
            Transport::Tls => format!("ssl:{ctl}:{port}"),
            Transport::Quic | Transport::UdpSeed | Transport::UdpRobust => {
                format!("unix:{}", crate::agents::openflow_socket(ovs_dir).display())
            }
            Transport::Kcptun => format!("tcp:127.0.0.1:{port}"),
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
            "kcptun" => Ok(Transport::Kcptun),
            "udp-seed" => Ok(Transport::UdpSeed),
            "udp-robust" => Ok(Transport::UdpRobust),
            _ => bail!("unknown transport {s:?} (tcp, tls, quic, kcptun, udp-seed or udp-robust)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let ip = Ipv4Addr::new(10, 254, 1, 1);
        let dir = Path::new("/run/quicsdn-lab/qsdn/sw1");
        assert_eq!(
            Transport::Tcp.ovs_target(ip, 6653, dir),
            "tcp:10.254.1.1:6653"
        );
        assert_eq!(
            Transport::Tls.ovs_target(ip, 6653, dir),
            "ssl:10.254.1.1:6653"
        );
        assert_eq!(
            Transport::Quic.ovs_target(ip, 6653, dir),
            "unix:/run/quicsdn-lab/qsdn/sw1/quicsdn-openflow.sock"
        );
        assert_eq!(
            Transport::Kcptun.ovs_target(ip, 6653, dir),
            "tcp:127.0.0.1:6653"
        );
        assert_eq!("tls".parse::<Transport>().unwrap(), Transport::Tls);
        assert_eq!("kcptun".parse::<Transport>().unwrap(), Transport::Kcptun);
        assert!("udp".parse::<Transport>().is_err());
        assert_eq!(
            "udp-robust".parse::<Transport>().unwrap(),
            Transport::UdpRobust
        );
        assert_eq!(
            Transport::UdpSeed.ovs_target(ip, 6653, dir),
            "unix:/run/quicsdn-lab/qsdn/sw1/quicsdn-openflow.sock"
        );
        assert_eq!(
            serde_json::to_string(&Transport::UdpSeed).unwrap(),
            "\"udp-seed\""
        );
    }
}
