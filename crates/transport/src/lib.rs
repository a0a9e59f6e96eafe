//! `quicsdn-transport`: the byte carriers under the agents.
//!
//! * [`target`] and [`local`] — the local side: Open vSwitch-style targets
//!   (`tcp:`, `unix:`, `ptcp:`, `punix:`) and the plain streams to OVS and the
//!   controller (OVS's `lib/stream`).
//! * [`tls`], [`identity`], [`pki`] — mutual TLS 1.3: loading PEM credentials,
//!   naming peers by certificate, issuing certificates ([`ovs_pki`]:
//!   importing `ovs-pki`'s); [`rotation`] —
//!   reading them again on SIGHUP and when they change on disk.
//! * [`quic`] — quinn endpoints with quicsdn's transport settings;
//!   [`loss_tolerant_bbr`] — a loss-tolerant congestion controller (`bbr-lt`, the proxy's default);
//!   [`resumption`] — the server's TLS session store behind 0-RTT;
//!   [`keylog`] — TLS secrets for Wireshark (`SSLKEYLOGFILE`, `snoop --keylog`);
//!   [`liveness`] — the grace period kept when QUIC's idle timer waits longer.
//! * [`backoff`] — OVS-like reconnect backoff with jitter (pure);
//!   [`shutdown`] — the stop signal of a process's tasks.

pub mod backoff;
pub mod files;
pub mod identity;
pub mod keylog;
pub mod liveness;
pub mod local;
pub mod loss_tolerant_bbr;
pub mod no_ecn;
pub mod ovs_pki;
pub mod pki;
pub mod quic;
pub mod quic_lb;
pub mod resumption;
pub mod reuseport;
pub mod roster;
pub mod rotation;
pub mod shutdown;
pub mod tapped;
pub mod target;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use target::Target;
