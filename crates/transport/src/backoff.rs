//! Reconnection backoff, Open vSwitch style, with jitter.
//!
//! OVS's rconn doubles its backoff after each failed attempt up to `max_backoff`
//! (8 s by default; ovs-vswitchd.conf.db(5), Controller table). The switch agent
//! does the same so a controller outage looks to the network the way it would
//! without quicsdn, and adds jitter so that many switches that lost the same
//! controller do not return in lockstep. Pure: the caller supplies the random draw.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays start at `min` and double to at most `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        assert!(min <= max && !min.is_zero());
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait before the next attempt, given `unit` drawn uniformly from [0, 1).
    /// The result lies in [d/2, d] for the current step d (so it never exceeds `max`),
    /// and the step doubles for next time.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        d.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }

    /// After a successful connection: start from `min` again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let lows: Vec<u64> = (0..6)
            .map(|_| b.next_delay(0.0).as_millis() as u64)
            .collect();
        assert_eq!(lows, [500, 1000, 2000, 4000, 4000, 4000]);
        b.reset();
        let highs: Vec<Duration> = (0..6).map(|_| b.next_delay(1.0)).collect();
        assert!(highs.iter().all(|d| *d <= Duration::from_secs(8)));
        assert!(highs[5] > Duration::from_millis(7999));
        b.reset();
        assert!(b.next_delay(0.5) == Duration::from_millis(750));
    }
}
