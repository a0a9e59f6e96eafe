//! One reliable message channel: a [`Sender`] for what this side sends on it
//! and a [`Receiver`] for what the peer sends, each following the channel's
//! [`Profile`].
//!
//! Packets carry one message (seed), or one fragment of a message or several
//! whole messages (robust), and are numbered from 1 per channel and direction.
//! The receiver hands the application [`Chunk`]s: a seed receiver one per
//! datagram as it arrives, a robust receiver each packet's payload in order,
//! flagged where a message ends.

use crate::packet::{self, DATA_HEADER_LEN, MAX_RANGES, Packet};
use crate::{Config, Profile, SEED_DUP_WINDOW, SEED_MAX_RETRANSMITS, SEED_RTO};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// What a message is to the agents: session data, its end, or an abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    Data,
    /// The sender's local peer closed its side: no more data follows.
    Fin,
    /// The sender gave up the session; the payload says why.
    Abort,
}

impl MessageKind {
    pub(crate) fn bits(self) -> u8 {
        match self {
            MessageKind::Data => 0,
            MessageKind::Fin => 1,
            MessageKind::Abort => 2,
        }
    }

    pub(crate) fn from_bits(b: u8) -> Option<MessageKind> {
        match b {
            0 => Some(MessageKind::Data),
            1 => Some(MessageKind::Fin),
            2 => Some(MessageKind::Abort),
            _ => None,
        }
    }
}

/// A message handed to [`crate::Association::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: MessageKind,
    pub payload: Vec<u8>,
}

/// What the receiver hands the application: a whole message (seed), or in
/// order a fragment of one or several whole messages back to back (robust);
/// `end` marks a chunk that ends a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub kind: MessageKind,
    /// Sequence number of the packet that carried it.
    pub seq: u32,
    pub payload: Vec<u8>,
    pub end: bool,
}

/// Counters of one channel, both directions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelStats {
    pub messages_sent: u64,
    pub packets_sent: u64,
    pub retransmits: u64,
    /// Seed: messages given up after [`SEED_MAX_RETRANSMITS`] retransmissions
    /// without an acknowledgement (lost, or their acknowledgements were).
    pub given_up: u64,
    pub packets_received: u64,
    pub duplicates: u64,
    /// Packets that arrived after a packet sent later than them.
    pub out_of_order: u64,
    /// Robust: packets dropped because the receive buffer was full.
    pub dropped_full: u64,
    pub srtt: Option<Duration>,
    pub rto: Duration,
    pub cwnd: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Unsent,
    InFlight,
    /// Deemed lost, waiting to be sent again.
    Lost,
}

#[derive(Debug)]
struct SentPacket {
    payload: Vec<u8>,
    first: bool,
    last: bool,
    kind: MessageKind,
    sent_at: Option<Instant>,
    /// Order of its latest transmission among all of the sender's transmissions
    /// (`stats.packets_sent` then): what loss detection compares, since a
    /// retransmission keeps its `seq`.
    sent_order: u64,
    transmissions: u32,
    state: State,
}

/// RFC 6298's estimator, in its own names.
#[derive(Debug, Clone)]
struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
    /// RTO before backoff.
    base: Duration,
}

/// RFC 6298 §2: "G" — our clock granularity.
const G: Duration = Duration::from_millis(1);

impl Rtt {
    fn new() -> Rtt {
        // RFC 6298 (2.1): "Until a round-trip time (RTT) measurement has been made
        // for a segment sent between the sender and receiver, the sender SHOULD set
        // RTO <- 1 second".
        Rtt {
            srtt: None,
            rttvar: Duration::ZERO,
            base: Duration::from_secs(1),
        }
    }

    fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                // RFC 6298 (2.2): "SRTT <- R, RTTVAR <- R/2, RTO <- SRTT + max (G, K*RTTVAR)
                // where K = 4."
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                // RFC 6298 (2.3): "RTTVAR <- (1 - beta) * RTTVAR + beta * |SRTT - R'|,
                // SRTT <- (1 - alpha) * SRTT + alpha * R'" with alpha=1/8, beta=1/4;
                // RTTVAR first, with the old SRTT.
                let diff = srtt.abs_diff(r);
                self.rttvar = self.rttvar * 3 / 4 + diff / 4;
                self.srtt = Some(srtt * 7 / 8 + r / 8);
            }
        }
        self.base = self.srtt.expect("set above") + G.max(self.rttvar * 4);
    }
}

/// The sending half of a channel.
#[derive(Debug)]
pub(crate) struct Sender {
    profile: Profile,
    /// Robust sessions: a message queued behind others joins the last unsent
    /// packet if it fits (see [`Sender::push`]).
    coalesce: bool,
    max_payload: usize,
    max_retransmits: u32,
    min_rto: Duration,
    max_rto: Duration,
    next_seq: u32,
    packets: BTreeMap<u32, SentPacket>,
    unsent: VecDeque<u32>,
    lost: BTreeSet<u32>,
    /// Packets in flight (sent, not acknowledged, not deemed lost).
    pipe: u32,
    /// Highest `seq` ever transmitted (the unsent ones above it do not count).
    highest_sent: u32,
    /// Last seq of each message not yet fully acknowledged, in order.
    message_ends: VecDeque<u32>,
    /// Messages fully acknowledged (or given up) since the last call to
    /// [`Sender::take_released`].
    released: u64,
    // Seed: one timer per packet.
    timers: BTreeSet<(Instant, u32)>,
    // Robust: RFC 6298 timer, RFC 5681 congestion control.
    rtt: Rtt,
    backoff: u32,
    rto_deadline: Option<Instant>,
    /// Tail loss probe (RFC 8985 §7): one probe before the RTO when the tail of
    /// what was sent goes unacknowledged.
    probe_deadline: Option<Instant>,
    probed: bool,
    ack_delay: Duration,
    cwnd: u32,
    /// Congestion avoidance: acknowledged packets towards the next cwnd increase.
    cwnd_acc: u32,
    ssthresh: u32,
    /// No further window reduction until this seq is acknowledged (RFC 6582's
    /// "recover").
    recovery: Option<u32>,
    /// In fast recovery (not after a timeout, which slow-starts): the window
    /// does not grow.
    fast_recovery: bool,
    peer_window: u32,
    /// `sent_order` of the latest transmission acknowledged so far.
    largest_acked_order: u64,
    pub(crate) failed: Option<String>,
    pub(crate) stats: ChannelStats,
}

/// RFC 6928: an initial window of up to 10 segments.
const INITIAL_WINDOW: u32 = 10;
/// Packet reordering threshold for loss detection (RFC 9002 §6.1.1's
/// kPacketThreshold, the SACK form of RFC 5681's three duplicate ACKs).
const PACKET_THRESHOLD: u64 = 3;

impl Sender {
    /// `coalesce`: whether messages may share a packet; not where the receiver
    /// reads each chunk as one message (the control channel's JSON).
    pub(crate) fn new(profile: Profile, config: &Config, coalesce: bool) -> Sender {
        Sender {
            profile,
            coalesce: coalesce && profile == Profile::Robust,
            max_payload: config.max_datagram.saturating_sub(DATA_HEADER_LEN).max(1),
            max_retransmits: config.max_retransmits,
            min_rto: config.min_rto,
            max_rto: config.max_rto,
            next_seq: 1,
            packets: BTreeMap::new(),
            unsent: VecDeque::new(),
            lost: BTreeSet::new(),
            pipe: 0,
            highest_sent: 0,
            message_ends: VecDeque::new(),
            released: 0,
            timers: BTreeSet::new(),
            rtt: Rtt::new(),
            backoff: 0,
            rto_deadline: None,
            probe_deadline: None,
            probed: false,
            ack_delay: config.ack_delay,
            cwnd: INITIAL_WINDOW,
            cwnd_acc: 0,
            // RFC 5681 §3.1: "The initial value of ssthresh SHOULD be set arbitrarily
            // high (e.g., to the size of the largest possible advertised window)".
            ssthresh: u32::MAX,
            recovery: None,
            fast_recovery: false,
            peer_window: config.recv_window,
            largest_acked_order: 0,
            failed: None,
            stats: ChannelStats::default(),
        }
    }

