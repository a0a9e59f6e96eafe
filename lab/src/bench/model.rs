//! The quicSDN journal paper's overhead model (§2.1, Eqs. 1–5, Table 1), pure
//! functions, and the physical lower bound of a workload.
//!
//! Notation as in the paper: `H_EP` Ethernet and physical headers, `H_IP`, `H_TCP`,
//! `H_UDP`, `H_QSH` (QUIC short header), `H_QFH` (QUIC frame header), `L_MTU`; α
//! frames per QUIC packet; bursts `b_j` = bytes handed to the transport within one
//! buffering period `T_b`.

use crate::emulator::rng::{RandomSource, Xoshiro256pp};

/// Header sizes in bytes (journal Table 1) and the MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Headers {
    pub ep: u64,
    pub ip: u64,
    pub tcp: u64,
    pub udp: u64,
    pub qsh: u64,
    pub qfh: u64,
    pub mtu: u64,
}

impl Headers {
    /// Table 1, MTU 1500.
    pub const TABLE1: Headers = Headers {
        ep: 28,
        ip: 20,
        tcp: 20,
        udp: 8,
        qsh: 2,
        qfh: 1,
        mtu: 1500,
    };

    /// Per-packet cost of a TCP packet: `H_EP + H_IP + H_TCP`.
    pub fn tcp_packet(&self) -> u64 {
        self.ep + self.ip + self.tcp
    }

    /// TCP payload per full packet: `L_MTU − (H_IP + H_TCP)`.
    pub fn tcp_mss(&self) -> u64 {
        self.mtu - self.ip - self.tcp
    }

    /// Per-packet cost of a QUIC packet with α frames.
    pub fn quic_packet(&self, alpha: u64) -> u64 {
        self.ep + self.ip + self.udp + self.qsh + alpha * self.qfh
    }

    /// QUIC payload per full packet with α frames.
    pub fn quic_room(&self, alpha: u64) -> u64 {
        self.mtu - (self.ip + self.udp + self.qsh + alpha * self.qfh)
    }

    /// `L_max = L_MTU − (H_EP + H_IP + H_UDP + H_QSH + H_QFH)` (§2.1).
    pub fn l_max(&self) -> u64 {
        self.mtu - (self.ep + self.ip + self.udp + self.qsh + self.qfh)
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Eq. 1: minimum TCP overhead, one connection per agent; `agents[i]` = the
/// message sizes of agent i.
pub fn eq1_tcp(h: &Headers, agents: &[Vec<u64>]) -> u64 {
    agents
        .iter()
        .map(|m| h.tcp_packet() * ceil_div(m.iter().sum(), h.tcp_mss()))
        .sum()
}

/// Eq. 2: minimum QUIC overhead, all agents on one connection.
pub fn eq2_quic(h: &Headers, agents: &[Vec<u64>], alpha: u64) -> u64 {
    let total: u64 = agents.iter().flatten().sum();
    h.quic_packet(alpha) * ceil_div(total, h.quic_room(alpha))
}

/// Eq. 3: frames per packet for messages of mean size `m_avg`: the largest α with
/// `(L_max + H_QFH) / (α (m_avg + H_QFH)) > 1`; 2 when `m_avg > L_max` (a packet
/// then holds one or two frames: the rest of one message and the start of the next).
pub fn eq3_alpha(h: &Headers, m_avg: f64) -> u64 {
    let l_max = h.l_max() as f64;
    if m_avg > l_max {
        return 2;
    }
    let per = m_avg + h.qfh as f64;
    let mut alpha = 1u64;
    while (l_max + h.qfh as f64) / ((alpha + 1) as f64 * per) > 1.0 {
        alpha += 1;
    }
    alpha
}

/// Eq. 4: TCP overhead with bursts; `bursts[i]` = burst sizes (bytes) of agent i.
pub fn eq4_tcp(h: &Headers, bursts: &[Vec<u64>]) -> (u64, u64) {
    let packets: u64 = bursts
        .iter()
        .flatten()
        .map(|&b| ceil_div(b, h.tcp_mss()))
        .sum();
    (packets * h.tcp_packet(), packets)
}

/// Eq. 5: QUIC overhead with bursts of the multiplexed stream; returns (bytes, packets).
pub fn eq5_quic(h: &Headers, bursts: &[u64], alpha: u64) -> (u64, u64) {
    let packets: u64 = bursts
        .iter()
        .map(|&b| ceil_div(b, h.quic_room(alpha)))
        .sum();
    (packets * h.quic_packet(alpha), packets)
}

/// The paper's ACK model: `d` data packets draw `(d + d/2)/2` ACK packets (half
/// acknowledged at once, half delayed to pair with a second packet), each one bare
/// packet: TCP `H_EP + H_IP + H_TCP`, QUIC `H_EP + H_IP + H_UDP + H_QSH + H_QFH`.
pub fn ack_packets(d: u64) -> f64 {
    (d as f64 + d as f64 / 2.0) / 2.0
}

pub fn tcp_ack_bytes(h: &Headers, d: u64) -> f64 {
    ack_packets(d) * h.tcp_packet() as f64
}

pub fn quic_ack_bytes(h: &Headers, d: u64) -> f64 {
    ack_packets(d) * h.quic_packet(1) as f64
}

/// Bursts of a Poisson message process: `n` messages of `size` bytes at `rate`
/// per second; a burst starts with a message and takes every message arriving
/// within `t_b` seconds of it (the transport's buffering delay). `t_b = 0`: one
/// message per burst. Seeded, so the model is reproducible.
pub fn poisson_bursts(n: u64, rate: f64, size: u64, t_b: f64, seed: u64) -> Vec<u64> {
    let mut rng = Xoshiro256pp::seed_from_u64(seed);
    let mut t = 0.0;
    let times: Vec<f64> = (0..n)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            t += -(1.0 - u).ln() / rate;
            t
        })
        .collect();
    bursts_of(&times.iter().map(|&t| (t, size)).collect::<Vec<_>>(), t_b)
}

