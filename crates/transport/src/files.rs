//! The agents' own state files (the session store, the roster, a worker's
//! copies): how their names are made and how they are opened.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `path` with `suffix` appended to its whole name (`FILE` → `FILE.peers`,
/// `FILE.0`). Not `with_extension`, which replaces what follows the last
/// dot: every `--workers` store (`FILE.0`, `FILE.1`, …) would then share one
/// name.
pub fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Where a file is written before its rename over `path`: `path.tmp`, so
/// each state file (and each worker's) has its own.
pub fn temp_path(path: &Path) -> PathBuf {
    suffixed(path, ".tmp")
}

/// Opens `path` for writing, creating it with mode 0600 (the state files
/// hold secrets or the switches' addresses): emptied if `truncate`, else
/// appended to.
pub fn open_private(path: &Path, truncate: bool) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).mode(0o600);
    if truncate {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    o.open(path)
}