    /// The current RTO, backoff included.
    fn rto(&self) -> Duration {
        match self.profile {
            Profile::Seed => SEED_RTO,
            Profile::Robust => {
                let base = self.rtt.base.clamp(self.min_rto, self.max_rto);
                // RFC 6298 (5.5): "The host MUST set RTO <- RTO * 2 ("back off the timer")."
                base.saturating_mul(1 << self.backoff.min(16))
                    .min(self.max_rto)
            }
        }
    }

    /// RFC 8985 §7.2: "PTO = 2 * SRTT", plus the peer's delayed-ACK allowance
    /// when a single packet may wait for it, at least 10 ms; none before the
    /// first RTT sample. Never later than the RTO.
    fn pto(&self) -> Option<Duration> {
        let srtt = self.rtt.srtt?;
        let pto = (srtt * 2 + self.ack_delay).max(Duration::from_millis(10));
        (pto < self.rto()).then_some(pto)
    }

    /// Queues a message; errors if one datagram cannot carry it under seed.
    ///
    /// Robust sessions: a data message that fits in the last queued packet, still
    /// unsent and holding whole data messages, joins it. That happens only while
    /// the window holds packets back (an open window sends each message as it is
    /// queued), so nothing waits longer than it would have; a backlog then leaves
    /// in full packets, as TCP's does, and the congestion window, which counts
    /// packets, carries as many bytes as TCP's. The receiver hands the agent one
    /// chunk with the messages' bytes back to back, which is what its local byte
    /// stream needs.
    pub(crate) fn push(&mut self, kind: MessageKind, payload: Vec<u8>) -> Result<(), String> {
        if self.coalesce
            && kind == MessageKind::Data
            && let Some(&tail) = self.unsent.back()
            && let Some(p) = self.packets.get_mut(&tail)
            && p.kind == MessageKind::Data
            && p.first
            && p.last
            && p.payload.len() + payload.len() <= self.max_payload
        {
            p.payload.extend_from_slice(&payload);
            // Its end is the tail packet's: released when that is acknowledged.
            self.message_ends.push_back(tail);
            self.stats.messages_sent += 1;
            return Ok(());
        }
        let chunks: Vec<Vec<u8>> = match self.profile {
            Profile::Seed => {
                // One message per datagram, as the paper does; IP fragments larger
                // ones, up to what one UDP datagram can carry.
                if payload.len() > MAX_UDP_PAYLOAD - DATA_HEADER_LEN {
                    return Err(format!(
                        "a {}-byte message does not fit in one UDP datagram (the seed profile sends one message per datagram, at most {} bytes)",
                        payload.len(),
                        MAX_UDP_PAYLOAD - DATA_HEADER_LEN
                    ));
                }
                vec![payload]
            }
            Profile::Robust if payload.is_empty() => vec![payload],
            Profile::Robust => payload
                .chunks(self.max_payload)
                .map(|c| c.to_vec())
                .collect(),
        };
        let n = chunks.len();
        if self.next_seq.checked_add(n as u32 + 1).is_none() {
            return Err("sequence numbers exhausted (2^32 packets); reconnect".into());
        }
        for (i, payload) in chunks.into_iter().enumerate() {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.packets.insert(
                seq,
                SentPacket {
                    payload,
                    first: i == 0,
                    last: i + 1 == n,
                    kind,
                    sent_at: None,
                    sent_order: 0,
                    transmissions: 0,
                    state: State::Unsent,
                },
            );
            self.unsent.push_back(seq);
        }
        self.message_ends.push_back(self.next_seq - 1);
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Messages queued or in flight, not yet acknowledged.
    pub(crate) fn outstanding_messages(&self) -> usize {
        self.message_ends.len()
    }

    pub(crate) fn take_released(&mut self) -> u64 {
        std::mem::take(&mut self.released)
    }

    fn window(&self) -> u32 {
        match self.profile {
            Profile::Seed => u32::MAX,
            // RFC 5681 §2: the sender may have in flight the minimum of cwnd and rwnd.
            // One packet always, so a closed receive window is probed.
            Profile::Robust => self.cwnd.min(self.peer_window).max(1),
        }
    }

    /// The next DATA packet to send, if the window allows one.
    pub(crate) fn poll_transmit(&mut self, now: Instant, id: u32, channel: u16) -> Option<Vec<u8>> {
        if self.failed.is_some() || self.pipe >= self.window() {
            return None;
        }
        let seq = match self.lost.pop_first() {
            Some(seq) => seq,
            None => self.unsent.pop_front()?,
        };
        let rto = self.rto();
        let pto = self.pto();
        let p = self.packets.get_mut(&seq).expect("queued packets exist");
        if p.transmissions > 0 {
            self.stats.retransmits += 1;
        }
        p.transmissions += 1;
        p.sent_at = Some(now);
        self.stats.packets_sent += 1;
        // Every transmission is counted there: its count is the order.
        p.sent_order = self.stats.packets_sent;
        self.highest_sent = self.highest_sent.max(seq);
        p.state = State::InFlight;
        self.pipe += 1;
        match self.profile {
            Profile::Seed => {
                self.timers.insert((now + rto, seq));
            }
            Profile::Robust => {
                // RFC 6298 (5.1): "Every time a packet containing data is sent
                // (including a retransmission), if the timer is not running, start it
                // running so that it will expire after RTO seconds".
                if self.rto_deadline.is_none() {
                    self.rto_deadline = Some(now + rto);
                }
                if !self.probed {
                    self.probe_deadline = pto.map(|pto| now + pto);
                }
            }
        }
        Some(packet::encode(
            id,
            &Packet::Data {
                channel,
                seq,
                first: p.first,
                last: p.last,
                kind: p.kind,
                payload: &p.payload,
            },
        ))
    }

    /// True if a packet is waiting and the window would let it go.
    pub(crate) fn wants_to_send(&self) -> bool {
        self.failed.is_none()
            && (!self.lost.is_empty() || !self.unsent.is_empty())
            && self.pipe < self.window()
    }

    fn remove(&mut self, seq: u32) -> Option<SentPacket> {
        let p = self.packets.get(&seq)?;
        if p.state == State::Unsent {
            // A peer acknowledging what was never sent: ignore.
            return None;
        }
        let p = self.packets.remove(&seq).expect("present");
        match p.state {
            State::InFlight => self.pipe -= 1,
            State::Lost => {
                self.lost.remove(&seq);
            }
            State::Unsent => unreachable!(),
        }
        if self.profile == Profile::Seed
            && let Some(at) = p.sent_at
        {
            self.timers.remove(&(at + SEED_RTO, seq));
        }
        Some(p)
    }

    /// Counts messages whose packets have all left the send buffer.
    fn release(&mut self) {
        let una = self
            .packets
            .first_key_value()
            .map_or(self.next_seq, |(s, _)| *s);
        while self.message_ends.front().is_some_and(|&end| end < una) {
            self.message_ends.pop_front();
            self.released += 1;
        }
    }

    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        cumulative: u32,
        window: u16,
        ranges: &[(u32, u32)],
    ) {
        let before_pipe = self.pipe;
        let mut acked: Vec<(u32, SentPacket)> = Vec::new();
        let below: Vec<u32> = self.packets.range(..cumulative).map(|(s, _)| *s).collect();
        for seq in below {
            if let Some(p) = self.remove(seq) {
                acked.push((seq, p));
            }
        }
        for &(s, e) in ranges {
            let inside: Vec<u32> = self.packets.range(s..e).map(|(s, _)| *s).collect();
            for seq in inside {
                if let Some(p) = self.remove(seq) {
                    acked.push((seq, p));
                }
            }
        }
        self.peer_window = u32::from(window);
        self.release();
        if self.profile == Profile::Seed || acked.is_empty() {
            return;
        }
        // RFC 6298 §3 (Karn): "RTT samples MUST NOT be made using segments that were
        // retransmitted (and thus for which it is ambiguous whether the reply was
        // for the first instance of the packet or a later instance)." Sample the
        // newest packet this ACK covers.
        if let Some(sent) = acked
            .iter()
            .filter(|(_, p)| p.transmissions == 1)
            .filter_map(|(_, p)| p.sent_at)
            .max()
        {
            self.rtt.sample(now.saturating_duration_since(sent));
            self.backoff = 0;
        }
        let newest = acked
            .iter()
            .map(|(_, p)| p.sent_order)
            .max()
            .expect("non-empty");
        self.largest_acked_order = self.largest_acked_order.max(newest);
        let una = self
            .packets
            .first_key_value()
            .map_or(self.next_seq, |(s, _)| *s);
        if let Some(recover) = self.recovery
            && una > recover
        {
            // RFC 6582 §3.2 (5): a full acknowledgement ends fast recovery.
            self.recovery = None;
            self.fast_recovery = false;
        }
        if !self.fast_recovery {
            for _ in 0..acked.len() {
                if self.cwnd < self.ssthresh {
                    // RFC 5681 §3.1 (2): during slow start "cwnd += min (N, SMSS)": one
                    // packet per packet acknowledged.
                    self.cwnd = self.cwnd.saturating_add(1);
                } else {
                    // RFC 5681 §3.1 (3): congestion avoidance, "cwnd += SMSS*SMSS/cwnd":
                    // one packet per window acknowledged.
                    self.cwnd_acc += 1;
                    if self.cwnd_acc >= self.cwnd {
                        self.cwnd_acc = 0;
                        self.cwnd = self.cwnd.saturating_add(1);
                    }
                }
            }
        }
        // Loss detection, RFC 9002 §6.1.1: "The packet ... was sent kPacketThreshold
        // packets before an acknowledged packet". Sent, not numbered: a
        // retransmission keeps its seq, and comparing seqs would declare it lost
        // again on every ACK of newer data, long before it could arrive. (An ACK
        // of a retransmitted packet counts its latest transmission; if the first
        // one arrived instead, packets sent in between may be resent early.)
        let threshold = self.largest_acked_order.saturating_sub(PACKET_THRESHOLD);
        let lost: Vec<u32> = self
            .packets
            .iter()
            .filter(|(_, p)| p.state == State::InFlight && p.sent_order <= threshold)
            .map(|(s, _)| *s)
            .collect();
        if !lost.is_empty() {
            for seq in &lost {
                self.mark_lost(*seq);
            }
            if self.recovery.is_none() {
                // RFC 5681 §3.2 (4): "ssthresh = max (FlightSize / 2, 2*SMSS)", and
                // (6) "cwnd = ssthresh" (NewReno, RFC 6582, reduces once per window).
                self.ssthresh = (before_pipe / 2).max(2);
                self.cwnd = self.ssthresh;
                self.cwnd_acc = 0;
                // RFC 6582 §3.2 (2): "recover" is "the highest sequence number
                // transmitted"; queued packets were not.
                self.recovery = Some(self.highest_sent);
                self.fast_recovery = true;
            }
        }
        // RFC 6298 (5.2): "When all outstanding data has been acknowledged, turn off
        // the retransmission timer." (5.3): "When an ACK is received that
        // acknowledges new data, restart the retransmission timer so that it will
        // expire after RTO seconds (for the current value of RTO)."
        self.rto_deadline = if self.pipe == 0 && self.lost.is_empty() {
            None
        } else {
            Some(now + self.rto())
        };
        self.probed = false;
        self.probe_deadline = if self.pipe == 0 {
            None
        } else {
            self.pto().map(|pto| now + pto)
        };
    }

