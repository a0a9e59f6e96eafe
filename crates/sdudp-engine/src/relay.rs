//! The retransmission engine of one switch, attached to it through one port:
//! frames of SDUDP flows that OpenFlow rules steer to the port go into
//! [`Engine`]; what it sends goes back out of the port, addressed (Ethernet)
//! to the neighbouring engine it is for.
//!
//! A relay has two neighbours on the line, left and right. Which of them is a
//! flow's upstream it learns from the first frame of the flow (the source MAC
//! of a datagram or probe is its upstream engine's; of a feedback, its
//! downstream engine's).

use crate::frame::{self, Incoming, Mac, Ports};
use crate::packet::FrameIo;
use quicsdn_sdudp::engine::Output;
use quicsdn_sdudp::{Direction, Engine, EngineEvent, FlowKey};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// A neighbouring engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub ip: Ipv4Addr,
    pub mac: Mac,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }
}

/// Counters of the driver itself.
#[derive(Debug, Clone, Default)]
pub struct DriverStats {
    pub frames_in: u64,
    pub frames_out: u64,
    /// Frames that were not SDUDP traffic for this engine.
    pub other: u64,
    /// SDUDP frames from a MAC that is neither neighbour.
    pub stranger: u64,
    pub malformed: u64,
}

pub struct Relay<Io: FrameIo> {
    io: Io,
    pub engine: Engine,
    me: Neighbour,
    left: Neighbour,
    right: Neighbour,
    ports: Ports,
    upstream: HashMap<FlowKey, Side>,
    /// Orientation entries to forget after the engine forgot their flow.
    forget: Vec<(Instant, FlowKey)>,
    pub stats: DriverStats,
}

impl<Io: FrameIo> Relay<Io> {
    pub fn new(
        io: Io,
        engine: Engine,
        me: Neighbour,
        left: Neighbour,
        right: Neighbour,
        ports: Ports,
    ) -> Relay<Io> {
        Relay {
            io,
            engine,
            me,
            left,
            right,
            ports,
            upstream: HashMap::new(),
            forget: Vec::new(),
            stats: DriverStats::default(),
        }
    }

    fn side_of(&self, mac: Mac) -> Option<Side> {
        if mac == self.left.mac {
            Some(Side::Left)
        } else if mac == self.right.mac {
            Some(Side::Right)
        } else {
            None
        }
    }

    fn neighbour(&self, side: Side) -> Neighbour {
        match side {
            Side::Left => self.left,
            Side::Right => self.right,
        }
    }

    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.stats.frames_in += 1;
        let (src, incoming) = frame::classify(frame, self.me.ip, &self.ports);
        let from = match incoming {
            Incoming::Other => {
                self.stats.other += 1;
                return;
            }
            Incoming::Malformed(why) => {
                self.stats.malformed += 1;
                if self.stats.malformed <= 10 {
                    tracing::warn!(%src, "malformed SDUDP frame: {why}");
                }
                return;
            }
            _ => match self.side_of(src) {
                Some(s) => s,
                None => {
                    self.stats.stranger += 1;
                    return;
                }
            },
        };
        match incoming {
            Incoming::Data { flow, id, payload } => {
                self.upstream.entry(flow).or_insert(from);
                self.engine.handle_data(now, flow, id, payload);
            }
            Incoming::Control(c) => {
                // Downstream-bound messages come from the flow's upstream.
                let up = match c.direction() {
                    Direction::Downstream => from,
                    Direction::Upstream => from.other(),
                };
                self.upstream.entry(c.flow()).or_insert(up);
                self.engine.handle_control(now, c);
            }
            Incoming::Other | Incoming::Malformed(_) => unreachable!(),
        }
    }

    /// Sends everything the engine has to send.
    pub fn flush(&mut self, now: Instant) -> std::io::Result<()> {
        while let Some(o) = self.engine.poll_output() {
            let (flow, direction) = match &o {
                Output::Data { flow, .. } => (*flow, Direction::Downstream),
                Output::Control(c) => (c.flow(), c.direction()),
            };
            let Some(&up) = self.upstream.get(&flow) else {
                // Only possible for a flow never seen here.
                continue;
            };
            let side = match direction {
                Direction::Upstream => up,
                Direction::Downstream => up.other(),
            };
            let to = self.neighbour(side);
            let f = match o {
                Output::Data { flow, id, payload } => {
                    frame::data_frame(to.mac, self.me.mac, flow, id, &payload)
                }
                Output::Control(c) => frame::control_frame(
                    (to.mac, to.ip),
                    (self.me.mac, self.me.ip),
                    self.ports.control,
                    &c,
                ),
            };
            self.io.send(&f)?;
            self.stats.frames_out += 1;
        }
        let linger = self.engine.config().linger;
        while let Some(e) = self.engine.poll_event() {
            let flow = match e {
                EngineEvent::FlowDone { flow } => flow,
                EngineEvent::FlowFailed { flow, reason } => {
                    tracing::warn!(%flow, ?reason, "flow failed");
                    flow
                }
            };
            // Keep the orientation while the engine still answers late frames.
            self.forget.push((now + linger * 2, flow));
        }
        let upstream = &mut self.upstream;
        self.forget.retain(|(t, flow)| {
            if *t <= now {
                upstream.remove(flow);
                false
            } else {
                true
            }
        });
        Ok(())
    }

    /// One round: waits for frames or the engine's next timer (at most
    /// `max_wait`), handles everything that arrived, fires due timers, sends.
    pub fn step(&mut self, buf: &mut [u8], max_wait: Duration) -> std::io::Result<()> {
        let now = Instant::now();
        let wait = self
            .engine
            .poll_timeout()
            .map_or(max_wait, |t| t.saturating_duration_since(now).min(max_wait));
        self.io.wait(wait)?;
        let mut now = Instant::now();
        // Handle a batch, then let timers and output run.
        for _ in 0..256 {
            match self.io.recv(buf)? {
                Some(n) => {
                    let frame = buf[..n].to_vec();
                    self.handle_frame(now, &frame);
                }
                None => break,
            }
            now = Instant::now();
        }
        self.engine.handle_timeout(now);
        self.flush(now)
    }

    /// The counters as JSON.
    pub fn stats_json(&self) -> serde_json::Value {
        let s = self.engine.stats();
        serde_json::json!({
            "engine": {
                "forwarded": s.forwarded,
                "retransmitted": s.retransmitted,
                "window_reductions": s.window_reductions,
                "nacks": s.nacks,
                "nack_repeats": s.nack_repeats,
                "requested": s.requested,
                "feedbacks": s.feedbacks,
                "probes": s.probes,
                "duplicates": s.duplicates,
                "beyond_window": s.beyond_window,
                "flows_active": self.engine.flows(),
                "flows_done": s.flows_done,
                "flows_failed": s.flows_failed,
                "flows_refused": s.flows_refused,
                "late": s.late,
                "max_held": s.max_held,
                "held": self.engine.held(),
            },
            "driver": {
                "frames_in": self.stats.frames_in,
                "frames_out": self.stats.frames_out,
                "other": self.stats.other,
                "stranger": self.stats.stranger,
                "malformed": self.stats.malformed,
            }
        })
    }
}
