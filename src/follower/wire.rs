//! What follower read leases add to raft messages, as a trailer after whatever context the
//! message already carries (raft's own, or the layer's round and read tags), so that both the
//! existing contexts and raft-rs see exactly the bytes they did before once it is split off.
//!
//! - From the leader, on heartbeats and appends: a [`LeaderNote`], the exposed index `E`, at
//!   most one [`Grant`] for the receiving node, and the term whose read leases it asks its
//!   holders to give up (a transfer or a membership change waits for them).
//! - From a voter, on heartbeat and append responses: a [`HolderNote`], the fresh [`AckTag`] the
//!   voter recorded its clock for, and the last tag of a give-up, if it gave one up.
//!
//! Layout: `context ‖ body ‖ body length (u16, big-endian) ‖ kind (1 byte) ‖ MAGIC`. A context
//! that does not end in the magic has no trailer. One that ends in it but does not parse is a
//! [`WireError`]: the message is dropped, never half-read.

use thiserror::Error;

use crate::follower::grants::{AckTag, Grant};

/// The last bytes of every trailer.
pub const MAGIC: &[u8; 4] = b"rlF\x01";

const LEADER_KIND: u8 = b'L';
const HOLDER_KIND: u8 = b'H';
/// The footer: body length, kind and magic.
const FOOTER_LEN: usize = 2 + 1 + MAGIC.len();
/// A tag: term, boot, sequence.
const TAG_LEN: usize = 3 * 8;
/// A grant: term, tag, grant, drift, margin.
const GRANT_LEN: usize = 8 + TAG_LEN + 3 * 8;
/// The longest body: a leader's exposed index, a grant and an ask.
const MAX_BODY_LEN: usize = 8 + GRANT_LEN + 8;

/// What the leader tells one voter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderNote {
    /// The exposed index `E`: the highest index any replica may apply.
    pub exposed: u64,
    /// A read lease for the receiving voter, answering one of its acknowledgements.
    pub grant: Option<Grant>,
    /// Give up every read lease of this term (and earlier ones) now, and say so: the leader
    /// is transferring leadership or changing its membership, and waits for its holders.
    pub give_up: Option<u64>,
}

/// What a voter tells the leader with an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderNote {
    /// The tag of this acknowledgement: the voter read its clock for it before sending.
    pub tag: Option<AckTag>,
    /// The voter gave up its read lease: every grant of this tag's term answering one of its
    /// tags up to this one, and every grant of an earlier term, is void at the voter
    /// ([`crate::follower::ReadLease::give_up`]).
    pub gave_up: Option<AckTag>,
}

/// A trailer that ends in [`MAGIC`] but is not one this layer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// The length or the kind does not fit the bytes.
    #[error("follower-lease trailer: bad length or kind")]
    Malformed,
    /// A leader's note on a response, or a voter's on a leader's message.
    #[error("follower-lease trailer of kind {0:?} where the other kind belongs")]
    WrongKind(u8),
    /// A zero where zero is never sent: a tag's term or sequence, a grant's term or length.
    #[error("follower-lease trailer: a field that is never zero is zero")]
    Zero,
}

impl LeaderNote {
    /// Append this note to `ctx`.
    pub fn attach(&self, ctx: &mut Vec<u8>) {
        let start = ctx.len();
        put(ctx, self.exposed);
        if let Some(g) = &self.grant {
            assert!(g.term > 0 && g.grant_ns > 0, "an empty grant: {g:?}");
            for v in [g.term, g.tag.term, g.tag.boot, g.tag.seq, g.grant_ns] {
                put(ctx, v);
            }
            put(ctx, g.drift_ppm);
            put(ctx, g.margin_ns);
        }
        if let Some(term) = self.give_up {
            assert!(term > 0, "an ask to give up term 0");
            put(ctx, term);
        }
        footer(ctx, start, LEADER_KIND);
    }

