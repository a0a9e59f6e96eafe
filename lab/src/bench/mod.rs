//! Benchmark commands: `quicsdn-lab bench NAME`. They print numbers and write
//! results; tests check delivery and schemas, never speed.
//!
//! * [`bicast`]: the bicast paper's Fig. 8 on the multihomed lab
//!   ([`crate::multihomed`]); [`control_bicast`]: the control channel itself
//!   over two paths against one (ECHO and flow-install delay).
//! * [`relay`]: the agents against direct TCP on loopback; [`proxy`]: bulk
//!   throughput through the TCP↔QUIC proxy pair against direct TCP.
//! * [`overhead`], [`delay`], [`table1`]: the quicSDN papers' evaluation over an
//!   emulated control link, comparing tcp, tls, quic, quic rr:16 and kcptun;
//!   [`model`] is the papers' analytical model; [`report`] gathers results.
//! * [`table2`]: the OpenFlow-over-UDP paper's Table 2 (echo, FLOW_MOD and
//!   stats latency; tcp, quic, udp-seed, udp-robust; loss and delay).
//! * [`hol`]: head-of-line blocking with real OVS (tcp, quic ordered, quic safe).
//! * [`migration`], [`reconnect`]: issue 6's measurements with real OVS: the
//!   control session across a re-addressed switch, and the time to the first
//!   OpenFlow message after a reconnect.
//! * [`stall`], [`soak`]: issue 17's bounded memory under a stalled peer, and
//!   the fault soak with a message audit (real OVS, os-ken, the agents).
//! * [`sdudp`]: the SDUDP paper's §IV (Figs. 7–11, Table 2), SDUDP against
//!   TCP over a line of real OVS switches.
//! * [`storm`]: a controller-agent restart under hundreds of switches
//!   (reconnect storm, handshake admission control).
//!
//! Shared pieces: [`pair`] (two namespaces, one emulated link, one transport),
//! [`synth`] (the synthetic switch and controller programs), [`cell`] (one
//! measurement), [`out`] (CSV, markdown, plots).

pub mod bicast;
pub mod cell;
pub mod control_bicast;
pub mod delay;
pub mod hol;
pub mod migration;
pub mod model;
pub mod modelcmd;
pub mod out;
pub mod overhead;
pub mod pair;
pub mod proxy;
pub mod reconnect;
pub mod relay;
pub mod report;
pub mod sdudp;
pub mod soak;
pub mod stall;
pub mod stats;
pub mod storm;
pub mod synth;
pub mod table1;
pub mod table2;
pub mod tuning;
