//! Durations (`500ms`, `2s`, `1m`) and sizes (`65535`, `64k`, `16M`) as written on
//! the command line and in configuration files.

use std::time::Duration;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid duration {s:?}: expected a number and a unit, as in 500ms, 2s or 1m")
    })?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "invalid duration {s:?}: the unit must be us, ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected bytes, optionally with k, M or G (powers of 1024)")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("5").unwrap_err().contains("unit"));
        assert!(parse_duration("fast").unwrap_err().contains("500ms"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65535"), Ok(65_535));
        assert_eq!(parse_size("64k"), Ok(65_536));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert!(parse_size("lots").is_err());
    }
}
