//! Statistics the benches share: quantiles, and how sure a difference between
//! two configurations' quantiles is.
//!
//! A p99 over 1,500 samples is the 15th-worst; at 1–5 % loss it sits on the
//! edge of the loss tail, and a single extra loss moves it by a retransmission
//! time. [`quantile_diff_ci`] says how wide that uncertainty is, so a
//! summary can state whether a target on a p99 difference is decided by the
//! data at all.

use crate::emulator::rng::{RandomSource, Xoshiro256pp};

/// The `q`-quantile of `sorted` (ascending, not empty): the sample at rank
/// `round((n − 1)·q)`.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// `samples` sorted ascending (NaNs last).
pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// The 95 % percentile-bootstrap interval of `quantile(a, q) − quantile(b, q)`:
/// both samples are resampled with replacement `resamples` times (a fixed
/// `seed`, so a summary is reproducible from its CSV), and the 2.5th and
/// 97.5th percentiles of the differences are returned. Both samples must be
/// non-empty.
pub fn quantile_diff_ci(a: &[f64], b: &[f64], q: f64, resamples: usize, seed: u64) -> (f64, f64) {
    let mut rng = Xoshiro256pp::seed_from_u64(seed);
    let mut draw = |xs: &[f64], buf: &mut Vec<f64>| {
        buf.clear();
        buf.extend((0..xs.len()).map(|_| xs[rng.below(xs.len() as u64) as usize]));
        buf.sort_by(f64::total_cmp);
        quantile(buf, q)
    };
    let (mut ba, mut bb) = (Vec::with_capacity(a.len()), Vec::with_capacity(b.len()));
    let mut diffs: Vec<f64> = (0..resamples.max(1))
        .map(|_| draw(a, &mut ba) - draw(b, &mut bb))
        .collect();
    diffs.sort_by(f64::total_cmp);
    (quantile(&diffs, 0.025), quantile(&diffs, 0.975))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_rank() {
        let s: Vec<f64> = (0..101).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(sorted(&[2.0, 1.0, 3.0]), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_real_shift_is_inside_a_narrow_interval_and_noise_gives_a_wide_one() {
        let mut rng = Xoshiro256pp::seed_from_u64(9);
        let base: Vec<f64> = (0..2000).map(|_| 50.0 + rng.next_f64()).collect();
        let shifted: Vec<f64> = base.iter().map(|x| x + 3.0).collect();
        let (lo, hi) = quantile_diff_ci(&shifted, &base, 0.5, 300, 1);
        assert!(lo > 2.8 && hi < 3.2 && lo <= hi, "[{lo}, {hi}]");
        // A loss tail of exactly 1 %: 15 of 1,500 samples 110 ms late. The p99 is
        // the 16th-worst, just outside the tail; one loss more or less moves it by
        // the whole retransmission time, so the interval of a sample against
        // itself spans that both ways.
        let a: Vec<f64> = (0..1500)
            .map(|i| {
                if i < 15 {
                    160.0
                } else {
                    50.0 + f64::from(i) / 1500.0
                }
            })
            .collect();
        let (lo, hi) = quantile_diff_ci(&a, &a, 0.99, 300, 1);
        assert!(
            lo < -50.0 && hi > 50.0,
            "p99 at the tail's edge: [{lo}, {hi}]"
        );
        // Reproducible from the same samples and seed.
        assert_eq!(quantile_diff_ci(&a, &a, 0.99, 300, 1), (lo, hi));
    }
}
