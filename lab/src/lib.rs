//! `quicsdn-lab`: a one-command emulated SDN testbed on one Linux machine.
//!
//! Real Open vSwitch 3.1 instances (userspace datapath, one per network
//! namespace), real controllers (os-ken, Ryu, Faucet) in their own namespace,
//! hosts attached by veth, and one control link per switch. The building
//! blocks are public so that tests (and the quicsdn agents' end-to-end tests)
//! can assemble their own setups:
//!
//! * [`netns`]: create/delete namespaces, run commands inside, veth pairs, counters;
//! * [`openflow_peer`]: a minimal OpenFlow 1.3 controller for tests and benchmarks;
//! * [`ovs`]: start an OVS instance inside a namespace and drive it with
//!   `ovs-vsctl`/`ovs-ofctl`/`ovs-appctl`; bridges, ports, controllers;
//! * [`host`]: attach a host namespace to a bridge; ping;
//! * [`controller`]: run os-ken/Ryu/Faucet from their pinned venvs;
//! * [`pki`]: a throw-away CA and certificates (quicsdn's own PKI);
//! * [`emulator`]: the native link emulator (delay, jitter, loss, rate, exact
//!   per-class accounting) behind every control link;
//! * [`control_link`]: the switch-to-controller links;
//! * [`transport`]: `tcp`, `tls` and `quic`; [`agents`] runs the quicsdn agents;
//! * [`testbed`]: one switch, one lossy control link, tcp or the agents, for a
//!   test's or benchmark's own controller program;
//! * [`topology`]: `up`/`down`/`status` of a whole lab, recorded in [`state`];
//! * [`process`], [`wait`], [`cmd`]: processes by recorded PID, bounded
//!   polling, running tools with useful errors;
//! * [`demo`]: the same workload over `tcp` and `quic`, side by side;
//! * [`bench`]: benchmark commands (they print numbers; tests never time things);
//! * [`balancer`]: a QUIC-LB load balancer in front of several controller agents.
//!
//! Everything here needs root.

pub mod agent_metrics;
pub mod agents;
pub mod balancer;
pub mod bench;
pub mod cmd;
pub mod control_link;
pub mod controller;
pub mod demo;
pub mod emulator;
pub mod fileset;
pub mod host;
pub mod multihomed;
pub mod multihomed_cmd;
pub mod netns;
pub mod openflow_peer;
pub mod ovs;
pub mod pki;
pub mod process;
pub mod state;
pub mod testbed;
pub mod topology;
pub mod transport;
pub mod wait;
