//! `Range` as etcd answers it: a key, a prefix or every key from a key on, at a revision, with
//! filters on revisions, a sort, a limit (`more` says it cut), `count` (every key in the range,
//! before filters, as etcd counts), and `keys_only` / `count_only`.

use etcd_client::proto::{PbKeyValue as KeyValue, PbRangeRequest as RangeRequest};

use crate::state::mvcc::{MvccError, Reader, Version};

/// A range's answer, without its header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ranged {
    /// The keys, in the order asked (key order by default).
    pub kvs: Vec<KeyValue>,
    /// Whether `limit` cut the answer.
    pub more: bool,
    /// Every key in the range at the revision read.
    pub count: i64,
}

const ORDER_NONE: i32 = 0;
const ORDER_ASCEND: i32 = 1;
const ORDER_DESCEND: i32 = 2;
const TARGET_KEY: i32 = 0;
const TARGET_VERSION: i32 = 1;
const TARGET_CREATE: i32 = 2;
const TARGET_MOD: i32 = 3;
const TARGET_VALUE: i32 = 4;

/// A range request's shape, checked before it is served or proposed.
pub fn check(r: &RangeRequest) -> Result<(), MvccError> {
    if r.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    if !(ORDER_NONE..=ORDER_DESCEND).contains(&r.sort_order) {
        return Err(MvccError::Invalid(format!(
            "unknown sort order {}",
            r.sort_order
        )));
    }
    if !(TARGET_KEY..=TARGET_VALUE).contains(&r.sort_target) {
        return Err(MvccError::Invalid(format!(
            "unknown sort target {}",
            r.sort_target
        )));
    }
    Ok(())
}

fn keep(r: &RangeRequest, v: &Version) -> bool {
    let over = |max: i64, x: i64| max != 0 && x > max;
    let under = |min: i64, x: i64| min != 0 && x < min;
    !(over(r.max_mod_revision, v.mod_rev)
        || under(r.min_mod_revision, v.mod_rev)
        || over(r.max_create_revision, v.create_rev)
        || under(r.min_create_revision, v.create_rev))
}

fn sort(r: &RangeRequest, kvs: &mut [KeyValue]) {
    // etcd: a sort on anything but the key with no order given sorts ascending.
    let order = match (r.sort_order, r.sort_target) {
        (ORDER_NONE, TARGET_KEY) => return,
        (ORDER_NONE, _) => ORDER_ASCEND,
        (o, _) => o,
    };
    // Stable, so equal targets stay in key order.
    match r.sort_target {
        TARGET_VERSION => kvs.sort_by_key(|kv| kv.version),
        TARGET_CREATE => kvs.sort_by_key(|kv| kv.create_revision),
        TARGET_MOD => kvs.sort_by_key(|kv| kv.mod_revision),
        TARGET_VALUE => kvs.sort_by(|a, b| a.value.cmp(&b.value)),
        _ => {}
    }
    if order == ORDER_DESCEND {
        kvs.reverse();
    }
}

impl Reader<'_> {
    /// Serve `r` at the revision it asks for (as seen from `at`, the revision reads of "now"
    /// take: the current one, or a transaction's own). Keys are visited in order and only what
    /// the answer holds is kept: a `count_only` of every key keeps nothing.
    pub fn range(&self, r: &RangeRequest, at: i64) -> Result<Ranged, MvccError> {
        check(r)?;
        let rev = match r.revision {
            0 => at,
            asked => self.read_rev(asked)?,
        };
        let filtered = r.sort_order != ORDER_NONE
            || r.sort_target != TARGET_KEY
            || r.min_mod_revision != 0
            || r.max_mod_revision != 0
            || r.min_create_revision != 0
            || r.max_create_revision != 0;
        let limit = usize::try_from(r.limit).unwrap_or(0);
        let mut count = 0i64;
        let mut kvs = Vec::new();
        self.scan_at(&r.key, &r.range_end, rev, &mut |k, v| {
            count += 1;
            let wanted = filtered || limit == 0 || kvs.len() <= limit;
            if r.count_only || !wanted || !keep(r, v) {
                return true;
            }
            let mut kv = v.key_value(k);
            if r.keys_only {
                kv.value = Vec::new();
            }
            kvs.push(kv);
            true
        })?;
        sort(r, &mut kvs);
        let more = limit > 0 && kvs.len() > limit;
        kvs.truncate(if limit > 0 { limit } else { kvs.len() });
        Ok(Ranged { kvs, more, count })
    }
}
