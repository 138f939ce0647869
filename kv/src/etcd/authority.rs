//! `:authority` as etcd's Go clients send it, made acceptable to the HTTP/2 server.
//!
//! clientv3 3.4 sends the endpoint as written (`http://127.0.0.1:2379`), 3.5.0 sends
//! `#initially=[https://host:2379]`, and some 3.5 releases send other forms with several
//! endpoints. Go's server accepts them; the `h2` crate under tonic resets such a stream as
//! malformed, and has no setting to accept them. So each client connection's bytes pass through
//! [`Rewriter`] on their way to the server: it reads HTTP/2 frames, decodes each header block
//! with the client's HPACK context, puts the `host:port` an `:authority` names in its place (or
//! leaves it out when it names none: the server uses only the path), and encodes every block
//! again with a context of its own that the server's decoder follows. Everything else passes
//! through unchanged, and a connection that does not open with HTTP/2's preface (HTTP/1.1) is
//! not touched at all.

use axum::http::uri::Authority;
use loona_hpack::{Decoder, Encoder};

/// HTTP/2's client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The frame types and flags this reads.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame sent on to the server (HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which
/// the server keeps).
const MAX_FRAME_BYTES: usize = 16_384;

/// The largest header block a client may send (its fragments together); past it the
/// connection is refused.
pub const MAX_HEADER_BLOCK_BYTES: usize = 1 << 20;

/// Why a connection's bytes cannot be passed on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    /// A header block that does not decode (HPACK's COMPRESSION_ERROR).
    #[error("a header block that does not decode: {0}")]
    BadHeaderBlock(String),
    /// Frames that break HTTP/2's rules for header blocks.
    #[error("malformed header frames: {0}")]
    Malformed(&'static str),
    /// A header block past [`MAX_HEADER_BLOCK_BYTES`].
    #[error("a header block of more than {MAX_HEADER_BLOCK_BYTES} bytes")]
    TooLarge,
}

/// Where the rewriter is in the connection.
enum State {
    /// Before the preface is whole (what came so far matches it).
    Preface,
    /// HTTP/2 frames.
    Frames,
    /// Not HTTP/2: every byte passes through.
    Passthrough,
}

/// A header block being gathered: its HEADERS frame's stream and flags, its priority fields,
/// and its fragments so far.
struct Block {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server bytes of one connection, rewritten as the module says.
pub struct Rewriter {
    state: State,
    /// Bytes read from the client and not yet handled.
    input: Vec<u8>,
    /// Payload bytes of a frame that pass through as they come.
    passing: usize,
    /// The header block being gathered, if any.
    block: Option<Block>,
    /// The client's HPACK context.
    decoder: Decoder<'static>,
    /// The context the server's decoder follows.
    encoder: Encoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            state: State::Preface,
            input: Vec::new(),
            passing: 0,
            block: None,
            decoder: Decoder::new(),
            encoder: Encoder::new(),
        }
    }
}

impl Rewriter {
    /// A rewriter that passes every byte through untouched.
    pub fn passthrough() -> Rewriter {
        Rewriter {
            state: State::Passthrough,
            ..Rewriter::default()
        }
    }

    /// Take `bytes` read from the client; append to `out` what the server is to read.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if let State::Passthrough = self.state {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        self.input.extend_from_slice(bytes);
        if let State::Preface = self.state {
            let n = self.input.len().min(PREFACE.len());
            if self.input[..n] != PREFACE[..n] {
                self.state = State::Passthrough;
                out.append(&mut self.input);
                return Ok(());
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            out.extend(self.input.drain(..PREFACE.len()));
            self.state = State::Frames;
        }
        self.frames(out)
    }

    /// Handle every whole frame (or passing payload) in the input.
    fn frames(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        loop {
            if self.passing > 0 {
                let n = self.passing.min(self.input.len());
                out.extend(self.input.drain(..n));
                self.passing -= n;
                if self.passing > 0 {
                    return Ok(());
                }
            }
            if self.input.len() < 9 {
                return Ok(());
            }
            let len = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            let (ty, flags) = (self.input[3], self.input[4]);
            let stream =
                u32::from_be_bytes([self.input[5], self.input[6], self.input[7], self.input[8]])
                    & 0x7fff_ffff;
            let header_frame = ty == HEADERS || ty == CONTINUATION;
            if self.block.is_some() && ty != CONTINUATION {
                return Err(RewriteError::Malformed("a frame inside a header block"));
            }
            if !header_frame {
                out.extend(self.input.drain(..9));
                self.passing = len;
                continue;
            }
            if len > MAX_HEADER_BLOCK_BYTES {
                return Err(RewriteError::TooLarge);
            }
            if self.input.len() < 9 + len {
                return Ok(());
            }
            let payload: Vec<u8> = self.input.drain(..9 + len).skip(9).collect();
            self.header_frame(ty, flags, stream, payload, out)?;
        }
    }