    fn mark_lost(&mut self, seq: u32) {
        let p = self.packets.get_mut(&seq).expect("present");
        if p.state == State::InFlight {
            p.state = State::Lost;
            self.pipe -= 1;
            self.lost.insert(seq);
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.failed.is_some() {
            return None;
        }
        match self.profile {
            Profile::Seed => self.timers.first().map(|(t, _)| *t),
            Profile::Robust => match (self.rto_deadline, self.probe_deadline) {
                (Some(r), Some(p)) => Some(r.min(p)),
                (r, p) => r.or(p),
            },
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self.profile {
            Profile::Seed => {
                while let Some(&(t, seq)) = self.timers.first() {
                    if t > now {
                        break;
                    }
                    self.timers.pop_first();
                    let p = self.packets.get(&seq).expect("timed packets exist");
                    // The paper's loop: retransmit while `count < MAX_RETRANSMITS`,
                    // else `del self._pending_msgs[xid]`: the message is given up.
                    if p.transmissions > SEED_MAX_RETRANSMITS {
                        self.remove(seq);
                        self.stats.given_up += 1;
                    } else {
                        self.mark_lost(seq);
                    }
                }
                self.release();
            }
            Profile::Robust => {
                if let Some(p) = self.probe_deadline
                    && p <= now
                    && self.rto_deadline.is_some_and(|r| r > now)
                {
                    // RFC 8985 §7.3: "the sender SHOULD transmit ... the highest-sequence
                    // segment sent so far" as a probe; the window is not reduced (a loss
                    // it reveals is then repaired and counted by the ACK it elicits).
                    self.probe_deadline = None;
                    self.probed = true;
                    if let Some(last) = self
                        .packets
                        .iter()
                        .rev()
                        .find(|(_, p)| p.state == State::InFlight)
                        .map(|(s, _)| *s)
                    {
                        self.mark_lost(last);
                    }
                    return;
                }
                let Some(deadline) = self.rto_deadline else {
                    return;
                };
                if deadline > now {
                    return;
                }
                self.probe_deadline = None;
                let Some((&first, p)) = self.packets.iter().find(|(_, p)| p.state != State::Unsent)
                else {
                    self.rto_deadline = None;
                    return;
                };
                // A closed receive window is probed, not given up on: the receiver
                // is alive (it answered with the window) but its application is slow.
                if p.transmissions > self.max_retransmits && self.peer_window > 0 {
                    self.failed = Some(format!(
                        "packet {first} was not acknowledged after {} retransmissions",
                        p.transmissions - 1
                    ));
                    return;
                }
                // RFC 5681 §3.1 (4) on a timeout: "ssthresh = max (FlightSize / 2,
                // 2*SMSS)", and cwnd "MUST be set to no more than the loss window, LW,
                // which equals 1 full-sized segment".
                self.ssthresh = (self.pipe / 2).max(2);
                self.cwnd = 1;
                self.cwnd_acc = 0;
                self.recovery = Some(self.highest_sent);
                self.fast_recovery = false;
                // RFC 6298 (5.4): "Retransmit the earliest segment that has not been
                // acknowledged by the TCP receiver." Everything in flight is resent as
                // the window reopens, earliest first.
                let inflight: Vec<u32> = self
                    .packets
                    .iter()
                    .filter(|(_, p)| p.state == State::InFlight)
                    .map(|(s, _)| *s)
                    .collect();
                for seq in inflight {
                    self.mark_lost(seq);
                }
                // RFC 6298 (5.5): "The host MUST set RTO <- RTO * 2"; (5.6): "Start the
                // retransmission timer, such that it expires after RTO seconds".
                self.backoff += 1;
                self.rto_deadline = Some(now + self.rto());
            }
        }
    }

    pub(crate) fn stats(&self) -> ChannelStats {
        ChannelStats {
            srtt: self.rtt.srtt,
            rto: self.rto(),
            cwnd: self.cwnd,
            ..self.stats.clone()
        }
    }
}

/// The most a UDP datagram over IPv4 can carry (65,535 − 20 − 8).
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// The receiving half of a channel.
#[derive(Debug)]
pub(crate) struct Receiver {
    profile: Profile,
    window: u32,
    ack_delay: Duration,
    // Robust.
    next: u32,
    /// Out-of-order packets, with their FIRST flag.
    buffer: BTreeMap<u32, (bool, Chunk)>,
    /// Fragments of a message being delivered (robust): the first has been seen.
    in_message: bool,
    // Seed: the paper's `_recv_seq_seen` window.
    seen: HashSet<u32>,
    seen_order: VecDeque<u32>,
    highest: u32,
    seed_acks: BTreeSet<u32>,
    // Both.
    ready: VecDeque<Chunk>,
    ack_now: bool,
    ack_deadline: Option<Instant>,
    unacked_in_order: u32,
    last_window: u32,
    pub(crate) violation: Option<String>,
    pub(crate) stats: ChannelStats,
}

impl Receiver {
    pub(crate) fn new(profile: Profile, config: &Config) -> Receiver {
        Receiver {
            profile,
            window: config.recv_window,
            ack_delay: config.ack_delay,
            next: 1,
            buffer: BTreeMap::new(),
            in_message: false,
            seen: HashSet::new(),
            seen_order: VecDeque::new(),
            highest: 0,
            seed_acks: BTreeSet::new(),
            ready: VecDeque::new(),
            ack_now: false,
            ack_deadline: None,
            unacked_in_order: 0,
            last_window: config.recv_window,
            violation: None,
            stats: ChannelStats::default(),
        }
    }

    fn held(&self) -> u32 {
        (self.buffer.len() + self.ready.len()) as u32
    }

    pub(crate) fn on_data(
        &mut self,
        now: Instant,
        seq: u32,
        first: bool,
        last: bool,
        kind: MessageKind,
        payload: &[u8],
    ) {
        self.stats.packets_received += 1;
        let chunk = Chunk {
            kind,
            seq,
            payload: payload.to_vec(),
            end: last,
        };
        match self.profile {
            Profile::Seed => {
                // Every datagram is acknowledged, duplicates too: their first
                // acknowledgement may have been lost.
                self.seed_acks.insert(seq);
                if self.seen.contains(&seq) {
                    self.stats.duplicates += 1;
                    return;
                }
                self.seen.insert(seq);
                self.seen_order.push_back(seq);
                if self.seen_order.len() > SEED_DUP_WINDOW {
                    let old = self.seen_order.pop_front().expect("non-empty");
                    self.seen.remove(&old);
                }
                if seq < self.highest {
                    // Detected and counted, not reordered (the paper's
                    // `out_of_order` counter).
                    self.stats.out_of_order += 1;
                }
                self.highest = self.highest.max(seq);
                self.ready.push_back(Chunk { end: true, ..chunk });
            }
            Profile::Robust => {
                if seq < self.next || self.buffer.contains_key(&seq) {
                    self.stats.duplicates += 1;
                    self.ack_now = true;
                    return;
                }
                // Beyond the buffer: dropped, and the ACK tells the sender the window.
                if self.held() >= self.window || seq - self.next >= self.window {
                    self.stats.dropped_full += 1;
                    self.ack_now = true;
                    return;
                }
                if seq != self.next {
                    if self.buffer.range(seq..).next().is_some() {
                        self.stats.out_of_order += 1;
                    }
                    self.buffer.insert(seq, (first, chunk));
                    // RFC 5681 §4.2: "an immediate ACK SHOULD be generated when an
                    // out-of-order segment arrives".
                    self.ack_now = true;
                    return;
                }
                let filled_gap = !self.buffer.is_empty();
                self.buffer.insert(seq, (first, chunk));
                while let Some((first, c)) = self.buffer.remove(&self.next) {
                    self.next += 1;
                    self.deliver_in_order(first, c);
                }
                if filled_gap {
                    // RFC 5681 §4.2: an immediate ACK "SHOULD" follow a segment that
                    // fills in all or part of a gap.
                    self.ack_now = true;
                } else {
                    // RFC 5681 §4.2: "an ACK SHOULD be generated for at least every
                    // second full-sized segment"; else within the ACK delay.
                    self.unacked_in_order += 1;
                    if self.unacked_in_order >= 2 {
                        self.ack_now = true;
                    } else if self.ack_deadline.is_none() {
                        self.ack_deadline = Some(now + self.ack_delay);
                    }
                }
            }
        }
    }

    /// Hands an in-order fragment on; a FIRST flag must start a message exactly
    /// when none is open, else the peer broke the protocol.
    fn deliver_in_order(&mut self, first: bool, c: Chunk) {
        if first == self.in_message {
            self.violation.get_or_insert_with(|| {
                if first {
                    format!(
                        "packet {} starts a message before the previous one ended",
                        c.seq
                    )
                } else {
                    format!("packet {} continues a message that never began", c.seq)
                }
            });
        }
        self.in_message = !c.end;
        self.ready.push_back(c);
    }

    /// The next chunk for the application.
    pub(crate) fn take(&mut self) -> Option<Chunk> {
        let c = self.ready.pop_front()?;
        if self.profile == Profile::Robust {
            let free = self.window - self.held().min(self.window);
            // A window update once the application drained a window that had
            // (nearly) closed, so the sender is not left probing.
            if self.last_window < self.window / 4 && free >= self.window / 2 {
                self.ack_now = true;
            }
        }
        Some(c)
    }

    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.ack_now {
            return None;
        }
        self.ack_deadline
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_now = true;
        }
    }

