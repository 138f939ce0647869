//! The numbers `kv bench --data-scale` derives: latency quantiles, medians over runs, each
//! member's peak resident memory (sampled from `/proc` while the scenario runs) and the disk
//! its data dir takes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the sampler reads each member's memory.
const RSS_SAMPLE_MS: u64 = 200;

/// The `q` quantile (0..=1) of `sorted` (ascending), 0 for none: the value at index
/// ⌊len × q⌋, as the other benches take it.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or(0.0)
}

/// The median of `values` (the mean of the middle two for an even count), `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The peak resident memory of process `pid` so far, bytes: the larger of `VmHWM` and `VmRSS`
/// in `/proc/PID/status` (`None`: the process is gone, or not Linux).
fn process_rss_peak_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..].split_whitespace().next()?.parse().ok()
    };
    let peak_kib = kib("VmHWM:").max(kib("VmRSS:"))?;
    Some(peak_kib * 1024)
}

/// Each member's current process and the peak memory seen of its processes so far, member by
/// member (a member's processes change as it is restarted or replaced).
#[derive(Debug)]
pub struct RssTable {
    /// The current process of each member, `None` while it is down.
    pids: Mutex<Vec<Option<u32>>>,
    /// The largest peak seen of each member's processes, bytes.
    peaks_bytes: Mutex<Vec<u64>>,
}

impl RssTable {
    /// A table of `members` members, none running.
    pub fn new(members: usize) -> RssTable {
        RssTable {
            pids: Mutex::new(vec![None; members]),
            peaks_bytes: Mutex::new(vec![0; members]),
        }
    }

    /// Member `slot` runs as process `pid` now (`None`: it is down).
    pub fn set_pid(&self, slot: usize, pid: Option<u32>) {
        let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pids.get_mut(slot) {
            *p = pid;
        }
    }

    /// Read every running member's peak now, and keep the largest per member.
    pub fn sample(&self) {
        let pids = self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut peaks = self.peaks_bytes.lock().unwrap_or_else(|p| p.into_inner());
        for (slot, pid) in pids.iter().enumerate() {
            let seen = pid.and_then(process_rss_peak_bytes).unwrap_or(0);
            if let Some(p) = peaks.get_mut(slot) {
                *p = (*p).max(seen);
            }
        }
    }

    /// The largest peak seen of each member's processes, bytes.
    pub fn peaks_bytes(&self) -> Vec<u64> {
        self.peaks_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A thread sampling an [`RssTable`] every [`RSS_SAMPLE_MS`] until stopped.
pub struct RssSampler {
    /// Set to end the sampling.
    stop: Arc<AtomicBool>,
    /// The sampling thread (`None` once joined).
    thread: Option<JoinHandle<()>>,
}

impl RssSampler {
    /// Start sampling `table`.
    pub fn start(table: Arc<RssTable>) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                table.sample();
                std::thread::sleep(Duration::from_millis(RSS_SAMPLE_MS));
            }
        });
        RssSampler {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The disk that `dir` and everything under it take, bytes (allocated blocks, as `du` counts
/// them; symbolic links are not followed, and entries that vanish meanwhile count nothing).
pub fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return own;
    };
    own + entries
        .filter_map(Result::ok)
        .map(|e| dir_bytes(&e.path()))
        .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_medians_of_small_sets() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.99), 4.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn this_process_has_a_peak_and_a_dir_has_a_size() {
        let table = RssTable::new(2);
        table.set_pid(0, Some(std::process::id()));
        table.sample();
        let peaks = table.peaks_bytes();
        assert!(peaks[0] > 0, "{peaks:?}");
        assert_eq!(peaks[1], 0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![1u8; 64 << 10]).unwrap();
        assert!(dir_bytes(dir.path()) >= 64 << 10);
    }
}
