//! Writing bench results: CSV with a fixed header, markdown, the machine
//! description, and PNG plots (matplotlib from a pinned venv, `scripts/plots-venv`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// A CSV table with a fixed column list; every row must have exactly those columns.
pub struct Csv {
    pub header: &'static [&'static str],
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    pub fn new(header: &'static [&'static str]) -> Csv {
        Csv {
            header,
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(row.len(), self.header.len(), "CSV row width");
        assert!(
            row.iter().all(|c| !c.contains([',', '\n', '"'])),
            "CSV cells are plain"
        );
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let mut s = self.header.join(",");
        s.push('\n');
        for r in &self.rows {
            s += &r.join(",");
            s.push('\n');
        }
        s
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.render()).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a CSV written by [`Csv::write`], checking its header against `header`.
    /// Benches only ever append columns, so a file from an older run whose
    /// header is a leading part of `header` is read too, its rows padded with
    /// empty cells (committed results stay readable after a bench gains a column).
    pub fn read(path: &Path, header: &'static [&'static str]) -> Result<Csv> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Csv::parse(&text, header).with_context(|| path.display().to_string())
    }

    fn parse(text: &str, header: &'static [&'static str]) -> Result<Csv> {
        let mut lines = text.lines();
        let got: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        if got.len() > header.len() || got[..] != header[..got.len()] {
            bail!(
                "header {:?} is not {:?} or a leading part of it",
                got.join(","),
                header.join(",")
            );
        }
        let mut csv = Csv::new(header);
        for (i, l) in lines.enumerate() {
            let mut row: Vec<String> = l.split(',').map(str::to_string).collect();
            if row.len() != got.len() {
                bail!("row {} has {} columns, not {}", i + 2, row.len(), got.len());
            }
            row.resize(header.len(), String::new());
            csv.rows.push(row);
        }
        Ok(csv)
    }

    pub fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    }
}

/// A markdown table.
pub fn md_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|", header.join(" | "));
    for _ in header {
        s += "---|";
    }
    s.push('\n');
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg gives them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The machine and build this ran on, and the exact command.
pub fn provenance() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches(" kB").parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = read("/proc/sys/kernel/osrelease");
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|s| s.trim_matches('"').to_string())
        .unwrap_or_default();
    let cmd: Vec<String> = std::env::args()
        .enumerate()
        .map(|(i, a)| if i == 0 { "quicsdn-lab".to_string() } else { a })
        .collect();
    format!(
        "- machine: {cores} CPUs ({cpu}), {mem_gib:.0} GiB, {os}, Linux {}\n- build: quicsdn-lab {} ({} profile)\n- command: `{}`\n",
        kernel.trim(),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        cmd.join(" ")
    )
}

/// The repository (for `scripts/plots-venv` and `lab/plots/plots.py`).
fn repo() -> PathBuf {
    crate::topology::default_repo_dir()
}

/// Runs `lab/plots/plots.py KIND DIR` with the pinned matplotlib venv (installed on
/// first use by `scripts/plots-venv`). Returns the PNGs it wrote.
pub fn plot(kind: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let repo = repo();
    let venv = std::process::Command::new(repo.join("scripts/plots-venv"))
        .output()
        .context("running scripts/plots-venv")?;
    if !venv.status.success() {
        bail!(
            "scripts/plots-venv failed: {}",
            String::from_utf8_lossy(&venv.stderr)
        );
    }
    let venv = PathBuf::from(String::from_utf8_lossy(&venv.stdout).trim());
    let out = std::process::Command::new(venv.join("bin/python"))
        .arg(repo.join("lab/plots/plots.py"))
        .arg(kind)
        .arg(dir)
        .output()
        .context("running lab/plots/plots.py")?;
    if !out.status.success() {
        bail!("plots.py {kind}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect())
}

/// Markdown image links to `plots`, by file name (the summary sits beside them).
pub fn image_links(plots: &[PathBuf]) -> String {
    plots
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| format!("\n![{0}]({0})\n", n.to_string_lossy()))
        .collect()
}

/// `x` as a percentage change from `base`, e.g. `-82.1%`.
pub fn pct_change(x: f64, base: f64) -> String {
    if base == 0.0 {
        "-".into()
    } else {
        format!("{:+.1}%", (x / base - 1.0) * 100.0)
    }
}

/// Human-readable bytes.
pub fn bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_and_schema() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Csv::new(&["a", "b"]);
        c.push(vec!["1".into(), "x".into()]);
        let p = dir.path().join("t.csv");
        c.write(&p).unwrap();
        let r = Csv::read(&p, &["a", "b"]).unwrap();
        assert_eq!(r.rows, vec![vec!["1".to_string(), "x".to_string()]]);
        assert!(Csv::read(&p, &["a", "c"]).is_err());
        std::fs::write(&p, "a,b\n1,2,3\n").unwrap();
        assert!(Csv::read(&p, &["a", "b"]).is_err());
        // An older run, before column c was added: read, padded.
        std::fs::write(&p, "a,b\n1,2\n").unwrap();
        let r = Csv::read(&p, &["a", "b", "c"]).unwrap();
        assert_eq!(
            r.rows,
            vec![vec!["1".to_string(), "2".into(), String::new()]]
        );
        // Not a leading part: a renamed column, or one more than expected.
        assert!(Csv::read(&p, &["a", "x", "c"]).is_err());
        assert!(Csv::read(&p, &["a"]).is_err());
        std::fs::write(&p, "a,b\n1\n").unwrap();
        assert!(Csv::read(&p, &["a", "b", "c"]).is_err());
        assert_eq!(pct_change(18.0, 100.0), "-82.0%");
        assert!(md_table(&["x"], &[vec!["1".into()]]).contains("| 1 |"));
    }
}
