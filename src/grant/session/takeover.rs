//! A new grantor takes over the sessions on its own clock, bounded by checkpoints of the time each
//! session had left (the idea of etcd's lease checkpoints, etcd-io/etcd#9924 for #9888).
//!
//! A takeover can never compare an old grantor's instant with its own clock, so it needs a
//! duration. Without one it must give every session a full TTL, and a grantor that fails over
//! more often than the TTL keeps a dead client's session, and its locks, for ever. So the grantor
//! checkpoints: [`Sessions::checkpoint`] records, for every session, the time it has left on the
//! grantor's clock, `expiry − now`, a duration. A keep-alive clears it (the session has a full
//! TTL again). A takeover gives each session what its checkpoint recorded, or a full TTL when
//! there was none since its last keep-alive.
//!
//! **Never earlier than a client's view.** Say the last keep-alive was answered at grantor time
//! `g` (real time `T_g`) and the checkpoint taken at `c ≥ g` (real `T_c`) recorded
//! `R = g + d·(1+ρ) + ε − c`. The client's view ends before real `T_g + d` (it is measured from
//! before the request, at a rate of at least `1−ρ`). The old clock ran at most `1+ρ`, so
//! `T_c − T_g ≥ (c − g)/(1+ρ)` and the view has at most `d − (c−g)/(1+ρ) = (R − ε)/(1+ρ)` left at
//! `T_c`. The takeover happens at real `T_t ≥ T_c` and gives `R` on the new clock, which runs at
//! most `1+ρ`: at least `R/(1+ρ)` of real time. So the new expiry comes after the view's end,
//! whichever way either clock is skewed.
//!
//! **Bounded.** After the takeover at new-clock `now`, the session expires by `now + R` (`R` from
//! the last checkpoint, `d·(1+ρ) + ε` without one). With checkpoints every `I` until the old
//! grantor stopped, a dead client's session outlives its expiry on the old grantor by at most
//! `I` plus the failover time plus `2ρR` per takeover; a session found expired (by a checkpoint or
//! a keep-alive) is dead at once. The takeover adds no extra hold.

use super::{Session, SessionId, Sessions};

/// The time each session had left at a checkpoint: durations, never instants, so they mean the
/// same on every clock. Compact: one pair per session. Persist or replicate it with the
/// [`SessionsImage`](super::SessionsImage) of the same moment ([`Sessions::last_checkpoint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionsCheckpoint {
    /// `(session, remaining_ns)`: time left on the grantor's clock at the checkpoint, 0 for a
    /// session already expired.
    pub remaining: Vec<(SessionId, u64)>,
}

impl Sessions {
    /// Record, for every session, the time it has left at `now_ns` (this grantor's clock), for
    /// the next [`Sessions::takeover`]; returns what was recorded. Call it every checkpoint
    /// interval `I` (a replicated grantor: as a replicated command carrying `now_ns`, applied on
    /// every replica) and persist or replicate the result with the sessions.
    pub fn checkpoint(&mut self, now_ns: u64) -> SessionsCheckpoint {
        let mut remaining = Vec::with_capacity(self.sessions.len());
        for (id, s) in self.sessions.iter_mut() {
            let left_ns = s.expiry_ns.saturating_sub(now_ns);
            s.checkpoint_ns = Some(left_ns);
            remaining.push((*id, left_ns));
        }
        SessionsCheckpoint { remaining }
    }

    /// What the last checkpoints recorded and keep-alives have not cleared since (and sessions
    /// found expired, as 0): save it beside [`Sessions::image`], taken at the same moment.
    pub fn last_checkpoint(&self) -> SessionsCheckpoint {
        let remaining = self
            .sessions
            .iter()
            .filter_map(|(id, s)| s.checkpoint_ns.map(|left_ns| (*id, left_ns)))
            .collect();
        SessionsCheckpoint { remaining }
    }

