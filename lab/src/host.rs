//! Hosts: a namespace attached to an OVS bridge by a veth pair.
//!
//! The host side is `eth0` with a fixed MAC and address, IPv6 off and transmit
//! checksum offload off (the OVS userspace datapath does not complete partial
//! checksums, so TCP between hosts would carry no data otherwise).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::netns::{Netns, VethEnd, create_veth};
use crate::ovs::Ovs;

/// A host to attach with [`attach_host`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSpec {
    /// Its namespace (must exist).
    pub netns: String,
    /// The interface inside the host, e.g. `eth0`.
    pub ifname: String,
    pub mac: String,
    /// Address with prefix length, e.g. `10.0.1.1/16`.
    pub cidr: String,
    /// The switch-side interface name (also the OVS port name), e.g. `h1-1`.
    pub port: String,
    /// The OpenFlow port number to ask for.
    pub ofport: Option<u16>,
}

impl HostSpec {
    /// The address without prefix length (what to ping).
    pub fn ip(&self) -> &str {
        self.cidr.split('/').next().unwrap_or(&self.cidr)
    }
}

/// Connects host `spec.netns` to `bridge` of `switch` (whose namespace gets
/// the `spec.port` end) and configures the host side.
pub fn attach_host(spec: &HostSpec, switch: &Ovs, bridge: &str) -> Result<()> {
    let host = Netns::named(&spec.netns);
    let sw = Netns::named(&switch.netns);
    (|| -> Result<()> {
        host.disable_ipv6()?;
        create_veth(
            &VethEnd::new(&host, &spec.ifname).with_mac(&spec.mac),
            &VethEnd::new(&sw, &spec.port),
        )?;
        host.add_addr(&spec.ifname, &spec.cidr)?;
        host.tx_checksum_off(&spec.ifname)?;
        host.link_up(&spec.ifname)?;
        sw.link_up(&spec.port)?;
        switch.add_port(bridge, &spec.port, spec.ofport)
    })()
    .with_context(|| {
        format!(
            "attaching host {} to {bridge} in {}",
            spec.netns, switch.netns
        )
    })
}

/// What [`ping`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingStats {
    pub transmitted: u32,
    pub received: u32,
}

impl PingStats {
    pub fn all_replied(&self) -> bool {
        self.transmitted > 0 && self.received == self.transmitted
    }
}

/// Pings `dst` from `host`: `count` echo requests, `interval` seconds apart,
/// waiting at most 1 s for the last reply. Loss is not an error: read it in
/// the returned counts.
pub fn ping(host: &Netns, dst: &str, count: u32, interval: f64) -> Result<PingStats> {
    let mut c = host.command("ping");
    c.args([
        "-n",
        "-q",
        "-c",
        &count.to_string(),
        "-i",
        &interval.to_string(),
    ])
    .args(["-W", "1", dst]);
    let out = c
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run ping in {}", host.name))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "3 packets transmitted, 3 received, 0% packet loss, time 402ms"
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "ping {dst} from {}: no summary ({}): {}",
                host.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
    let num = |i: usize| -> Option<u32> {
        line.split(',')
            .nth(i)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    match (num(0), num(1)) {
        (Some(transmitted), Some(received)) => Ok(PingStats {
            transmitted,
            received,
        }),
        _ => anyhow::bail!("cannot parse ping summary {line:?}"),
    }
}
