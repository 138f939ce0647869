//! The node's incarnation: a counter in the data dir, raised and written durably at every boot
//! before the node speaks. Shared liveness needs it (see `raft_lease::multi`): a restarted node
//! supports and requests support under a new incarnation, so nothing it said before the restart
//! is counted again. One fsync per boot, none per heartbeat.

use std::path::Path;

use crate::disk::marker::{io, write_durably, DirError};

/// The file holding the last incarnation (decimal).
pub const FILE: &str = "incarnation";

/// The incarnation of this boot: one above the dir's last (1 for a new dir), written durably.
/// With `required` (a dir that has run with shared liveness before), a missing file is refused:
/// starting again from 1 could repeat an incarnation peers still count fortifications under.
pub fn next(dir: &Path, required: bool) -> Result<u32, DirError> {
    let path = dir.join(FILE);
    let last = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|e| DirError::BadMarker {
                path: path.display().to_string(),
                why: format!("incarnation: {e}"),
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DirError::BadMarker {
                path: path.display().to_string(),
                why: "missing from a data dir that has run: starting again from 1 could repeat \
                      an incarnation peers still count fortifications under; remove the node and \
                      add it back on a new dir"
                    .into(),
            })
        }
        Err(e) => return Err(io(&path, e)),
    };
    let next = last.checked_add(1).ok_or_else(|| DirError::BadMarker {
        path: path.display().to_string(),
        why: "incarnation: no higher one left".into(),
    })?;
    write_durably(dir, FILE, &next.to_string())?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_boot_gets_a_higher_incarnation_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            next(dir.path(), true).is_err(),
            "a dir that ran needs its file"
        );
        assert_eq!(next(dir.path(), false).unwrap(), 1);
        assert_eq!(next(dir.path(), true).unwrap(), 2);
        std::fs::write(dir.path().join(FILE), "x").unwrap();
        assert!(matches!(
            next(dir.path(), false),
            Err(DirError::BadMarker { .. })
        ));
        std::fs::write(dir.path().join(FILE), u32::MAX.to_string()).unwrap();
        assert!(
            next(dir.path(), false).is_err(),
            "never wraps to an old one"
        );
    }
}
