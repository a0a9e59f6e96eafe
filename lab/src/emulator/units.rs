//! Parsing and printing of the units the emulator's CLI accepts.
//!
//! - Durations: `25ms`, `500us`, `1.5s`, `250000ns`, `0` (a bare `0` is allowed; any other
//!   number needs a unit so that `25` is never silently read as seconds or milliseconds).
//! - Probabilities: `1%`, `0.5%`, `100%` (the `%` is required on the command line; the JSON
//!   control protocol uses fractions in `[0, 1]`).
//! - Rates, tc-style and decimal (k = 1000): `bit`, `kbit`, `mbit`, `gbit` are bits per
//!   second; `bps`, `kbps`, `mbps`, `gbps` are **bytes** per second (as in `tc`). `0`, `off`
//!   and `unlimited` mean no rate limit.

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
#[error("invalid {what} {input:?}: {why}")]
pub struct UnitError {
    pub what: &'static str,
    pub input: String,
    pub why: String,
}

fn err(what: &'static str, input: &str, why: impl Into<String>) -> UnitError {
    UnitError {
        what,
        input: input.to_string(),
        why: why.into(),
    }
}

fn split_number(s: &str) -> (&str, &str) {
    let idx = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..idx], s[idx..].trim())
}

/// Parses a duration such as `25ms` into nanoseconds.
pub fn parse_duration_ns(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "duration";
    let s = input.trim();
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(err(WHAT, input, "expected a number such as 25ms"));
    }
    let value: f64 = num.parse().map_err(|_| err(WHAT, input, "not a number"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" if value == 0.0 => 0.0,
        "" => {
            return Err(err(
                WHAT,
                input,
                "missing unit (use ns, us, ms or s, e.g. 25ms)",
            ));
        }
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        other => return Err(err(WHAT, input, format!("unknown unit {other:?}"))),
    };
    let ns = value * scale;
    if !ns.is_finite() || ns > 3.6e12 {
        return Err(err(WHAT, input, "out of range (at most 1 hour)"));
    }
    Ok(ns.round() as u64)
}

/// Parses a percentage such as `1%` into a fraction in `[0, 1]`.
pub fn parse_percent(input: &str) -> Result<f64, UnitError> {
    const WHAT: &str = "percentage";
    let s = input.trim();
    let Some(num) = s.strip_suffix('%') else {
        return Err(err(WHAT, input, "expected a percentage such as 1% or 0.5%"));
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| err(WHAT, input, "not a number"))?;
    if !(0.0..=100.0).contains(&value) {
        return Err(err(WHAT, input, "must be between 0% and 100%"));
    }
    Ok(value / 100.0)
}

/// Parses a rate such as `100mbit` into bits per second (0 = unlimited).
pub fn parse_rate_bps(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "rate";
    let s = input.trim();
    match s.to_ascii_lowercase().as_str() {
        "0" | "off" | "unlimited" | "none" => return Ok(0),
        _ => {}
    }
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(err(WHAT, input, "expected a number such as 100mbit"));
    }
    let value: f64 = num.parse().map_err(|_| err(WHAT, input, "not a number"))?;
    let bits_per_unit = match unit.to_ascii_lowercase().as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "" => {
            return Err(err(
                WHAT,
                input,
                "missing unit (use bit, kbit, mbit, gbit for bits/s or bps, kbps, mbps, gbps for bytes/s)",
            ));
        }
        other => return Err(err(WHAT, input, format!("unknown unit {other:?}"))),
    };
    let bps = value * bits_per_unit;
    if !bps.is_finite() || bps > 1e12 {
        return Err(err(WHAT, input, "out of range (at most 1000gbit)"));
    }
    if bps > 0.0 && bps < 1.0 {
        return Err(err(WHAT, input, "below 1 bit/s"));
    }
    Ok(bps.round() as u64)
}

/// Formats nanoseconds the way a person would type them (`25ms`, `1.5ms`, `800us`).
pub fn fmt_duration_ns(ns: u64) -> String {
    if ns == 0 {
        "0".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns >= 1_000_000 {
        trim_float(ns as f64 / 1e6, "ms")
    } else if ns >= 1_000 {
        trim_float(ns as f64 / 1e3, "us")
    } else {
        format!("{ns}ns")
    }
}

/// Formats a rate in bits per second (`100mbit`, `1.5gbit`, `unlimited`).
pub fn fmt_rate_bps(bps: u64) -> String {
    if bps == 0 {
        "unlimited".into()
    } else if bps >= 1_000_000_000 {
        trim_float(bps as f64 / 1e9, "gbit")
    } else if bps >= 1_000_000 {
        trim_float(bps as f64 / 1e6, "mbit")
    } else if bps >= 1_000 {
        trim_float(bps as f64 / 1e3, "kbit")
    } else {
        format!("{bps}bit")
    }
}

/// Formats a fraction as a percentage (`1%`, `0.25%`).
pub fn fmt_percent(p: f64) -> String {
    trim_float(p * 100.0, "%")
}

fn trim_float(v: f64, unit: &str) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("25ms"), Ok(25_000_000));
        assert_eq!(parse_duration_ns("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration_ns("500us"), Ok(500_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("7ns"), Ok(7));
        assert_eq!(parse_duration_ns("0"), Ok(0));
        assert!(parse_duration_ns("25").is_err());
        assert!(parse_duration_ns("ms").is_err());
        assert!(parse_duration_ns("5min").is_err());
        assert!(parse_duration_ns("-5ms").is_err());
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("1%"), Ok(0.01));
        assert_eq!(parse_percent("0.5%"), Ok(0.005));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        assert!(parse_percent("1").is_err());
        assert!(parse_percent("101%").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate_bps("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate_bps("1.5gbit"), Ok(1_500_000_000));
        assert_eq!(parse_rate_bps("64kbit"), Ok(64_000));
        assert_eq!(parse_rate_bps("1mbps"), Ok(8_000_000));
        assert_eq!(parse_rate_bps("off"), Ok(0));
        assert!(parse_rate_bps("100").is_err());
        assert!(parse_rate_bps("100furlongs").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["25ms", "1.5ms", "800us", "2s", "0"] {
            assert_eq!(fmt_duration_ns(parse_duration_ns(s).unwrap()), s);
        }
        for s in ["100mbit", "1.5gbit", "64kbit"] {
            assert_eq!(fmt_rate_bps(parse_rate_bps(s).unwrap()), s);
        }
        assert_eq!(fmt_percent(0.01), "1%");
        assert_eq!(fmt_percent(0.0025), "0.25%");
    }
}