    /// Split a leader's note off `ctx`: the context as it was before, and the note if any.
    pub fn split(ctx: &[u8]) -> Result<(&[u8], Option<LeaderNote>), WireError> {
        let Some((base, body)) = trailer(ctx, LEADER_KIND)? else {
            return Ok((ctx, None));
        };
        let v = words(body)?;
        let (v, give_up) = match v.len() {
            2 | 9 => (&v[..v.len() - 1], Some(v[v.len() - 1])),
            _ => (v.as_slice(), None),
        };
        if give_up == Some(0) {
            return Err(WireError::Zero);
        }
        let note = match v {
            [exposed] => LeaderNote {
                exposed: *exposed,
                grant: None,
                give_up,
            },
            [exposed, term, t_term, boot, seq, grant_ns, drift_ppm, margin_ns] => {
                let tag = tag_of(*t_term, *boot, *seq)?;
                if *term == 0 || *grant_ns == 0 {
                    return Err(WireError::Zero);
                }
                let grant = Grant {
                    term: *term,
                    tag,
                    grant_ns: *grant_ns,
                    drift_ppm: *drift_ppm,
                    margin_ns: *margin_ns,
                };
                LeaderNote {
                    exposed: *exposed,
                    grant: Some(grant),
                    give_up,
                }
            }
            _ => return Err(WireError::Malformed),
        };
        Ok((base, Some(note)))
    }
}

impl HolderNote {
    /// Append this note to `ctx`.
    pub fn attach(&self, ctx: &mut Vec<u8>) {
        assert!(
            self.tag.is_some() || self.gave_up.is_some(),
            "a note that says nothing is not sent"
        );
        let start = ctx.len();
        ctx.push(u8::from(self.tag.is_some()) | u8::from(self.gave_up.is_some()) << 1);
        if let Some(t) = self.tag {
            assert!(t.term > 0 && t.seq > 0, "a tag is never zero: {t:?}");
            for v in [t.term, t.boot, t.seq] {
                put(ctx, v);
            }
        }
        if let Some(t) = self.gave_up {
            assert!(t.term > 0 && t.seq > 0, "a give-up is never zero: {t:?}");
            for v in [t.term, t.boot, t.seq] {
                put(ctx, v);
            }
        }
        footer(ctx, start, HOLDER_KIND);
    }

    /// Split a voter's note off `ctx`: the context as it was before, and the note if any.
    pub fn split(ctx: &[u8]) -> Result<(&[u8], Option<HolderNote>), WireError> {
        let Some((base, body)) = trailer(ctx, HOLDER_KIND)? else {
            return Ok((ctx, None));
        };
        let (&flags, rest) = body.split_first().ok_or(WireError::Malformed)?;
        let v = words(rest)?;
        let note = match (flags, v.as_slice()) {
            (0b01, [term, boot, seq]) => HolderNote {
                tag: Some(tag_of(*term, *boot, *seq)?),
                gave_up: None,
            },
            (0b10, [term, boot, seq]) => HolderNote {
                tag: None,
                gave_up: Some(tag_of(*term, *boot, *seq)?),
            },
            (0b11, [term, boot, seq, g_term, g_boot, g_seq]) => HolderNote {
                tag: Some(tag_of(*term, *boot, *seq)?),
                gave_up: Some(tag_of(*g_term, *g_boot, *g_seq)?),
            },
            _ => return Err(WireError::Malformed),
        };
        Ok((base, Some(note)))
    }
}

fn put(ctx: &mut Vec<u8>, v: u64) {
    ctx.extend_from_slice(&v.to_be_bytes());
}

/// Close the trailer whose body started at `start`.
fn footer(ctx: &mut Vec<u8>, start: usize, kind: u8) {
    let body = u16::try_from(ctx.len() - start).expect("a note is a few dozen bytes");
    ctx.extend_from_slice(&body.to_be_bytes());
    ctx.push(kind);
    ctx.extend_from_slice(MAGIC);
    debug_assert!(ctx.len() - start <= MAX_BODY_LEN + FOOTER_LEN);
}

/// A context split in two: what came before the trailer, and the trailer's body.
type Split<'a> = (&'a [u8], &'a [u8]);

/// The context before the trailer and the trailer's body, if `ctx` ends in one of `kind`.
fn trailer(ctx: &[u8], kind: u8) -> Result<Option<Split<'_>>, WireError> {
    let Some(rest) = ctx.strip_suffix(MAGIC.as_slice()) else {
        return Ok(None);
    };
    let (rest, &found) = match rest.split_last() {
        Some((k, rest)) => (rest, k),
        None => return Err(WireError::Malformed),
    };
    if found != kind {
        return match found {
            LEADER_KIND | HOLDER_KIND => Err(WireError::WrongKind(found)),
            _ => Err(WireError::Malformed),
        };
    }
    let len_at = rest.len().checked_sub(2).ok_or(WireError::Malformed)?;
    let body_len = u16::from_be_bytes([rest[len_at], rest[len_at + 1]]) as usize;
    let body_at = len_at.checked_sub(body_len).ok_or(WireError::Malformed)?;
    Ok(Some((&rest[..body_at], &rest[body_at..len_at])))
}

