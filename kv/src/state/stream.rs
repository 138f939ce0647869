//! A group's state as a stream of rows: what a raft snapshot carries. The sender reads one view
//! of the engine (one applied index) and writes every row of the group's generation, table by
//! table, in chunks of bounded size; the receiver parses the bytes as they come, with bounded
//! memory, and refuses anything that does not add up (a forged, truncated or damaged stream)
//! with a clear error before a row of it is used.
//!
//! An empty stream (no bytes at all) stands for an empty state: the cluster's bootstrap
//! snapshot carries none.
//!
//! The format: the magic `KVSS`, a version byte, then records. A row record is a table byte
//! (a [`Table`] code), the key's length (u32) and bytes (without the generation prefix), the
//! value's length (u32) and bytes. The end record is the byte `0xFF`, the number of rows (u64)
//! and the FNV-1a 64 hash of every byte before the end record (u64). Numbers are big-endian.

use thiserror::Error;

use crate::disk::state_engine::{EngineError, EngineRead, Table};
use crate::state::mvcc::layout;

const MAGIC: &[u8; 4] = b"KVSS";
const VERSION: u8 = 1;
const END: u8 = 0xFF;

/// The largest key a record may carry (the store's keys are far smaller).
pub const MAX_KEY_BYTES: usize = 1 << 20;
/// The largest value a record may carry (a value is bounded by the request limits well below).
pub const MAX_VALUE_BYTES: usize = 64 << 20;

/// The tables a group's generation has rows in.
pub const GROUP_TABLES: [Table; 5] = [
    Table::Latest,
    Table::History,
    Table::Changes,
    Table::LeaseKeys,
    Table::Meta,
];

/// Why a stream was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StreamError {
    /// It does not begin as a state stream of this version.
    #[error("not a state snapshot stream (bad magic or version)")]
    BadHeader,
    /// A record names no table a group has.
    #[error("a record names unknown table {0}")]
    BadTable(u8),
    /// A record claims more bytes than any row has.
    #[error("a record claims {0} bytes, past the limit")]
    TooLarge(usize),
    /// Bytes after the end record.
    #[error("bytes after the end of the stream")]
    Trailing,
    /// The stream ended before its end record.
    #[error("the stream is cut short (no end record)")]
    Truncated,
    /// The end record does not match what came.
    #[error("the stream is damaged: {0}")]
    Mismatch(String),
}

/// FNV-1a 64 over a stream, fed as it comes.
#[derive(Debug, Clone, Copy)]
struct Hash(u64);

impl Hash {
    fn new() -> Self {
        Hash(0xcbf2_9ce4_8422_2325)
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Writes a stream to a sink, in chunks of about `chunk_bytes`.
pub struct StreamWriter<'s> {
    sink: &'s mut dyn FnMut(Vec<u8>) -> Result<(), EngineError>,
    buf: Vec<u8>,
    chunk_bytes: usize,
    hash: Hash,
    rows: u64,
}

impl<'s> StreamWriter<'s> {
    /// A writer handing chunks of about `chunk_bytes` to `sink`.
    pub fn new(
        chunk_bytes: usize,
        sink: &'s mut dyn FnMut(Vec<u8>) -> Result<(), EngineError>,
    ) -> Self {
        let mut w = StreamWriter {
            sink,
            buf: Vec::with_capacity(chunk_bytes + 1024),
            chunk_bytes,
            hash: Hash::new(),
            rows: 0,
        };
        w.emit(MAGIC);
        w.emit(&[VERSION]);
        w
    }

    fn emit(&mut self, bytes: &[u8]) {
        self.hash.feed(bytes);
        self.buf.extend_from_slice(bytes);
    }

    fn flush_if_full(&mut self) -> Result<(), EngineError> {
        if self.buf.len() >= self.chunk_bytes {
            let chunk =
                std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk_bytes + 1024));
            (self.sink)(chunk)?;
        }
        Ok(())
    }

    /// One row of `t` (its key without the generation prefix).
    pub fn row(&mut self, t: Table, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        self.emit(&[t.code()]);
        self.emit(&(key.len() as u32).to_be_bytes());
        self.emit(key);
        self.emit(&(value.len() as u32).to_be_bytes());
        self.emit(value);
        self.rows += 1;
        self.flush_if_full()
    }

    /// The end record; the last chunk goes to the sink.
    pub fn finish(mut self) -> Result<u64, EngineError> {
        let (rows, hash) = (self.rows, self.hash.0);
        self.buf.push(END);
        self.buf.extend_from_slice(&rows.to_be_bytes());
        self.buf.extend_from_slice(&hash.to_be_bytes());
        let last = std::mem::take(&mut self.buf);
        (self.sink)(last)?;
        Ok(rows)
    }
}