/// Groups `(time, bytes)` arrivals (sorted by time) into bursts of window `t_b`.
pub fn bursts_of(arrivals: &[(f64, u64)], t_b: f64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut it = arrivals.iter().peekable();
    while let Some(&(t0, b0)) = it.next() {
        let mut b = b0;
        while let Some(&&(t, bytes)) = it.peek() {
            if t - t0 <= t_b && t_b > 0.0 {
                b += bytes;
                it.next();
            } else {
                break;
            }
        }
        out.push(b);
    }
    out
}

/// Merges several agents' arrivals into one time-ordered stream (what one QUIC
/// connection sees).
pub fn merge(agents: &[Vec<(f64, u64)>]) -> Vec<(f64, u64)> {
    let mut all: Vec<(f64, u64)> = agents.iter().flatten().copied().collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all
}

/// Poisson arrival times of `n` messages of `size` at `rate` per second.
pub fn poisson_arrivals(n: u64, rate: f64, size: u64, seed: u64) -> Vec<(f64, u64)> {
    let mut rng = Xoshiro256pp::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            t += -(1.0 - u).ln() / rate;
            (t, size)
        })
        .collect()
}

/// The model's prediction for one direction of a workload: `agents[i]` = arrivals
/// of agent i; TCP with one connection per agent, QUIC with one connection.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub data_packets: u64,
    /// Header bytes of the data packets (Eq. 4 or 5).
    pub transmission: u64,
    /// ACK packets and bytes in the reverse direction (the paper's ACK model).
    pub ack_packets: f64,
    pub ack_bytes: f64,
}

pub fn predict_tcp(h: &Headers, agents: &[Vec<(f64, u64)>], t_b: f64) -> Prediction {
    let bursts: Vec<Vec<u64>> = agents.iter().map(|a| bursts_of(a, t_b)).collect();
    let (transmission, d) = eq4_tcp(h, &bursts);
    Prediction {
        data_packets: d,
        transmission,
        ack_packets: ack_packets(d),
        ack_bytes: tcp_ack_bytes(h, d),
    }
}

pub fn predict_quic(h: &Headers, agents: &[Vec<(f64, u64)>], t_b: f64) -> Prediction {
    let merged = merge(agents);
    let n = merged.len().max(1) as f64;
    let m_avg = merged.iter().map(|a| a.1 as f64).sum::<f64>() / n;
    let alpha = eq3_alpha(h, m_avg);
    let bursts = bursts_of(&merged, t_b);
    // α frames only fit when a burst has that many messages: use the mean number of
    // messages per packet, at least 1, at most α.
    let packets_guess: u64 = bursts
        .iter()
        .map(|&b| ceil_div(b, h.quic_room(alpha)))
        .sum();
    let frames = (merged.len() as f64 / packets_guess.max(1) as f64)
        .round()
        .clamp(1.0, alpha as f64) as u64;
    let (transmission, d) = eq5_quic(h, &bursts, frames);
    Prediction {
        data_packets: d,
        transmission,
        ack_packets: ack_packets(d),
        ack_bytes: quic_ack_bytes(h, d),
    }
}

