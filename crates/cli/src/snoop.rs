//! `quicsdn snoop`: attaches to a running agent's control socket and prints
//! one switch's OpenFlow or OVSDB messages as they pass, one line each (as
//! `ovs-ofctl snoop` does), optionally writing them to a pcap file
//! ([`crate::pcap`]) and the TLS secrets of new handshakes to a key log.

use crate::args::SnoopArgs;
use crate::pcap::PcapTcp;
use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use quicsdn_wire::decode;
use std::io::Write;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The line printed for one message.
pub fn message_line(framing: &str, ev: &serde_json::Value, data: &[u8]) -> String {
    let t_us = ev["t_us"].as_u64().unwrap_or(0);
    let secs = t_us / 1_000_000;
    let clock = format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        t_us % 1_000_000
    );
    let decoded = match framing {
        "openflow" => decode::openflow_line(data),
        "jsonrpc" => decode::jsonrpc_line(data),
        _ => format!("len={}", data.len()),
    };
    let stream = ev["stream"]
        .as_u64()
        .map_or(String::new(), |s| format!(" stream={s}"));
    format!(
        "{clock} session={} {} lane={}{stream}: {decoded}",
        ev["session"],
        ev["dir"].as_str().unwrap_or("?"),
        ev["lane"],
    )
}

fn server_port(framing: &str) -> u16 {
    match framing {
        // IANA: OpenFlow 6653, OVSDB 6640.
        "openflow" => 6653,
        "jsonrpc" => 6640,
        // A port no dissector claims.
        _ => 6660,
    }
}

pub fn run(args: SnoopArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(snoop(args))
}

async fn snoop(args: SnoopArgs) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let stream = tokio::net::UnixStream::connect(&args.socket)
        .await
        .with_context(|| format!("cannot connect to {}", args.socket.display()))?;
    let (r, mut w) = stream.into_split();
    let request = serde_json::json!({
        "cmd": "snoop", "switch": args.switch, "service": args.service, "follow": args.follow,
        "keylog": args.keylog.is_some(),
    });
    w.write_all(format!("{request}\n").as_bytes()).await?;
    let mut lines = BufReader::new(r).lines();
    let answer = lines
        .next_line()
        .await?
        .ok_or_else(|| anyhow!("the agent closed the connection without answering"))?;
    let answer: serde_json::Value = serde_json::from_str(&answer)
        .map_err(|e| anyhow!("the agent answered something unreadable ({e}): {answer}"))?;
    if answer["ok"] != true {
        bail!(
            "{}",
            answer["error"]
                .as_str()
                .unwrap_or("the agent refused the snoop")
        );
    }
    let framing = answer["framing"].as_str().unwrap_or("raw").to_string();
    eprintln!(
        "snooping on switch {} service {} ({framing}){}; Ctrl-C stops",
        answer["switch"].as_str().unwrap_or("?"),
        answer["service"].as_str().unwrap_or("?"),
        if args.follow {
            ", following its sessions"
        } else {
            ", until its session closes"
        }
    );
    let mut pcap = match &args.pcap {
        None => None,
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("--pcap {}", path.display()))?;
            Some(PcapTcp::new(file, server_port(&framing))?)
        }
    };
    let mut keylog = match &args.keylog {
        None => None,
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("--keylog {}", path.display()))?;
            eprintln!(
                "WARNING: the TLS secrets of the agent's QUIC handshakes made from now on go to {}; \
                 whoever holds that file can decrypt those connections. Connections already up \
                 are not covered (their secrets are gone): make them reconnect to capture them.",
                path.display()
            );
            Some(file)
        }
    };
    let mut term = signal(SignalKind::terminate())?;
    let mut last_t = Duration::ZERO;
    let mut messages = 0u64;
    let stdout = std::io::stdout();
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        let line = match line {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                eprintln!("snoop: reading from the agent: {e}");
                break;
            }
        };
        let ev: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                println!("unreadable event from the agent ({e}): {line}");
                continue;
            }
        };
        let t = Duration::from_micros(ev["t_us"].as_u64().unwrap_or(0));
        last_t = last_t.max(t);
        let session = ev["session"].as_u64().unwrap_or(0);
        let mut out = stdout.lock();
        match ev["ev"].as_str() {
            Some("msg") => {
                let data = match ev["data"]
                    .as_str()
                    .map(|d| base64::engine::general_purpose::STANDARD.decode(d))
                {
                    Some(Ok(d)) => d,
                    _ => {
                        writeln!(out, "unreadable message from the agent: {line}")?;
                        continue;
                    }
                };
                writeln!(out, "{}", message_line(&framing, &ev, &data))?;
                if let Some(p) = &mut pcap {
                    p.message(session, t, ev["dir"] == "to_controller", &data)?;
                }
                messages += 1;
                if args.count.is_some_and(|n| messages >= n) {
                    break;
                }
            }
            Some("open") => {
                writeln!(out, "session={session} opened")?;
                if let Some(p) = &mut pcap {
                    p.open(session, t)?;
                }
            }
            Some("close") => {
                writeln!(out, "session={session} closed")?;
                if let Some(p) = &mut pcap {
                    p.close(session, t)?;
                }
            }
            Some("keylog") => match (&mut keylog, ev["line"].as_str()) {
                (Some(f), Some(l)) => writeln!(f, "{l}")?,
                _ => writeln!(out, "unexpected key log line from the agent")?,
            },
            Some("dropped") => {
                writeln!(
                    out,
                    "{} messages dropped (snoop did not keep up; the agent never waits for it)",
                    ev["messages"]
                )?;
            }
            _ => writeln!(out, "unknown event from the agent: {line}")?,
        }
    }
    if let Some(p) = pcap {
        p.finish(last_t)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_session_direction_lane_and_stream() {
        let ev = serde_json::json!({
            "ev": "msg", "session": 2, "t_us": 3_723_000_042u64, "dir": "to_switch",
            "lane": 1, "stream": 6,
        });
        let msg = quicsdn_wire::openflow::build::barrier_request(7);
        assert_eq!(
            message_line("openflow", &ev, &msg),
            "01:02:03.000042 session=2 to_switch lane=1 stream=6: BARRIER_REQUEST OF1.3 xid=0x7 len=8"
        );
        assert!(message_line("jsonrpc", &ev, b"{").contains("MALFORMED JSON-RPC"));
    }
}