    /// An ACK to send now, if one is due.
    pub(crate) fn poll_ack(&mut self, id: u32, channel: u16) -> Option<Vec<u8>> {
        match self.profile {
            Profile::Seed => {
                if self.seed_acks.is_empty() {
                    return None;
                }
                let mut ranges: Vec<(u32, u32)> = Vec::new();
                while let Some(&s) = self.seed_acks.first() {
                    let n = ranges.len();
                    match ranges.last_mut() {
                        Some((_, e)) if *e == s => *e += 1,
                        // The rest go in the next ACK.
                        _ if n == MAX_RANGES => break,
                        _ => ranges.push((s, s + 1)),
                    }
                    self.seed_acks.pop_first();
                }
                Some(packet::encode(
                    id,
                    &Packet::Ack {
                        channel,
                        cumulative: 0,
                        window: u16::MAX,
                        ranges,
                    },
                ))
            }
            Profile::Robust => {
                if !self.ack_now {
                    return None;
                }
                self.ack_now = false;
                self.ack_deadline = None;
                self.unacked_in_order = 0;
                let mut ranges: Vec<(u32, u32)> = Vec::new();
                for &seq in self.buffer.keys() {
                    let n = ranges.len();
                    match ranges.last_mut() {
                        Some((_, e)) if *e == seq => *e += 1,
                        _ if n == MAX_RANGES => break,
                        _ => ranges.push((seq, seq + 1)),
                    }
                }
                let free = self.window - self.held().min(self.window);
                self.last_window = free;
                Some(packet::encode(
                    id,
                    &Packet::Ack {
                        channel,
                        cumulative: self.next,
                        window: free.min(u32::from(u16::MAX)) as u16,
                        ranges,
                    },
                ))
            }
        }
    }
}