/// The physical lower bound of carrying `payload` bytes in one direction: every
/// packet MTU-full, no ACK-only packets, the smallest headers of Table 1
/// (`H_EP + H_IP + H_UDP + H_QSH + H_QFH` per packet). Returns (overhead bytes,
/// packets).
pub fn lower_bound(h: &Headers, payload: u64) -> (u64, u64) {
    let packets = ceil_div(payload, h.quic_room(1));
    (packets * h.quic_packet(1), packets)
}

#[cfg(test)]
mod tests {
    use super::*;
    const H: Headers = Headers::TABLE1;

    #[test]
    fn table1_packet_sizes() {
        assert_eq!(H.tcp_packet(), 68);
        assert_eq!(H.tcp_mss(), 1460);
        assert_eq!(H.quic_packet(1), 59);
        assert_eq!(H.quic_room(1), 1469);
        assert_eq!(H.l_max(), 1441);
    }

    #[test]
    fn eq1_by_hand() {
        // Two agents: 10 × 500 B = 5000 B → ⌈5000/1460⌉ = 4 packets × 68 = 272 each.
        let a = vec![vec![500u64; 10], vec![500u64; 10]];
        assert_eq!(eq1_tcp(&H, &a), 544);
        // Exactly one MSS: one packet.
        assert_eq!(eq1_tcp(&H, &[vec![1460]]), 68);
        assert_eq!(eq1_tcp(&H, &[vec![1461]]), 136);
    }

    #[test]
    fn eq2_and_eq3_by_hand() {
        // m = 500: α(501) < 1442 → α = 2 (3 × 501 = 1503 > 1442).
        assert_eq!(eq3_alpha(&H, 500.0), 2);
        // m = 100: 101 α < 1442 → α = 14.
        assert_eq!(eq3_alpha(&H, 100.0), 14);
        assert_eq!(eq3_alpha(&H, 1800.0), 2);
        // 10 000 B with α = 2: room 1468, ⌈10000/1468⌉ = 7 packets × 60 = 420.
        let a = vec![vec![500u64; 10], vec![500u64; 10]];
        assert_eq!(eq2_quic(&H, &a, 2), 420);
        // QUIC (one connection) beats TCP (two): 420 < 544.
        assert!(eq2_quic(&H, &a, 2) < eq1_tcp(&H, &a));
    }

    #[test]
    fn bursts_and_eq4_eq5_by_hand() {
        let arr = [(0.0, 100), (0.004, 100), (0.011, 100), (0.030, 100)];
        assert_eq!(bursts_of(&arr, 0.0), vec![100, 100, 100, 100]);
        assert_eq!(bursts_of(&arr, 0.005), vec![200, 100, 100]);
        assert_eq!(bursts_of(&arr, 0.02), vec![300, 100]);
        // Eq. 4: each burst < MSS → one packet each.
        assert_eq!(eq4_tcp(&H, &[vec![200, 100, 100]]), (3 * 68, 3));
        // Eq. 5: one burst of 3000 B with α = 1: ⌈3000/1469⌉ = 3 packets × 59.
        assert_eq!(eq5_quic(&H, &[3000], 1), (177, 3));
        // ACKs: d = 4 → (4 + 2)/2 = 3 ACKs.
        assert_eq!(ack_packets(4), 3.0);
        assert_eq!(tcp_ack_bytes(&H, 4), 204.0);
    }

    #[test]
    fn lower_bound_by_hand() {
        assert_eq!(lower_bound(&H, 1469), (59, 1));
        assert_eq!(lower_bound(&H, 1470), (118, 2));
        assert_eq!(lower_bound(&H, 0), (0, 0));
    }

    #[test]
    fn predictions_follow_the_papers_claims() {
        // Two agents at 100 msg/s, 500 B: with buffering, QUIC sends fewer packets.
        let a: Vec<Vec<(f64, u64)>> = (0..2)
            .map(|i| poisson_arrivals(5000, 100.0, 500, i))
            .collect();
        let t0 = predict_tcp(&H, &a, 0.0);
        let q0 = predict_quic(&H, &a, 0.0);
        assert_eq!(t0.data_packets, 10_000);
        assert_eq!(q0.data_packets, 10_000);
        let t = predict_tcp(&H, &a, 0.02);
        let q = predict_quic(&H, &a, 0.02);
        assert!(q.data_packets < t.data_packets, "{q:?} vs {t:?}");
        assert!(q.transmission < t.transmission);
        // The burst process is seeded: same input, same answer.
        assert_eq!(
            poisson_bursts(100, 1000.0, 10, 0.002, 3),
            poisson_bursts(100, 1000.0, 10, 0.002, 3)
        );
    }
}
