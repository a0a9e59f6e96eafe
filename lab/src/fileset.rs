//! File sets carried over one TCP connection (the SDUDP paper's sets A–E),
//! and their proof of delivery: the sha256 of every file, folded into one
//! digest so that the receiver's answer stays small (it crosses the measured
//! links too). Used by `bench sdudp` and the SDUDP e2e test.

use ring::digest::{Context, SHA256};

/// File `index` of a set (`seed` varies the set between runs).
pub fn file(seed: u8, index: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8) ^ (index as u8).wrapping_mul(seed) ^ (index >> 8) as u8)
        .collect()
}

/// The receiver's answer: the byte count (8 bytes, big-endian), then the
/// sha256 of the files' sha256s in order.
pub const ANSWER_LEN: usize = 8 + 32;

/// Hashes a stream of files of `size` bytes (the last may be shorter) as they
/// arrive, in pieces of any length.
pub struct FileSetHasher {
    size: usize,
    file: Context,
    in_file: usize,
    files: Context,
    len: u64,
}

impl FileSetHasher {
    pub fn new(size: usize) -> FileSetHasher {
        assert!(size > 0, "files of 0 bytes");
        FileSetHasher {
            size,
            file: Context::new(&SHA256),
            in_file: 0,
            files: Context::new(&SHA256),
            len: 0,
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        while !data.is_empty() {
            let n = data.len().min(self.size - self.in_file);
            self.file.update(&data[..n]);
            self.in_file += n;
            data = &data[n..];
            if self.in_file == self.size {
                self.end_file();
            }
        }
    }

    fn end_file(&mut self) {
        let done = std::mem::replace(&mut self.file, Context::new(&SHA256)).finish();
        self.files.update(done.as_ref());
        self.in_file = 0;
    }

    /// The answer ([`ANSWER_LEN`] bytes).
    pub fn finish(mut self) -> Vec<u8> {
        if self.in_file > 0 {
            self.end_file();
        }
        let mut a = self.len.to_be_bytes().to_vec();
        a.extend_from_slice(self.files.finish().as_ref());
        a
    }
}

/// A file's sha256 in hex, as `sha256sum` prints it, read in pieces (no
/// memory of the file's size, no subprocess). Used by `bench bicast`.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => ctx.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_file_is_what_sha256sum_prints() {
        let p = std::env::temp_dir().join(format!("quicsdn-fileset-{}", std::process::id()));
        // FIPS 180-2 example: sha256("abc"), over a piece boundary too.
        std::fs::write(&p, b"abc").unwrap();
        let abc = sha256_file(&p);
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        std::fs::write(&p, &big).unwrap();
        let long = sha256_file(&p);
        std::fs::remove_file(&p).unwrap();
        assert_eq!(
            abc.unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let want: String = ring::digest::digest(&SHA256, &big)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(long.unwrap(), want);
        assert!(sha256_file(std::path::Path::new("/nonexistent/quicsdn")).is_err());
    }

    #[test]
    fn any_split_gives_the_same_answer_and_one_changed_byte_another() {
        let files: Vec<Vec<u8>> = (0..5).map(|i| file(7, i, 500)).collect();
        let all: Vec<u8> = files.concat();
        let mut whole = FileSetHasher::new(500);
        whole.update(&all);
        let whole = whole.finish();
        let mut pieces = FileSetHasher::new(500);
        for c in all.chunks(333) {
            pieces.update(c);
        }
        assert_eq!(pieces.finish(), whole);
        assert_eq!(whole.len(), ANSWER_LEN);
        // The fold is of per-file sha256s, as `sha256sum` computes them.
        let mut fold = Context::new(&SHA256);
        for f in &files {
            fold.update(ring::digest::digest(&SHA256, f).as_ref());
        }
        assert_eq!(&whole[8..], fold.finish().as_ref());
        let mut bad = all.clone();
        bad[1234] ^= 1;
        let mut h = FileSetHasher::new(500);
        h.update(&bad);
        assert_ne!(h.finish(), whole);
    }
}
