//! The disk's own limit, measured where the bench's data dirs are: the latency of appending
//! 4 KiB to a file and `fdatasync`ing it, the floor under a replicated write.

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

/// `(p50, p99)` in µs of `n` 4 KiB appends each followed by `fdatasync`, in a file in `dir`.
pub fn fdatasync_us(dir: &Path, n: usize) -> std::io::Result<(f64, f64)> {
    assert!(n > 0, "at least one sample");
    let path = dir.join("fdatasync-probe");
    let mut f = std::fs::File::create(&path)?;
    let block = [0x5au8; 4096];
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    drop(f);
    std::fs::remove_file(&path)?;
    lat.sort_unstable();
    let at = |q: f64| lat[((n as f64 * q) as usize).min(n - 1)] as f64 / 1e3;
    Ok((at(0.5), at(0.99)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (p50, p99) = fdatasync_us(dir.path(), 5).unwrap();
        assert!(p50 > 0.0 && p99 >= p50, "{p50} {p99}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
