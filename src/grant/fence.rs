//! Fencing: storage that rejects writes from a lease holder that has been superseded.

use thiserror::Error;

/// A write carried a token lower than one already seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("stale fencing token {token}: the highest seen is {highest}")]
pub struct StaleToken {
    /// The rejected token.
    pub token: u64,
    /// The highest token seen so far.
    pub highest: u64,
}

/// A value guarded by fencing tokens: a write is accepted only with a token at least as high as
/// every token seen before. Expiry of a lease means only that the old holder *should* have
/// stopped; this is what makes a late write from a paused ex-holder harmless.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedStore<T> {
    value: T,
    /// The highest token seen. Never decreases.
    highest: u64,
}

impl<T> FencedStore<T> {
    /// A store holding `value`, having seen no token.
    pub fn new(value: T) -> Self {
        FencedStore { value, highest: 0 }
    }

    /// Write `value` under `token`. Rejected, naming the highest token, if `token` is lower.
    pub fn write(&mut self, token: u64, value: T) -> Result<(), StaleToken> {
        self.check(token)?;
        self.highest = token;
        self.value = value;
        Ok(())
    }

    /// Whether a write under `token` would be accepted.
    pub fn check(&self, token: u64) -> Result<(), StaleToken> {
        if token < self.highest {
            return Err(StaleToken {
                token,
                highest: self.highest,
            });
        }
        Ok(())
    }

    /// The current value.
    pub fn read(&self) -> &T {
        &self.value
    }

    /// The highest token seen.
    pub fn highest_token(&self) -> u64 {
        self.highest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_tokens_are_rejected_equal_and_higher_accepted() {
        let mut s = FencedStore::new("init");
        s.write(2, "a").unwrap();
        s.write(2, "b").unwrap();
        assert_eq!(
            s.write(1, "late"),
            Err(StaleToken {
                token: 1,
                highest: 2
            })
        );
        assert_eq!(*s.read(), "b");
        s.write(5, "c").unwrap();
        assert_eq!(s.highest_token(), 5);
    }
}
