//! When the forwarder asks its timer to wake it: sans-IO, on times passed in.
//!
//! A timerfd armed for `t` wakes the process some time after `t`. On an idle host that is
//! a few microseconds; on a VM it is often 0.1–0.2 ms, and every delayed frame then
//! leaves that much late (a 50 ms link measured 50.2 ms). [`WakePlanner`] learns how late
//! the wake-ups are and arms the timer that much early. A wake-up that comes before the
//! next release is due then polls (the timer is armed in the past, so epoll returns at
//! once and the TAPs are still served) for the short rest of the wait.
//!
//! Polling costs CPU, so it has a budget: at most [`SPIN_BUDGET_NS`] per
//! [`SPIN_WINDOW_NS`]. A link releasing frames faster than its wake-up lateness (bulk
//! traffic) would otherwise keep a core busy; once the budget is spent the timer is
//! armed for the release time itself, as without the planner, until the next window.

/// The largest lead: a host later than this has a problem that polling should not hide.
pub const MAX_LEAD_NS: u64 = 500_000;
/// The window over which polling time is budgeted.
pub const SPIN_WINDOW_NS: u64 = 1_000_000_000;
/// Polling time allowed per window: 5 % of one core.
pub const SPIN_BUDGET_NS: u64 = 50_000_000;
/// Weight of a new lateness sample in the average (1/8).
const EWMA_SHIFT: u32 = 3;

#[derive(Debug, Default)]
pub struct WakePlanner {
    /// Average lateness of timer wake-ups, in ns.
    lateness_ns: u64,
    /// The deadline the timer was armed for while it lay in the future: the wake-up it
    /// brings measures lateness. `None` while polling (a past deadline measures nothing).
    armed_ahead: Option<u64>,
    window_start: u64,
    spun_ns: u64,
    /// The time of the previous plan if it chose to poll.
    polling_since: Option<u64>,
}

impl WakePlanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// How early the timer is armed.
    pub fn lead_ns(&self) -> u64 {
        self.lateness_ns.min(MAX_LEAD_NS)
    }

    /// The deadline to arm the timer with, given the next release time. `Some(t)` with
    /// `t <= now` means poll: return from the wait at once.
    pub fn plan(&mut self, now: u64, next_release: Option<u64>) -> Option<u64> {
        if let Some(since) = self.polling_since.take() {
            self.spun_ns += now.saturating_sub(since);
        }
        if now.saturating_sub(self.window_start) >= SPIN_WINDOW_NS {
            self.window_start = now;
            self.spun_ns = 0;
        }
        let Some(next) = next_release else {
            self.armed_ahead = None;
            return None;
        };
        if next <= now {
            self.armed_ahead = None;
            return Some(next);
        }
        if self.spun_ns >= SPIN_BUDGET_NS {
            self.armed_ahead = Some(next);
            return Some(next);
        }
        let wake = next - self.lead_ns();
        if wake <= now {
            self.polling_since = Some(now);
            self.armed_ahead = None;
            Some(now)
        } else {
            self.armed_ahead = Some(wake);
            Some(wake)
        }
    }

    /// The timer fired; `now` is when the process saw it.
    pub fn on_timer(&mut self, now: u64) {
        if let Some(deadline) = self.armed_ahead.take() {
            let late = now.saturating_sub(deadline).min(4 * MAX_LEAD_NS);
            // EWMA in integers: avg += (sample - avg) / 8.
            let avg = self.lateness_ns as i64;
            self.lateness_ns = (avg + ((late as i64 - avg) >> EWMA_SHIFT)) as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// A timer that always wakes `late` after its deadline, and a release due at `due`:
    /// returns when the planner lets the release happen (the first wake at or after
    /// `due`) and how many polls it took.
    fn wait_for(p: &mut WakePlanner, start: u64, due: u64, late: u64) -> (u64, u32) {
        let mut now = start;
        let mut polls = 0;
        loop {
            if now >= due {
                return (now, polls);
            }
            let at = p.plan(now, Some(due)).unwrap();
            if at <= now {
                polls += 1;
                now += 2 * US; // one trip round the loop
            } else {
                now = at + late;
                p.on_timer(now);
            }
        }
    }

    #[test]
    fn a_late_timer_is_learned_and_releases_become_punctual() {
        let mut p = WakePlanner::new();
        let late = 180 * US;
        let mut t = 0;
        let mut slips = Vec::new();
        for _ in 0..100 {
            let due = t + 10 * MS;
            let (released, _) = wait_for(&mut p, t, due, late);
            slips.push(released - due);
            t = released;
        }
        assert!(
            slips[0] >= late,
            "the first wait is late by the timer's lateness"
        );
        assert!(
            slips[60..].iter().all(|&s| s <= 5 * US),
            "after learning, releases slip at most one loop trip: {:?}",
            &slips[60..]
        );
        assert!(p.lead_ns() <= late && p.lead_ns() > late - 10 * US);
    }

    #[test]
    fn never_releases_early() {
        let mut p = WakePlanner::new();
        let mut t = 0;
        for i in 0..200 {
            // Lateness that varies a lot: the lead overshoots sometimes.
            let late = if i % 3 == 0 { 20 * US } else { 300 * US };
            let due = t + 3 * MS;
            let (released, _) = wait_for(&mut p, t, due, late);
            assert!(released >= due);
            t = released;
        }
    }

    #[test]
    fn polling_is_bounded_by_the_budget() {
        let mut p = WakePlanner::new();
        // Learn a 400 us lateness.
        let mut t = 0;
        for _ in 0..50 {
            let due = t + 5 * MS;
            t = wait_for(&mut p, t, due, 400 * US).0;
        }
        // Then releases come every 100 us (bulk), closer than the lead: every wait would
        // be polled. Over ten seconds (eleven budget windows at most, as they need not
        // line up with the start), polling stays within the budget.
        let start = t;
        let mut polled_ns = 0;
        while t < start + 10 * SPIN_WINDOW_NS {
            let due = t + 100 * US;
            let (released, polls) = wait_for(&mut p, t, due, 400 * US);
            polled_ns += u64::from(polls) * 2 * US;
            t = released;
        }
        assert!(
            polled_ns <= 11 * (SPIN_BUDGET_NS + 2 * US),
            "{polled_ns} ns polled in ten seconds"
        );
        assert!(
            polled_ns >= 9 * SPIN_BUDGET_NS,
            "the budget is used: {polled_ns}"
        );
    }

    #[test]
    fn nothing_to_release_disarms() {
        let mut p = WakePlanner::new();
        assert_eq!(p.plan(5, None), None);
        assert_eq!(
            p.plan(5, Some(3)),
            Some(3),
            "an overdue release fires at once"
        );
    }
}