    /// Put back a [`Sessions::last_checkpoint`] saved beside the image this was rebuilt from
    /// ([`Sessions::from_image`]). Sessions it does not name keep a full TTL; names of sessions
    /// that are gone are ignored. Only the checkpoint of the same moment as the image: an older
    /// one may name less time than a later keep-alive promised.
    pub fn restore_checkpoint(&mut self, checkpoint: &SessionsCheckpoint) {
        for &(id, left_ns) in &checkpoint.remaining {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.checkpoint_ns = Some(left_ns);
            }
        }
    }

    /// A new grantor takes over at `now_ns` on **its own** clock: every session expires at
    /// `now + R`, `R` the time its last checkpoint recorded (at most a full TTL), or a full TTL
    /// `ttl·(1+ρ) + ε` if it had none since its last keep-alive. See the module docs for why
    /// that is never earlier than a client's view and how it bounds a dead client's session.
    ///
    /// The expiries in the image were read on the previous grantor's clock, which means nothing
    /// here (one machine's monotonic clock may read 30 days, the next one's 1 hour), so they are
    /// never compared with `now_ns`. The checkpoints stay as they were: a second takeover before
    /// this grantor checkpoints gives the same durations again, never a full TTL.
    pub fn takeover(&mut self, now_ns: u64) {
        let config = self.config;
        self.rebase(now_ns, |s| {
            let full_ns = config.grantor_hold_ns(s.ttl_ms);
            let left_ns = s.checkpoint_ns.map_or(full_ns, |c| c.min(full_ns));
            now_ns.saturating_add(left_ns)
        });
    }

    /// NEGATIVE CONTROL, for tests only: the takeover before checkpoints, which gave every
    /// session a full TTL. Failovers more often than the TTL keep a dead client's lock for ever.
    #[doc(hidden)]
    pub fn control_takeover_ignoring_checkpoints(&mut self, now_ns: u64) {
        let config = self.config;
        self.rebase(now_ns, |s| {
            now_ns.saturating_add(config.grantor_hold_ns(s.ttl_ms))
        });
    }

    /// NEGATIVE CONTROL, for tests only: the first takeover, which kept the later of the old expiry
    /// (read on the previous grantor's clock) and a full TTL from now. A dead client's lock then
    /// outlives its TTL by however far the old clock was ahead.
    #[doc(hidden)]
    pub fn control_takeover_keeping_old_expiry(&mut self, now_ns: u64) {
        let config = self.config;
        self.rebase(now_ns, |s| {
            s.expiry_ns
                .max(now_ns.saturating_add(config.grantor_hold_ns(s.ttl_ms)))
        });
    }

    fn rebase(&mut self, now_ns: u64, expiry_ns: impl Fn(&Session) -> u64) {
        self.by_expiry.clear();
        for (id, s) in self.sessions.iter_mut() {
            s.expiry_ns = expiry_ns(s);
            // Only a session found dead (checkpointed at 0) expires at once.
            debug_assert!(s.expiry_ns > now_ns || s.checkpoint_ns == Some(0));
            self.by_expiry.insert((s.expiry_ns, *id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sessions;
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn takeover_sets_each_expiry_from_the_new_clock_only() {
        let mut s = sessions();
        let a = s.grant(100, 1_000 * MS).unwrap(); // old clock: expires at 1100 ms
        let b = s.grant(300, 0).unwrap();
        s.takeover(10 * MS); // a new clock, far behind
        assert_eq!(s.next_expiry_ns(), Some(110 * MS));
        let e: Vec<_> = s.expiries().collect();
        assert_eq!(e, vec![(a, 100, 110 * MS), (b, 300, 310 * MS)]);
        assert_eq!(s.expire(110 * MS).len(), 1);
        let mut control = sessions();
        let a = control.grant(100, 1_000 * MS).unwrap();
        control.control_takeover_keeping_old_expiry(10 * MS);
        assert!(
            control.is_live(a, 1_099 * MS),
            "the control keeps the old clock's expiry"
        );
    }

    #[test]
    fn without_a_checkpoint_a_takeover_gives_a_full_ttl() {
        let mut s = sessions();
        let a = s.grant(100, 0).unwrap();
        s.lock("L", a, 0).unwrap();
        s.takeover(90 * MS); // the new grantor cannot know how long the old one promised
        assert!(s.expire(150 * MS).is_empty());
        assert!(s.is_live(a, 189 * MS));
        assert_eq!(s.expire(190 * MS).len(), 1);
    }

    #[test]
    fn a_takeover_gives_what_the_checkpoint_recorded_until_a_keepalive_clears_it() {
        let mut s = sessions();
        let (a, b, c) = (
            s.grant(100, 0).unwrap(),
            s.grant(300, 0).unwrap(),
            s.grant(50, 0).unwrap(),
        );
        let cp = s.checkpoint(60 * MS);
        let want = vec![(a, 40 * MS), (b, 240 * MS), (c, 0)];
        assert_eq!(cp.remaining, want, "c expired at 50 ms");
        assert_eq!(s.last_checkpoint(), cp);
        assert_eq!(s.keepalive(&[b], 70 * MS).refreshed, 1);
        assert_eq!(s.last_checkpoint().remaining, vec![(a, 40 * MS), (c, 0)]);
        // Another grantor, another clock, from the image and the checkpoint of the same moment.
        let mut t = Sessions::from_image(s.config, s.image());
        t.restore_checkpoint(&s.last_checkpoint());
        t.takeover(5_000 * MS);
        let e: Vec<_> = t.expiries().collect();
        let want = vec![
            (a, 100, 5_040 * MS),
            (b, 300, 5_300 * MS),
            (c, 50, 5_000 * MS),
        ];
        assert_eq!(e, want);
        assert!(
            !t.is_live(c, 5_000 * MS),
            "dead at the checkpoint, dead now"
        );
        // A second takeover before any checkpoint gives the same durations, not a full TTL.
        t.takeover(9 * MS);
        assert_eq!(t.expiries().next(), Some((a, 100, 49 * MS)));
        let mut control = Sessions::from_image(s.config, s.image());
        control.restore_checkpoint(&s.last_checkpoint());
        control.control_takeover_ignoring_checkpoints(5_000 * MS);
        assert!(control.is_live(c, 5_049 * MS), "the control revives c");
    }
}