    /// A HEADERS or CONTINUATION frame: its fragment joins the block, and a whole block is
    /// rewritten and sent on.
    fn header_frame(
        &mut self,
        ty: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        match (ty, &mut self.block) {
            (HEADERS, None) => self.block = Some(headers_block(flags, stream, payload)?),
            (CONTINUATION, Some(b)) if b.stream == stream => {
                if b.fragment.len() + payload.len() > MAX_HEADER_BLOCK_BYTES {
                    return Err(RewriteError::TooLarge);
                }
                b.fragment.extend_from_slice(&payload);
            }
            _ => return Err(RewriteError::Malformed("a CONTINUATION out of place")),
        }
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let block = self.block.take().expect("a block was just gathered");
        let fields = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| RewriteError::BadHeaderBlock(format!("{e:?}")))?;
        let fields: Vec<(Vec<u8>, Vec<u8>)> = fields
            .into_iter()
            .filter_map(|(name, value)| match name.as_slice() {
                b":authority" => authority(&value).map(|a| (name, a)),
                _ => Some((name, value)),
            })
            .collect();
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        write_block(&block, &encoded, out);
        Ok(())
    }
}

/// A HEADERS frame's block, its padding taken off and its priority fields kept.
fn headers_block(flags: u8, stream: u32, mut payload: Vec<u8>) -> Result<Block, RewriteError> {
    if flags & PADDED != 0 {
        let pad = usize::from(
            *payload
                .first()
                .ok_or(RewriteError::Malformed("no pad length"))?,
        );
        if pad + 1 > payload.len() {
            return Err(RewriteError::Malformed("padding longer than the frame"));
        }
        payload.truncate(payload.len() - pad);
        payload.remove(0);
    }
    let priority = if flags & PRIORITY != 0 {
        if payload.len() < 5 {
            return Err(RewriteError::Malformed("priority fields cut short"));
        }
        let p: [u8; 5] = payload[..5].try_into().expect("five bytes");
        payload.drain(..5);
        Some(p)
    } else {
        None
    };
    Ok(Block {
        stream,
        flags: flags & !(PADDED | PRIORITY | END_HEADERS),
        priority,
        fragment: payload,
    })
}

/// `encoded` as a HEADERS frame with `block`'s stream, flags and priority, and CONTINUATION
/// frames where it does not fit one frame.
fn write_block(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let prefix: &[u8] = block.priority.as_ref().map_or(&[], |p| &p[..]);
    let first_room = MAX_FRAME_BYTES - prefix.len();
    let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
    let mut flags = block.flags
        | if block.priority.is_some() {
            PRIORITY
        } else {
            0
        };
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_header(
        prefix.len() + first.len(),
        HEADERS,
        flags,
        block.stream,
        out,
    );
    out.extend_from_slice(prefix);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME_BYTES));
        let end = if after.is_empty() { END_HEADERS } else { 0 };
        frame_header(chunk.len(), CONTINUATION, end, block.stream, out);
        out.extend_from_slice(chunk);
        rest = after;
    }
}

/// A frame's nine-byte header.
fn frame_header(len: usize, ty: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    assert!(len <= MAX_FRAME_BYTES, "a frame of {len} bytes");
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// The `host:port` an `:authority` value names: itself when it is one; the first endpoint of a
/// URL or of `#initially=[...]` otherwise; `None` when it names none (the field is left out).
pub fn authority(value: &[u8]) -> Option<Vec<u8>> {
    if Authority::try_from(value).is_ok() {
        return Some(value.to_vec());
    }
    let text = std::str::from_utf8(value).ok()?;
    let inner = text
        .strip_prefix("#initially=[")
        .map_or(text, |t| t.trim_end_matches(']'));
    let first = inner.split([';', ',', ' ']).find(|s| !s.is_empty())?;
    let no_scheme = first.split_once("://").map_or(first, |(_, rest)| rest);
    let host_port = no_scheme.split('/').next()?;
    Authority::try_from(host_port)
        .ok()
        .map(|a| a.as_str().as_bytes().to_vec())
}

#[cfg(test)]
mod tests;
