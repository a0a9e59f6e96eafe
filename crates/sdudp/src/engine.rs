//! The retransmission engine of one switch (paper §III-B2): for every flow
//! that crosses it, a [`HopReceiver`] facing the previous engine feeds a
//! [`HopSender`] facing the next one, through one buffer bounded by
//! [`Config::capacity`].
//!
//! The engine grants the previous engine a window of `capacity` datagrams
//! counted from the first one the next engine has not released yet, so
//! everything it holds for a flow (forwarded and unreleased, waiting, out of
//! order) never exceeds `capacity`. When the next engine stops releasing, the
//! window stops opening, the previous engine's buffer fills, and so on back to
//! the sending edge, which then stops reading from its host: backpressure
//! instead of loss.
//!
//! Edge engines are not built from this type: their flows begin and end in a
//! [`crate::Connection`].

use crate::Config;
use crate::hop::{HopReceiver, HopSender};
use crate::msg::{Control, Direction, FailReason, FlowKey, is_final};
use crate::seq::id_of;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Something for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A numbered datagram of `flow`, to the next engine (downstream).
    Data {
        flow: FlowKey,
        id: u16,
        payload: Bytes,
    },
    /// A control message, to the neighbour in [`Control::direction`].
    Control(Control),
}

/// What happened to a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// The flow ended normally: its last message was released downstream.
    FlowDone { flow: FlowKey },
    /// The flow failed here or elsewhere; the failure was passed on.
    FlowFailed { flow: FlowKey, reason: FailReason },
}

/// An engine's counters (sums over its flows, past and present).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Datagrams forwarded the first time.
    pub forwarded: u64,
    /// Datagrams sent again on the next engine's request.
    pub retransmitted: u64,
    /// NACKs sent to the previous engine…
    pub nacks: u64,
    /// …of which repeated a request that went unanswered.
    pub nack_repeats: u64,
    /// Datagram requests in those NACKs.
    pub requested: u64,
    /// FEEDBACK messages sent (releases, window updates and NACKs).
    pub feedbacks: u64,
    pub probes: u64,
    pub duplicates: u64,
    pub beyond_window: u64,
    /// Flows refused because [`Config::max_flows`] were active.
    pub flows_refused: u64,
    pub flows_done: u64,
    pub flows_failed: u64,
    /// Datagrams or control messages of flows this engine finished or failed.
    pub late: u64,
    /// Feedback for flows this engine does not know.
    pub unknown: u64,
    /// Most datagrams one flow held at once.
    pub max_held: usize,
    /// Congestion-window reductions of this engine's senders.
    pub window_reductions: u64,
}

fn add_flow(s: &mut EngineStats, relay: &Relay) {
    let (tx, rx) = (&relay.tx.stats, &relay.rx.stats);
    s.forwarded += tx.sent;
    s.retransmitted += tx.retransmitted;
    s.window_reductions += tx.window_reductions;
    s.probes += tx.probes;
    s.nacks += rx.nacks;
    s.nack_repeats += rx.nack_repeats;
    s.requested += rx.requested;
    s.feedbacks += rx.feedbacks;
    s.duplicates += rx.duplicates;
    s.beyond_window += rx.beyond_window;
}

#[derive(Debug)]
struct Relay {
    rx: HopReceiver,
    tx: HopSender,
    /// With [`Config::cut_through`]: the flow's last message, once it passed.
    final_seq: Option<u64>,
}

impl Relay {
    fn held(&self) -> usize {
        self.rx.held() + self.tx.held()
    }
}

/// A flow this engine finished or failed, remembered for a while.
#[derive(Debug, Clone, Copy)]
struct Gone {
    until: Instant,
    /// For a finished flow: the sequence number after its last message, so a
    /// previous engine that missed the final release is answered.
    end: Option<u64>,
}

/// A switch's retransmission engine.
#[derive(Debug)]
pub struct Engine {
    cfg: Config,
    flows: HashMap<FlowKey, Relay>,
    gone: HashMap<FlowKey, Gone>,
    out: VecDeque<Output>,
    events: VecDeque<EngineEvent>,
    /// Engine-wide counters plus the per-flow counters of retired flows.
    base: EngineStats,
}

