//! The random source injected into the impairment model.
//!
//! The model only needs uniform 64-bit words, so it takes any [`RandomSource`]; the
//! forwarder uses [`Xoshiro256pp`] (xoshiro256++, public-domain algorithm by Blackman and
//! Vigna: fast, 256-bit state, passes BigCrush), seeded through SplitMix64. Tests inject
//! scripted sources to force exact loss/jitter decisions. Not cryptographic, on purpose.

/// A source of uniformly distributed 64-bit words.
pub trait RandomSource {
    fn next_u64(&mut self) -> u64;

    /// Uniform in `[0, 1)` with 53 bits of precision.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[0, n)` (Lemire's multiply-high; bias below 2^-64 · n).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// `true` with probability `p` (`p <= 0` never, `p >= 1` always).
    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.next_f64() < p
        }
    }
}

/// xoshiro256++ seeded from a single `u64` via SplitMix64.
#[derive(Clone, Debug)]
pub struct Xoshiro256pp {
    s: [u64; 4],
}

impl Xoshiro256pp {
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let mut next = || {
            sm = sm.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// A seed that differs between processes and calls (time, PID, address entropy).
    pub fn entropy_seed() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let local = 0u8;
        t ^ ((std::process::id() as u64) << 32) ^ (&local as *const u8 as u64).rotate_left(17)
    }
}

impl RandomSource for Xoshiro256pp {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed_and_distinct_across_seeds() {
        let mut a = Xoshiro256pp::seed_from_u64(7);
        let mut b = Xoshiro256pp::seed_from_u64(7);
        let mut c = Xoshiro256pp::seed_from_u64(8);
        let xa: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn uniformity_is_plausible() {
        let mut r = Xoshiro256pp::seed_from_u64(42);
        let n = 1_000_000;
        let mut buckets = [0u32; 10];
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
            buckets[r.below(10) as usize] += 1;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.002, "mean {mean}");
        for b in buckets {
            // Expected 100k each; 6 sigma is about 1.8k.
            assert!((b as i64 - 100_000).abs() < 2_000, "bucket {b}");
        }
        let hits = (0..n).filter(|_| r.chance(0.01)).count();
        assert!((hits as i64 - 10_000).abs() < 600, "hits {hits}");
    }
}
