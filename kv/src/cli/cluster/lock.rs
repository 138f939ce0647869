//! One console per cluster dir: `kv cluster` holds an exclusive lock on `DIR/cluster.lock` (which
//! names its process) for as long as it runs, so a second `kv cluster` on the same dir is refused
//! before it starts anything or prints a banner.

use std::fs::File;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::Path;

use thiserror::Error;

/// The lock file in a cluster's dir.
pub const LOCK_FILE: &str = "cluster.lock";

/// The dir's lock, released when dropped (or when the process ends, however it ends).
pub struct DirLock {
    _file: File,
}

/// Why the dir's lock was not taken.
#[derive(Debug, Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another `kv cluster` ({holder}) is running on {dir}: stop it first (Ctrl-C in its \
         terminal), or use --data-dir DIR or --temp for another cluster"
    )]
    InUse {
        /// The dir.
        dir: String,
        /// `pid N`, as the lock file names it.
        holder: String,
    },
    /// The lock file could not be opened, locked or written.
    #[error("{path}: {why}")]
    Io {
        /// The lock file.
        path: String,
        /// Why.
        why: String,
    },
}

impl DirLock {
    /// Take `dir`'s lock, without waiting, and write this process's id into it.
    pub fn take(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |e: std::io::Error| LockError::Io {
            path: path.display().to_string(),
            why: e.to_string(),
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(e));
            }
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let holder = match pid.trim() {
                "" => "pid unknown".to_string(),
                p => format!("pid {p}"),
            };
            let dir = dir.display().to_string();
            return Err(LockError::InUse { dir, holder });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_dir_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::take(dir.path()).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        match DirLock::take(dir.path()) {
            Err(LockError::InUse { holder, .. }) => {
                assert_eq!(holder, format!("pid {}", std::process::id()))
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        drop(first);
        assert!(DirLock::take(dir.path()).is_ok(), "released on drop");
    }
}
