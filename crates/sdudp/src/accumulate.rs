//! Packet accumulation (paper §III-B1): stream bytes from a host are held
//! until a datagram is full enough to send, so small writes share datagrams;
//! a partial datagram waits at most a bounded time, so a small last write is
//! never held indefinitely.

use bytes::{Bytes, BytesMut};
use std::time::{Duration, Instant};

/// Collects stream bytes into datagram payloads.
#[derive(Debug)]
pub struct Accumulator {
    /// Send once this many bytes are waiting (the paper: about 1.4 KB).
    target: usize,
    /// Largest payload of one datagram.
    max_payload: usize,
    /// Longest a partial payload waits.
    max_wait: Duration,
    enabled: bool,
    buf: BytesMut,
    /// When the oldest waiting byte arrived.
    since: Option<Instant>,
}

impl Accumulator {
    /// Accumulates to `target` bytes (at most `max_payload`), waiting at most
    /// `max_wait`. Disabled, every push is sent at once, split at `max_payload`.
    pub fn new(
        enabled: bool,
        target: usize,
        max_payload: usize,
        max_wait: Duration,
    ) -> Accumulator {
        assert!(max_payload > 0, "max_payload must be positive");
        Accumulator {
            target: target.clamp(1, max_payload),
            max_payload,
            max_wait,
            enabled,
            buf: BytesMut::new(),
            since: None,
        }
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Most bytes [`Self::push`] may take so that it produces at most `datagrams`
    /// payloads.
    pub fn capacity_for(&self, datagrams: usize) -> usize {
        // Enabled: every payload push emits carries at least `target` bytes.
        // Disabled: one push of n bytes makes ceil(n / max_payload) payloads.
        let per = if self.enabled {
            self.target
        } else {
            self.max_payload
        };
        (datagrams * per).saturating_sub(self.buf.len())
    }

    /// Adds stream bytes; appends the payloads now ready to `out`.
    pub fn push(&mut self, now: Instant, data: &[u8], out: &mut Vec<Bytes>) {
        if data.is_empty() {
            return;
        }
        if self.buf.is_empty() {
            self.since = Some(now);
        }
        self.buf.extend_from_slice(data);
        if !self.enabled {
            self.flush(out);
            return;
        }
        let mut emitted = false;
        while self.buf.len() >= self.target {
            let n = self.buf.len().min(self.max_payload);
            out.push(self.buf.split_to(n).freeze());
            emitted = true;
        }
        if self.buf.is_empty() {
            self.since = None;
        } else if emitted && self.buf.len() <= data.len() {
            // Payloads take the oldest bytes first, so what is left all came
            // with this push: its wait starts now. Keeping the older start
            // would flush this remainder (and the writes joining it) early,
            // one short datagram per full one for a host writing 0.5 KB
            // every few ms.
            self.since = Some(now);
        }
    }

    /// Emits everything waiting (the wait expired, or the stream ends).
    pub fn flush(&mut self, out: &mut Vec<Bytes>) {
        while !self.buf.is_empty() {
            let n = self.buf.len().min(self.max_payload);
            out.push(self.buf.split_to(n).freeze());
        }
        self.since = None;
    }

    /// When the waiting bytes must go.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.since.map(|t| t + self.max_wait)
    }

    /// Flushes if the wait expired.
    pub fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Bytes>) {
        if self.poll_timeout().is_some_and(|t| now >= t) {
            self.flush(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_writes_share_datagrams_and_wait_is_bounded() {
        let t0 = Instant::now();
        let mut a = Accumulator::new(true, 1400, 1471, Duration::from_millis(5));
        let mut out = Vec::new();
        for i in 0..5 {
            a.push(t0 + Duration::from_millis(i), &[i as u8; 500], &mut out);
        }
        // 2500 bytes: one datagram at 1500 ≥ 1400, 1000 bytes wait.
        assert_eq!(out.iter().map(|b| b.len()).collect::<Vec<_>>(), vec![1471]);
        assert_eq!(a.len(), 2500 - 1471);
        // The wait counts from the oldest waiting byte: the 29 bytes left of
        // the third write (2 ms), not the first write, which has left.
        let deadline = a.poll_timeout().unwrap();
        assert_eq!(deadline, t0 + Duration::from_millis(2 + 5));
        a.handle_timeout(deadline - Duration::from_micros(1), &mut out);
        assert_eq!(out.len(), 1);
        a.handle_timeout(deadline, &mut out);
        assert_eq!(out.len(), 2);
        assert!(a.is_empty() && a.poll_timeout().is_none());
        let all: Vec<u8> = out.concat();
        assert_eq!(all.len(), 2500);
        assert!(all[..500].iter().all(|&b| b == 0) && all[2000..].iter().all(|&b| b == 4));
    }

    #[test]
    fn a_paced_writer_fills_datagrams_when_the_wait_covers_its_gaps() {
        // The paper's sender: 0.5 KB every 5 ms (100 KB/s); a 20 ms wait.
        // Every datagram but the last is full; with the wait restarting
        // from the first write, every second one left short.
        let t0 = Instant::now();
        let mut a = Accumulator::new(true, 1471, 1471, Duration::from_millis(20));
        let mut out = Vec::new();
        for i in 0..600u64 {
            let now = t0 + Duration::from_millis(5 * i);
            a.handle_timeout(now, &mut out);
            a.push(now, &[i as u8; 500], &mut out);
        }
        a.flush(&mut out);
        assert_eq!(out.iter().map(|b| b.len()).sum::<usize>(), 300_000);
        assert_eq!(out.len(), 300_000usize.div_ceil(1471));
    }

    #[test]
    fn disabled_sends_every_write_and_splits_large_ones() {
        let t0 = Instant::now();
        let mut a = Accumulator::new(false, 1400, 1471, Duration::from_millis(5));
        let mut out = Vec::new();
        a.push(t0, &[1; 500], &mut out);
        a.push(t0, &[2; 3000], &mut out);
        assert_eq!(
            out.iter().map(|b| b.len()).collect::<Vec<_>>(),
            vec![500, 1471, 1471, 58]
        );
        assert!(a.poll_timeout().is_none());
    }

    #[test]
    fn capacity_bounds_the_datagrams_one_push_makes() {
        let t0 = Instant::now();
        for enabled in [true, false] {
            let mut a = Accumulator::new(enabled, 1400, 1471, Duration::from_millis(5));
            let mut out = Vec::new();
            a.push(t0, &[0; 700], &mut out);
            let before = out.len();
            let cap = a.capacity_for(3);
            a.push(t0, &vec![0; cap], &mut out);
            assert!(
                out.len() - before <= 3,
                "enabled={enabled}: {}",
                out.len() - before
            );
        }
    }
}
