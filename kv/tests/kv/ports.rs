//! Ports for test clusters that no other test process takes, even test binaries of other checkouts
//! running at the same time: a port is reserved by an exclusive `flock` on a file named for it in
//! a shared directory (held until the reservation is dropped, released by the kernel if the
//! process dies), and chosen outside the kernel's ephemeral range (32768 and up), where outgoing
//! connections take their local ports. A node that still finds its port taken exits with
//! "Address already in use", and `Cluster::start` starts over on new ports.

use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ports are chosen in this range.
const RANGE: std::ops::Range<u16> = 20_000..32_000;

/// A reserved port; the reservation ends when it is dropped.
#[derive(Debug)]
pub struct Port {
    /// The port.
    pub port: u16,
    _lock: File,
}

fn lock_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join("raft-lease-kv-test-ports");
    std::fs::create_dir_all(&d).expect("create the port lock dir");
    d
}

/// A pseudo-random sequence, different per process and per call.
fn next_candidate() -> u16 {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t
        ^ ((std::process::id() as u64) << 32)
        ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    RANGE.start + (x % (RANGE.end - RANGE.start) as u64) as u16
}

/// Try to reserve `port`: its lock file is free and the port can be bound now.
pub fn try_reserve(port: u16) -> Option<Port> {
    let f = File::create(lock_dir().join(port.to_string())).ok()?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked || TcpListener::bind(("127.0.0.1", port)).is_err() {
        return None;
    }
    Some(Port { port, _lock: f })
}

/// Reserve a free port.
pub fn reserve() -> Port {
    (0..10_000)
        .find_map(|_| try_reserve(next_candidate()))
        .expect("no free port in 10,000 tries")
}

/// Reserve `base+1..=base+n`, `base+1001..=base+1000+n` and `base+2001..=base+2000+n` for
/// `kv cluster` (peers, HTTP, etcd API): the base.
pub fn reserve_base(n: u16) -> (u16, Vec<Port>) {
    let offsets: Vec<u16> = (1..=n).flat_map(|i| [i, 1000 + i, 2000 + i]).collect();
    reserve_offsets(&offsets)
}

/// A base port with `base + o` free and reserved for every offset `o` in `offsets`.
pub fn reserve_offsets(offsets: &[u16]) -> (u16, Vec<Port>) {
    let top = offsets.iter().copied().max().unwrap_or(0);
    for _ in 0..10_000 {
        let base = next_candidate().min(RANGE.end - top - 1);
        let ports: Option<Vec<Port>> = offsets.iter().map(|o| try_reserve(base + o)).collect();
        if let Some(p) = ports {
            return (base, p);
        }
    }
    panic!("no free base port in 10,000 tries");
}