impl Engine {
    /// Panics if `cfg` is invalid ([`Config::validate`]).
    pub fn new(cfg: Config) -> Engine {
        if let Err(e) = cfg.validate() {
            panic!("invalid SDUDP config: {e}");
        }
        Engine {
            cfg,
            flows: HashMap::new(),
            gone: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            base: EngineStats::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Active flows.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Datagrams held over all flows.
    pub fn held(&self) -> usize {
        self.flows.values().map(Relay::held).sum()
    }

    /// A numbered datagram of `flow` from the previous engine.
    pub fn handle_data(&mut self, now: Instant, flow: FlowKey, id: u16, payload: Bytes) {
        if !self.admit(now, flow) {
            return;
        }
        let relay = self.flows.get_mut(&flow).expect("admitted");
        relay.rx.on_data(now, id, payload);
        self.pump(now, flow);
    }

    /// A control message from a neighbour.
    pub fn handle_control(&mut self, now: Instant, control: Control) {
        let flow = control.flow();
        match control {
            Control::Feedback {
                cum,
                limit,
                beyond,
                missing,
                ..
            } => match self.flows.get_mut(&flow) {
                Some(relay) => {
                    relay.tx.on_feedback(now, cum, limit, beyond, &missing);
                    self.pump(now, flow);
                }
                None if self.gone.contains_key(&flow) => self.base.late += 1,
                None => self.base.unknown += 1,
            },
            Control::Probe { next, .. } => {
                if !self.admit(now, flow) {
                    return;
                }
                let relay = self.flows.get_mut(&flow).expect("admitted");
                relay.rx.on_probe(now, next);
                self.pump(now, flow);
            }
            Control::Fail { toward, reason, .. } => {
                if self.gone.contains_key(&flow) {
                    // Passed on already (or finished here): stop it.
                    self.base.late += 1;
                    return;
                }
                self.retire(flow);
                self.out.push_back(Output::Control(Control::Fail {
                    flow,
                    toward,
                    reason,
                }));
                self.bury(now, flow, None);
                self.base.flows_failed += 1;
                self.events
                    .push_back(EngineEvent::FlowFailed { flow, reason });
            }
        }
    }

    /// Whether `flow` has state here now (creating it if new and there is room).
    fn admit(&mut self, now: Instant, flow: FlowKey) -> bool {
        if self.flows.contains_key(&flow) {
            return true;
        }
        if let Some(g) = self.gone.get(&flow) {
            self.base.late += 1;
            if let Some(end) = g.end {
                // The previous engine missed our last release: repeat it.
                self.out.push_back(Output::Control(Control::Feedback {
                    flow,
                    cum: id_of(end),
                    limit: id_of(end + u64::from(self.cfg.capacity)),
                    beyond: 0,
                    missing: Vec::new(),
                }));
            }
            return false;
        }
        if self.flows.len() >= self.cfg.max_flows {
            self.base.flows_refused += 1;
            self.out.push_back(Output::Control(Control::Fail {
                flow,
                toward: Direction::Upstream,
                reason: FailReason::NoRoom,
            }));
            self.bury(now, flow, None);
            return false;
        }
        // Every flow starts at sequence number 0, so an engine that first hears
        // of a flow from a later datagram or a probe requests the ones before.
        self.flows.insert(
            flow,
            Relay {
                rx: if self.cfg.cut_through {
                    HopReceiver::cut_through(flow, &self.cfg)
                } else {
                    HopReceiver::new(flow, &self.cfg)
                },
                tx: HopSender::new(flow, &self.cfg, now),
                final_seq: None,
            },
        );
        true
    }

    /// Forgets a flow's state, keeping its counters.
    fn retire(&mut self, flow: FlowKey) {
        if let Some(relay) = self.flows.remove(&flow) {
            add_flow(&mut self.base, &relay);
        }
    }

    /// Counters: engine-wide, and summed over past and present flows.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.base.clone();
        for relay in self.flows.values() {
            add_flow(&mut s, relay);
        }
        s
    }

    fn bury(&mut self, now: Instant, flow: FlowKey, end: Option<u64>) {
        self.gone.insert(
            flow,
            Gone {
                until: now + self.cfg.linger,
                end,
            },
        );
    }

    /// Moves in-order datagrams on, collects what is to be sent, and retires
    /// the flow if it is done or failed.
    fn pump(&mut self, now: Instant, flow: FlowKey) {
        let Some(relay) = self.flows.get_mut(&flow) else {
            return;
        };
        // By the window this engine granted, the sender always has room.
        if self.cfg.cut_through {
            while let Some((seq, p)) = relay.rx.take_arrived() {
                if is_final(&p) {
                    relay.final_seq = Some(seq);
                }
                relay.tx.insert(seq, p);
            }
            // Finished once everything up to the last message is here.
            if relay.final_seq.is_some_and(|f| relay.rx.next_seq() > f) {
                relay.rx.finish();
                relay.tx.finish();
            }
        } else {
            while relay.tx.room() > 0 {
                let Some(p) = relay.rx.take_ready() else {
                    break;
                };
                if is_final(&p) {
                    relay.rx.finish();
                    relay.tx.finish();
                }
                relay.tx.push(p);
            }
        }
        relay.rx.set_base(relay.tx.base());
        self.base.max_held = self.base.max_held.max(relay.held());
        while let Some((id, payload)) = relay.tx.poll_transmit(now) {
            self.out.push_back(Output::Data { flow, id, payload });
        }
        while let Some(c) = relay.rx.poll_control(now) {
            self.out.push_back(Output::Control(c));
        }
        while let Some(c) = relay.tx.poll_control(now) {
            self.out.push_back(Output::Control(c));
        }
        if relay.rx.failed() || relay.tx.failed() {
            self.retire(flow);
            // Tell both ends' edges, as far as the path still reaches.
            for toward in [Direction::Upstream, Direction::Downstream] {
                self.out.push_back(Output::Control(Control::Fail {
                    flow,
                    toward,
                    reason: FailReason::Silent,
                }));
            }
            self.bury(now, flow, None);
            self.base.flows_failed += 1;
            self.events.push_back(EngineEvent::FlowFailed {
                flow,
                reason: FailReason::Silent,
            });
        } else if relay.tx.is_done() {
            let end = relay.rx.next_seq();
            self.retire(flow);
            self.bury(now, flow, Some(end));
            self.base.flows_done += 1;
            self.events.push_back(EngineEvent::FlowDone { flow });
        }
    }

    /// When [`Self::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let flows = self
            .flows
            .values()
            .flat_map(|r| [r.rx.poll_timeout(), r.tx.poll_timeout()])
            .flatten();
        let gone = self.gone.values().map(|g| g.until);
        flows.chain(gone).min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.gone.retain(|_, g| g.until > now);
        let due: Vec<FlowKey> = self
            .flows
            .iter()
            .filter(|(_, r)| {
                [r.rx.poll_timeout(), r.tx.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .any(|t| t <= now)
            })
            .map(|(k, _)| *k)
            .collect();
        for flow in due {
            if let Some(relay) = self.flows.get_mut(&flow) {
                relay.rx.handle_timeout(now);
                relay.tx.handle_timeout(now);
            }
            self.pump(now, flow);
        }
    }

    /// The next thing to send.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }
}
