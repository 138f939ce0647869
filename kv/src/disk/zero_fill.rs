//! raft-engine's files, with the space ahead of the writes filled with written zeros instead of
//! `fallocate`d.
//!
//! raft-engine grows its active file 2 MiB at a time with `fallocate`. On ext4 (and XFS) that
//! space is a run of *unwritten* extents: each batch written into it converts part of a run to
//! written, so every `fdatasync` of the log also writes the extent tree and the inode, two more
//! I/Os besides the data and the flush. Measured on this project's test machines, an `fdatasync`
//! after a 4 KiB write into written space takes 94–137 µs at the median, into `fallocate`d space
//! 178–206 µs, and appending past the end 168–259 µs. Every write of the store waits for one on
//! the leader and one on a follower.
//!
//! [`ZeroFilled`] is raft-engine's default file system but for that one call: it writes the
//! zeros (in 256 KiB pieces), so that the metadata is written once per 2 MiB (by the next sync
//! of the log), not once per batch. It does not sync them itself: raft-engine only warns when
//! an allocation fails, and an fsync here could report, and so consume, a writeback error of a
//! batch that the log's own sync must then see. What a crash leaves is unchanged: the active file ends in zeros past its last
//! batch, which `engine_log`'s open drops exactly as it drops `fallocate`'s.

use std::io::{Result as IoResult, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use raft_engine::env::{DefaultFileSystem, FileSystem, Handle, Permission, WriteExt};

type Inner = DefaultFileSystem;
type InnerHandle = <Inner as FileSystem>::Handle;

/// Zeros written per call while filling.
const FILL_CHUNK_BYTES: usize = 256 << 10;

/// raft-engine's default file system, filling ahead with written zeros (see the module docs).
pub struct ZeroFilled(Inner);

impl ZeroFilled {
    /// The file system.
    pub fn new() -> Self {
        ZeroFilled(DefaultFileSystem)
    }
}

impl Default for ZeroFilled {
    fn default() -> Self {
        Self::new()
    }
}

/// A writer of a log file whose `allocate` writes zeros.
pub struct ZeroFillWriter {
    inner: <Inner as FileSystem>::Writer,
    handle: Arc<InnerHandle>,
}

impl Write for ZeroFillWriter {
    fn write(&mut self, buf: &[u8]) -> IoResult<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> IoResult<()> {
        self.inner.flush()
    }
}

impl Seek for ZeroFillWriter {
    fn seek(&mut self, pos: SeekFrom) -> IoResult<u64> {
        self.inner.seek(pos)
    }
}

impl WriteExt for ZeroFillWriter {
    fn truncate(&mut self, offset: usize) -> IoResult<()> {
        self.inner.truncate(offset)
    }

    /// Write `size` zeros at `offset` (past everything written so far), not synced (see the
    /// module docs). The writer's position is not moved: raft-engine writes its next batch
    /// where it was.
    fn allocate(&mut self, offset: usize, size: usize) -> IoResult<()> {
        let end = offset
            .checked_add(size)
            .expect("an allocation past usize::MAX bytes");
        debug_assert!(
            self.handle.file_size()? <= offset,
            "allocating over written data"
        );
        let zeros = vec![0u8; FILL_CHUNK_BYTES.min(size)];
        let mut at = offset;
        while at < end {
            let n = (end - at).min(zeros.len());
            let wrote = self.handle.write(at, &zeros[..n])?;
            assert!(wrote > 0, "a write of {n} zeros at {at} wrote nothing");
            at += wrote;
        }
        Ok(())
    }
}

impl FileSystem for ZeroFilled {
    type Handle = InnerHandle;
    type Reader = <Inner as FileSystem>::Reader;
    type Writer = ZeroFillWriter;

    fn create<P: AsRef<Path>>(&self, path: P) -> IoResult<Self::Handle> {
        self.0.create(path)
    }

    fn open<P: AsRef<Path>>(&self, path: P, perm: Permission) -> IoResult<Self::Handle> {
        self.0.open(path, perm)
    }

    fn delete<P: AsRef<Path>>(&self, path: P) -> IoResult<()> {
        self.0.delete(path)
    }

    fn rename<P: AsRef<Path>>(&self, src_path: P, dst_path: P) -> IoResult<()> {
        self.0.rename(src_path, dst_path)
    }

    fn new_reader(&self, handle: Arc<Self::Handle>) -> IoResult<Self::Reader> {
        self.0.new_reader(handle)
    }

    fn new_writer(&self, handle: Arc<Self::Handle>) -> IoResult<Self::Writer> {
        Ok(ZeroFillWriter {
            inner: self.0.new_writer(handle.clone())?,
            handle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_writes_zeros_ahead_and_leaves_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let fs = ZeroFilled::new();
        let path = dir.path().join("f");
        let handle = Arc::new(fs.create(&path).unwrap());
        let mut w = fs.new_writer(handle.clone()).unwrap();
        w.write_all(b"batch").unwrap();
        w.allocate(5, 3 << 20).unwrap();
        assert_eq!(handle.file_size().unwrap(), 5 + (3 << 20));
        w.write_all(b"next").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            &bytes[..9],
            b"batchnext",
            "the next write lands after the first"
        );
        assert!(bytes[9..].iter().all(|&b| b == 0), "the rest is zeros");
        w.truncate(9).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 9);
    }
}