/// `body` as big-endian `u64`s.
fn words(body: &[u8]) -> Result<Vec<u64>, WireError> {
    if body.len() % 8 != 0 || body.len() > MAX_BODY_LEN {
        return Err(WireError::Malformed);
    }
    Ok(body
        .chunks_exact(8)
        .map(|w| u64::from_be_bytes(w.try_into().expect("8 bytes")))
        .collect())
}

fn tag_of(term: u64, boot: u64, seq: u64) -> Result<AckTag, WireError> {
    match term == 0 || seq == 0 {
        true => Err(WireError::Zero),
        false => Ok(AckTag { term, boot, seq }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grant() -> Grant {
        Grant {
            term: 7,
            tag: AckTag {
                term: 7,
                boot: 3,
                seq: 41,
            },
            grant_ns: 200_000_000,
            drift_ppm: 10_000,
            margin_ns: 1_000_000,
        }
    }

    #[test]
    fn notes_round_trip_after_any_context_and_leave_it_as_it_was() {
        let base = crate::ctx::LayerCtx::Round(5).encode();
        for ctx in [Vec::new(), base.clone(), b"raft's own".to_vec()] {
            for note in [
                LeaderNote {
                    exposed: 0,
                    grant: None,
                    give_up: None,
                },
                LeaderNote {
                    exposed: u64::MAX,
                    grant: Some(grant()),
                    give_up: None,
                },
                LeaderNote {
                    exposed: 4,
                    grant: None,
                    give_up: Some(7),
                },
                LeaderNote {
                    exposed: 4,
                    grant: Some(grant()),
                    give_up: Some(7),
                },
            ] {
                let mut m = ctx.clone();
                note.attach(&mut m);
                assert_eq!(LeaderNote::split(&m), Ok((ctx.as_slice(), Some(note))));
                assert_eq!(
                    HolderNote::split(&m),
                    Err(WireError::WrongKind(LEADER_KIND))
                );
            }
            let tag = grant().tag;
            let given = AckTag { seq: 40, ..tag };
            for note in [
                (Some(tag), None),
                (None, Some(given)),
                (Some(tag), Some(given)),
            ] {
                let note = HolderNote {
                    tag: note.0,
                    gave_up: note.1,
                };
                let mut m = ctx.clone();
                note.attach(&mut m);
                assert_eq!(HolderNote::split(&m), Ok((ctx.as_slice(), Some(note))));
            }
            assert_eq!(
                LeaderNote::split(&ctx),
                Ok((ctx.as_slice(), None)),
                "no trailer"
            );
        }
        let mut m = base.clone();
        LeaderNote {
            exposed: 3,
            grant: None,
            give_up: None,
        }
        .attach(&mut m);
        let (rest, _) = LeaderNote::split(&m).unwrap();
        assert_eq!(
            crate::ctx::LayerCtx::parse(rest),
            Some(crate::ctx::LayerCtx::Round(5))
        );
    }

    #[test]
    fn a_zero_tag_or_grant_is_refused_not_taken() {
        let mut m = Vec::new();
        LeaderNote {
            exposed: 1,
            grant: Some(grant()),
            give_up: None,
        }
        .attach(&mut m);
        let seq_at = 8 + 8 + 8 + 8; // exposed, term, tag term, boot
        m[seq_at..seq_at + 8].fill(0);
        assert_eq!(LeaderNote::split(&m), Err(WireError::Zero));
        let mut empty = Vec::new();
        HolderNote {
            tag: None,
            gave_up: Some(grant().tag),
        }
        .attach(&mut empty);
        empty[0] = 0; // the flags: neither a tag nor a give-up
        assert_eq!(
            HolderNote::split(&empty),
            Err(WireError::Malformed),
            "a note that says nothing"
        );
    }

    proptest! {
        /// Bytes from a peer never panic the parser, and what it accepts it wrote.
        #[test]
        fn garbage_never_panics_and_what_parses_re_encodes(
            bytes in proptest::collection::vec(any::<u8>(), 0..120),
            magic in any::<bool>(),
        ) {
            let mut m = bytes;
            if magic {
                m.extend_from_slice(MAGIC);
            }
            if let Ok((base, Some(note))) = LeaderNote::split(&m) {
                let mut again = base.to_vec();
                note.attach(&mut again);
                prop_assert_eq!(again, m.clone());
            }
            if let Ok((base, Some(note))) = HolderNote::split(&m) {
                let mut again = base.to_vec();
                note.attach(&mut again);
                prop_assert_eq!(again, m);
            }
        }
    }
}