/// Write every row of generation `gen` in the state `r` to `w`, table by table.
pub fn write_generation(
    r: &dyn EngineRead,
    gen: u64,
    w: &mut StreamWriter<'_>,
) -> Result<(), EngineError> {
    let prefix = layout::gen_prefix(gen);
    let end = layout::prefix_end(&prefix);
    for t in GROUP_TABLES {
        let mut failed = None;
        r.scan(
            t,
            &prefix,
            end.as_deref(),
            false,
            &mut |k, v| match w.row(t, &k[8..], v) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(())
}

/// One row of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its table.
    pub table: Table,
    /// Its key, without the generation prefix.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
}

/// Parses a stream fed in pieces of any size, holding at most one record beyond what it was fed.
#[derive(Debug)]
pub struct StreamReader {
    pending: Vec<u8>,
    started: bool,
    hash: Hash,
    rows: u64,
    ended: bool,
}

impl Default for StreamReader {
    fn default() -> Self {
        StreamReader {
            pending: Vec::new(),
            started: false,
            hash: Hash::new(),
            rows: 0,
            ended: false,
        }
    }
}

impl StreamReader {
    /// Take the next piece of the stream; the rows it completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Row>, StreamError> {
        if self.ended && !bytes.is_empty() {
            return Err(StreamError::Trailing);
        }
        self.pending.extend_from_slice(bytes);
        let mut rows = Vec::new();
        let mut at = 0;
        if !self.started {
            if self.pending.len() < 5 {
                return Ok(rows);
            }
            if &self.pending[..4] != MAGIC || self.pending[4] != VERSION {
                return Err(StreamError::BadHeader);
            }
            self.hash.feed(&self.pending[..5]);
            (self.started, at) = (true, 5);
        }
        while let Some((row, used)) = self.record(&self.pending[at..])? {
            match row {
                Some(r) => {
                    self.hash.feed(&self.pending[at..at + used]);
                    self.rows += 1;
                    rows.push(r);
                }
                None => {
                    self.ended = true;
                    if self.pending.len() > at + used {
                        return Err(StreamError::Trailing);
                    }
                }
            }
            at += used;
            if self.ended {
                break;
            }
        }
        self.pending.drain(..at);
        Ok(rows)
    }

    /// The next record in `b`: a row or the end (`None`), and its length; `None` if `b` does
    /// not hold all of it yet.
    fn record(&self, b: &[u8]) -> Result<Option<(Option<Row>, usize)>, StreamError> {
        let Some(&tag) = b.first() else {
            return Ok(None);
        };
        if tag == END {
            if b.len() < 17 {
                return Ok(None);
            }
            let rows = u64::from_be_bytes(b[1..9].try_into().expect("8 bytes"));
            let hash = u64::from_be_bytes(b[9..17].try_into().expect("8 bytes"));
            if rows != self.rows || hash != self.hash.0 {
                return Err(StreamError::Mismatch(format!(
                    "{} rows and hash {:016x} came, the end says {rows} and {hash:016x}",
                    self.rows, self.hash.0
                )));
            }
            return Ok(Some((None, 17)));
        }
        let table = Table::of_code(tag)
            .filter(|t| GROUP_TABLES.contains(t))
            .ok_or(StreamError::BadTable(tag))?;
        let len_at = |i: usize| -> Option<usize> {
            Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize)
        };
        let Some(key_len) = len_at(1) else {
            return Ok(None);
        };
        if key_len > MAX_KEY_BYTES {
            return Err(StreamError::TooLarge(key_len));
        }
        let Some(value_len) = len_at(5 + key_len) else {
            return Ok(None);
        };
        if value_len > MAX_VALUE_BYTES {
            return Err(StreamError::TooLarge(value_len));
        }
        let used = 9 + key_len + value_len;
        if b.len() < used {
            return Ok(None);
        }
        let row = Row {
            table,
            key: b[5..5 + key_len].to_vec(),
            value: b[9 + key_len..used].to_vec(),
        };
        Ok(Some((Some(row), used)))
    }

    /// The stream is over: refused unless its end record came and matched.
    pub fn finish(&self) -> Result<u64, StreamError> {
        match self.ended {
            true => Ok(self.rows),
            false => Err(StreamError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::state_engine::{EngineWrite, StateEngine};

    fn stream_of(rows: &[(Table, &[u8], &[u8])], chunk: usize) -> Vec<Vec<u8>> {
        let mut chunks = Vec::new();
        let mut sink = |c: Vec<u8>| {
            chunks.push(c);
            Ok(())
        };
        let mut w = StreamWriter::new(chunk, &mut sink);
        for (t, k, v) in rows {
            w.row(*t, k, v).unwrap();
        }
        w.finish().unwrap();
        chunks
    }

    fn parse(bytes: &[u8], piece: usize) -> Result<Vec<Row>, StreamError> {
        let mut r = StreamReader::default();
        let mut out = Vec::new();
        for p in bytes.chunks(piece.max(1)) {
            out.extend(r.feed(p)?);
        }
        r.finish()?;
        Ok(out)
    }

    #[test]
    fn a_stream_round_trips_in_pieces_of_any_size() {
        let rows: Vec<(Table, &[u8], &[u8])> = vec![
            (Table::Latest, b"a", b"1"),
            (Table::History, b"", b""),
            (Table::Meta, b"counters", &[7; 300]),
        ];
        let bytes = stream_of(&rows, 16).concat();
        for piece in [1, 2, 7, 64, bytes.len()] {
            let got = parse(&bytes, piece).unwrap();
            let want: Vec<Row> = rows
                .iter()
                .map(|(t, k, v)| Row {
                    table: *t,
                    key: k.to_vec(),
                    value: v.to_vec(),
                })
                .collect();
            assert_eq!(got, want, "pieces of {piece}");
        }
    }

    #[test]
    fn a_forged_truncated_or_damaged_stream_is_refused() {
        let bytes = stream_of(&[(Table::Latest, b"k", b"value")], 1 << 20).concat();
        assert_eq!(
            parse(&bytes[..bytes.len() - 1], 4).unwrap_err(),
            StreamError::Truncated
        );
        assert_eq!(parse(&bytes[..10], 3).unwrap_err(), StreamError::Truncated);
        let mut flipped = bytes.clone();
        flipped[16] ^= 1; // a byte of the value
        assert!(matches!(parse(&flipped, 5), Err(StreamError::Mismatch(_))));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(parse(&trailing, 5).unwrap_err(), StreamError::Trailing);
        assert_eq!(parse(b"NOPE\x01", 5).unwrap_err(), StreamError::BadHeader);
        let mut huge = b"KVSS\x01\x00".to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(
            matches!(parse(&huge, 64), Err(StreamError::TooLarge(_))),
            "a length is a claim"
        );
        let bad_table = b"KVSS\x01\x05\0\0\0\0\0\0\0\0".to_vec();
        assert_eq!(parse(&bad_table, 64).unwrap_err(), StreamError::BadTable(5));
    }

    #[test]
    fn a_generation_streams_only_its_own_rows() {
        let e = StateEngine::in_memory();
        e.write(false, |w| {
            w.put(Table::Latest, &layout::latest_key(1, b"x"), b"one")?;
            w.put(Table::Latest, &layout::latest_key(2, b"y"), b"two")?;
            w.put(Table::Meta, &layout::meta_key(2, "m"), b"meta")
        })
        .unwrap();
        let mut chunks = Vec::new();
        let mut sink = |c: Vec<u8>| {
            chunks.push(c);
            Ok(())
        };
        let mut w = StreamWriter::new(8, &mut sink);
        write_generation(&e.view().unwrap(), 2, &mut w).unwrap();
        assert_eq!(w.finish().unwrap(), 2);
        let rows = parse(&chunks.concat(), 3).unwrap();
        assert_eq!(rows[0].key, b"y");
        assert_eq!((rows[1].table, &rows[1].key[..]), (Table::Meta, &b"m"[..]));
    }
}
