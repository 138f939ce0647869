//! A raft snapshot on the wire: raft's `MsgSnapshot` carries only a small descriptor (the
//! snapshot's id, in the machine part of the snapshot envelope), and the state itself travels
//! before it, on the same lane of the peer connection, as chunks of a stream (`state::stream`),
//! each a peer message of its own.
//!
//! A chunk: the magic `KVSC`, from (u64), to (u64), group (u64), id (u64), seq (u32), a flags
//! byte (`LAST` on the stream's last chunk), then the stream's bytes. A descriptor: the magic
//! `KVSD` and the id (u64). Numbers are big-endian; decoding takes nothing on trust.

use thiserror::Error;

/// The first bytes of a chunk message.
pub const CHUNK_MAGIC: &[u8; 4] = b"KVSC";
/// The first bytes of a descriptor.
pub const DESCRIPTOR_MAGIC: &[u8; 4] = b"KVSD";
/// The flag on a stream's last chunk.
pub const LAST: u8 = 1;
/// Bytes of stream a chunk carries at most.
pub const CHUNK_BYTES: usize = 1 << 20;

const HEADER: usize = 4 + 8 * 4 + 4 + 1;

/// One piece of a snapshot's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The sending node.
    pub from: u64,
    /// The receiving node.
    pub to: u64,
    /// The raft group.
    pub group: u64,
    /// The snapshot's id (its descriptor's).
    pub id: u64,
    /// The chunk's place in the stream, from 0.
    pub seq: u32,
    /// Whether it is the stream's last.
    pub last: bool,
    /// The stream's bytes.
    pub bytes: Vec<u8>,
}

/// Why bytes are not a chunk or a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChunkError {
    /// Cut short, or more bytes than a chunk may carry.
    #[error("snapshot chunk cut short or too long")]
    Length,
    /// Flags other than `LAST`.
    #[error("snapshot chunk with unknown flags {0:#x}")]
    Flags(u8),
    /// Not a chunk (or descriptor) at all.
    #[error("not a snapshot chunk or descriptor (bad magic)")]
    Magic,
}

impl Chunk {
    /// The chunk as a peer message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.bytes.len() <= CHUNK_BYTES,
            "a chunk of {} bytes",
            self.bytes.len()
        );
        let mut out = Vec::with_capacity(HEADER + self.bytes.len());
        out.extend_from_slice(CHUNK_MAGIC);
        for n in [self.from, self.to, self.group, self.id] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(if self.last { LAST } else { 0 });
        out.extend_from_slice(&self.bytes);
        out
    }

    /// A peer message's bytes as a chunk.
    pub fn decode(b: &[u8]) -> Result<Chunk, ChunkError> {
        if !b.starts_with(CHUNK_MAGIC) {
            return Err(ChunkError::Magic);
        }
        if b.len() < HEADER || b.len() - HEADER > CHUNK_BYTES {
            return Err(ChunkError::Length);
        }
        let n = |i: usize| u64::from_be_bytes(b[4 + i * 8..12 + i * 8].try_into().expect("8"));
        let flags = b[HEADER - 1];
        if flags & !LAST != 0 {
            return Err(ChunkError::Flags(flags));
        }
        Ok(Chunk {
            from: n(0),
            to: n(1),
            group: n(2),
            id: n(3),
            seq: u32::from_be_bytes(b[36..40].try_into().expect("4")),
            last: flags & LAST != 0,
            bytes: b[HEADER..].to_vec(),
        })
    }
}

/// A snapshot's descriptor: what the machine part of its envelope holds on the wire.
pub fn descriptor(id: u64) -> Vec<u8> {
    let mut out = DESCRIPTOR_MAGIC.to_vec();
    out.extend_from_slice(&id.to_be_bytes());
    out
}

/// The id a descriptor names; `None` if `machine` is not one (a stream, or nothing).
pub fn descriptor_id(machine: &[u8]) -> Option<u64> {
    match machine {
        [m @ .., a, b, c, d, e, f, g, h] if m == DESCRIPTOR_MAGIC => {
            Some(u64::from_be_bytes([*a, *b, *c, *d, *e, *f, *g, *h]))
        }
        _ => None,
    }
}

/// The machine part of snapshot data (after the envelope's head: `[u32 length][head]`), or
/// `None` if the data is too short to hold the head it claims.
pub fn machine_part(data: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    data.get(4usize.checked_add(len)?..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_descriptors_round_trip_and_garbage_is_refused() {
        let c = Chunk {
            from: 1,
            to: 2,
            group: 3,
            id: u64::MAX,
            seq: 7,
            last: true,
            bytes: b"rows".to_vec(),
        };
        let bytes = c.encode();
        assert_eq!(Chunk::decode(&bytes), Ok(c));
        assert_eq!(Chunk::decode(&bytes[..HEADER - 1]), Err(ChunkError::Length));
        assert_eq!(Chunk::decode(b"rlB\x01"), Err(ChunkError::Magic));
        let mut flags = bytes.clone();
        flags[HEADER - 1] = 0x80;
        assert_eq!(Chunk::decode(&flags), Err(ChunkError::Flags(0x80)));
        let mut long = bytes[..HEADER].to_vec();
        long.resize(HEADER + CHUNK_BYTES + 1, 0);
        assert_eq!(Chunk::decode(&long), Err(ChunkError::Length));
        assert_eq!(descriptor_id(&descriptor(42)), Some(42));
        assert_eq!(descriptor_id(b"KVSS\x01"), None);
        assert_eq!(descriptor_id(&[]), None);
        let data = [&3u32.to_be_bytes()[..], b"abc", &descriptor(9)].concat();
        assert_eq!(machine_part(&data).and_then(descriptor_id), Some(9));
        assert_eq!(machine_part(&[0, 0, 0, 9, 1]), None);
    }
}
