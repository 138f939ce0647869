//! `Txn` (and `Put` and `DeleteRange`, each a transaction of one operation): compares on a key
//! or a range, then the operations of one branch, nested transactions included, all at one
//! revision. As in etcd 3.4, every compare of the transaction (nested ones too) is evaluated on
//! the state before it runs, and the chosen operations are checked (leases, `ignore_value`)
//! before any of them writes: a refused transaction changes nothing.

use std::collections::BTreeSet;

use etcd_client::proto::{
    PbCompare as Compare, PbDeleteRequest as DeleteRangeRequest, PbDeleteResponse,
    PbPutRequest as PutRequest, PbPutResponse, PbRangeResponse, PbResponseHeader,
    PbResponseOp as ResponseOp, PbTargetUnion as Target, PbTxnOpRequest as Op,
    PbTxnOpResponse as OpResponse, PbTxnRequest as TxnRequest, PbTxnResponse,
};

use crate::state::mvcc::{in_range, range, Batch, MvccError, Reader, Version, Write};

/// The most operations one transaction may hold (etcd's `--max-txn-ops` default), nested
/// transactions' operations counted in their own branch.
pub const MAX_TXN_OPS: usize = 128;

/// Compares and operations in one transaction, every nested one counted (each compare may
/// scan a range on every replica: the whole is bounded, not only each level).
pub const MAX_TXN_TOTAL: usize = 1024;

/// How deep transactions may nest.
pub const MAX_TXN_DEPTH: usize = 8;

/// What a transaction did: which branch ran, each operation's answer (headers carry only the
/// revision), and the revision it leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct TxnDone {
    /// The compares all held: the success branch ran.
    pub succeeded: bool,
    /// Each operation's answer, in order.
    pub responses: Vec<ResponseOp>,
    /// The store's revision after it: the revision of its writes, if it wrote.
    pub revision: i64,
}

// A transaction's outcome is plain data (no floats): equality is total.
impl Eq for TxnDone {}

const RESULT_EQUAL: i32 = 0;
const RESULT_GREATER: i32 = 1;
const RESULT_LESS: i32 = 2;
const RESULT_NOT_EQUAL: i32 = 3;

/// A transaction's shape: keys given, at most [`MAX_TXN_OPS`] operations per branch, no key
/// written twice in a branch (nested ones included), known compare results.
pub fn check(t: &TxnRequest) -> Result<(), MvccError> {
    check_depth(t, 0)?;
    match size(t) <= MAX_TXN_TOTAL {
        true => Ok(()),
        false => Err(MvccError::TooManyOps),
    }
}

/// Whether `t` puts a key in either branch (nested transactions included): what etcd's no-space
/// mode refuses (a transaction that only deletes or reads passes).
pub fn has_puts(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .any(|op| match &op.request {
            Some(Op::RequestPut(_)) => true,
            Some(Op::RequestTxn(n)) => has_puts(n),
            _ => false,
        })
}

/// Compares and operations in `t`, nested transactions' included.
fn size(t: &TxnRequest) -> usize {
    let nested = |ops: &[etcd_client::proto::PbTxnRequestOp]| -> usize {
        ops.iter()
            .map(|op| match &op.request {
                Some(Op::RequestTxn(n)) => 1 + size(n),
                _ => 1,
            })
            .sum()
    };
    t.compare.len() + nested(&t.success) + nested(&t.failure)
}

fn check_depth(t: &TxnRequest, depth: usize) -> Result<(), MvccError> {
    if depth > MAX_TXN_DEPTH {
        return Err(MvccError::Invalid(format!(
            "transactions nest at most {MAX_TXN_DEPTH} deep"
        )));
    }
    if t.compare.len() > MAX_TXN_OPS
        || t.success.len() > MAX_TXN_OPS
        || t.failure.len() > MAX_TXN_OPS
    {
        return Err(MvccError::TooManyOps);
    }
    for c in &t.compare {
        if c.key.is_empty() {
            return Err(MvccError::EmptyKey);
        }
        if !(RESULT_EQUAL..=RESULT_NOT_EQUAL).contains(&c.result) || c.target_union.is_none() {
            return Err(MvccError::Invalid("malformed compare".into()));
        }
    }
    for branch in [&t.success, &t.failure] {
        for op in branch {
            check_op(op, depth)?;
        }
        check_overlaps(branch)?;
    }
    Ok(())
}

fn check_op(op: &etcd_client::proto::PbTxnRequestOp, depth: usize) -> Result<(), MvccError> {
    match &op.request {
        None => Err(MvccError::Invalid("an operation with no request".into())),
        Some(Op::RequestRange(r)) => range::check(r),
        Some(Op::RequestPut(p)) => check_put(p),
        Some(Op::RequestDeleteRange(d)) => match d.key.is_empty() {
            true => Err(MvccError::EmptyKey),
            false => Ok(()),
        },
        Some(Op::RequestTxn(t)) => check_depth(t, depth + 1),
    }
}

/// A put's shape.
pub fn check_put(p: &PutRequest) -> Result<(), MvccError> {
    if p.key.is_empty() {
        return Err(MvccError::EmptyKey);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(MvccError::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(MvccError::LeaseProvided);
    }
    Ok(())
}

/// A key and its `range_end`.
type KeyRange = (Vec<u8>, Vec<u8>);

/// The keys a branch may put (a nested transaction's both branches), and the ranges it may
/// delete.
fn writes(branch: &[etcd_client::proto::PbTxnRequestOp]) -> (Vec<Vec<u8>>, Vec<KeyRange>) {
    let (mut puts, mut dels) = (Vec::new(), Vec::new());
    for op in branch {
        match &op.request {
            Some(Op::RequestPut(p)) => puts.push(p.key.clone()),
            Some(Op::RequestDeleteRange(d)) => dels.push((d.key.clone(), d.range_end.clone())),
            Some(Op::RequestTxn(t)) => {
                let mut nested: BTreeSet<Vec<u8>> = BTreeSet::new();
                for b in [&t.success, &t.failure] {
                    let (p, d) = writes(b);
                    nested.extend(p);
                    dels.extend(d);
                }
                puts.extend(nested);
            }
            _ => {}
        }
    }
    (puts, dels)
}

fn check_overlaps(branch: &[etcd_client::proto::PbTxnRequestOp]) -> Result<(), MvccError> {
    let (puts, dels) = writes(branch);
    let mut seen = BTreeSet::new();
    for p in &puts {
        if !seen.insert(p) || dels.iter().any(|(k, e)| in_range(p, k, e)) {
            return Err(MvccError::DuplicateKey);
        }
    }
    Ok(())
}

/// Whether `c` holds on `m` at revision `rev` (etcd's rules: over a range, every key must
/// hold; a missing key compares as zeros, except that a value compare on it fails). Stops at
/// the first key that does not hold.
fn holds(m: &Reader<'_>, c: &Compare, rev: i64) -> Result<bool, MvccError> {
    let zero = Version {
        create_rev: 0,
        mod_rev: 0,
        version: 0,
        lease: 0,
        value: Some(Vec::new()),
    };
    let one = |v: &Version| {
        let ord = match &c.target_union {
            Some(Target::Version(x)) => v.version.cmp(x),
            Some(Target::CreateRevision(x)) => v.create_rev.cmp(x),
            Some(Target::ModRevision(x)) => v.mod_rev.cmp(x),
            Some(Target::Value(x)) => v.value.as_deref().unwrap_or_default().cmp(x.as_slice()),
            Some(Target::Lease(x)) => v.lease.cmp(x),
            None => return false,
        };
        match c.result {
            RESULT_EQUAL => ord.is_eq(),
            RESULT_GREATER => ord.is_gt(),
            RESULT_LESS => ord.is_lt(),
            _ => ord.is_ne(),
        }
    };
    let (mut found, mut all) = (false, true);
    m.scan_at(&c.key, &c.range_end, rev, &mut |_, v| {
        found = true;
        all = one(v);
        all
    })?;
    Ok(match found {
        true => all,
        false => !matches!(c.target_union, Some(Target::Value(_))) && one(&zero),
    })
}

/// The branch each transaction takes, outer first then nested in order, all decided on the
/// state before the transaction.
fn path(m: &Reader<'_>, t: &TxnRequest, rev: i64, out: &mut Vec<bool>) -> Result<(), MvccError> {
    let mut ok = true;
    for c in &t.compare {
        if !holds(m, c, rev)? {
            ok = false;
            break;
        }
    }
    out.push(ok);
    for op in if ok { &t.success } else { &t.failure } {
        if let Some(Op::RequestTxn(nested)) = &op.request {
            path(m, nested, rev, out)?;
        }
    }
    Ok(())
}

/// Check what the chosen operations need of the state: the leases they attach exist, and a
/// put with `ignore_value` or `ignore_lease` has a key to take them from.
fn precheck(
    m: &Reader<'_>,
    t: &TxnRequest,
    path: &mut std::slice::Iter<'_, bool>,
    lease_exists: &dyn Fn(i64) -> bool,
) -> Result<(), MvccError> {
    let ok = *path.next().expect("a branch for every transaction");
    for op in if ok { &t.success } else { &t.failure } {
        match &op.request {
            // etcd refuses the whole transaction for a range it cannot read.
            Some(Op::RequestRange(r)) if r.revision > 0 => {
                m.read_rev(r.revision)?;
            }
            Some(Op::RequestPut(p)) => {
                if p.lease != 0 && !lease_exists(p.lease) {
                    return Err(MvccError::LeaseNotFound);
                }
                let needs_key = p.ignore_value || p.ignore_lease;
                if needs_key && m.latest(&p.key)?.is_none() {
                    return Err(MvccError::KeyNotFound);
                }
            }
            Some(Op::RequestTxn(nested)) => precheck(m, nested, path, lease_exists)?,
            _ => {}
        }
    }
    Ok(())
}

impl Reader<'_> {
    /// What `t` may add to the byte count, both branches counted: (its puts' versions, its
    /// deletes' tombstones over the keys in their ranges now).
    pub fn growth_bytes(&self, t: &TxnRequest) -> Result<(u64, u64), MvccError> {
        let (mut puts, mut dels) = (0u64, 0u64);
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(Op::RequestPut(p)) => {
                    puts += (p.key.len() + p.value.len()) as u64
                        + crate::state::mvcc::VERSION_OVERHEAD_BYTES
                }
                Some(Op::RequestDeleteRange(d)) => {
                    self.scan_at(&d.key, &d.range_end, self.rev(), &mut |k, _| {
                        dels += k.len() as u64 + crate::state::mvcc::VERSION_OVERHEAD_BYTES;
                        true
                    })?;
                }
                Some(Op::RequestTxn(n)) => {
                    let (p, d) = self.growth_bytes(n)?;
                    (puts, dels) = (puts + p, dels + d);
                }
                _ => {}
            }
        }
        Ok((puts, dels))
    }

    /// What the puts of `t` may add to the byte count, both branches counted (for a
    /// transaction that deletes nothing, all of [`Reader::growth_bytes`]).
    pub fn put_growth_bytes(t: &TxnRequest) -> Result<u64, MvccError> {
        let mut puts = 0u64;
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(Op::RequestPut(p)) => {
                    puts += (p.key.len() + p.value.len()) as u64
                        + crate::state::mvcc::VERSION_OVERHEAD_BYTES
                }
                Some(Op::RequestTxn(n)) => puts += Reader::put_growth_bytes(n)?,
                _ => {}
            }
        }
        Ok(puts)
    }

    /// Whether `t` deletes anything (in either branch, nested ones included): only then does
    /// [`Reader::growth_bytes`] need to read the state.
    pub fn deletes(t: &TxnRequest) -> bool {
        t.success
            .iter()
            .chain(&t.failure)
            .any(|op| match &op.request {
                Some(Op::RequestDeleteRange(_)) => true,
                Some(Op::RequestTxn(n)) => Reader::deletes(n),
                _ => false,
            })
    }

    /// Whether `t` only reads (no put or delete in either branch, nested ones included): it
    /// needs no raft entry, and is served as a read.
    pub fn read_only(t: &TxnRequest) -> bool {
        t.success
            .iter()
            .chain(&t.failure)
            .all(|op| match &op.request {
                Some(Op::RequestRange(_)) | None => true,
                Some(Op::RequestTxn(n)) => Reader::read_only(n),
                _ => false,
            })
    }

    /// Run the read-only transaction `t` on this state: the branch its compares choose, and
    /// each range's answer, at the current revision.
    pub fn txn_read(&self, t: &TxnRequest) -> Result<TxnDone, MvccError> {
        check(t)?;
        debug_assert!(
            Reader::read_only(t),
            "a transaction that writes is proposed"
        );
        let mut branches = Vec::new();
        path(self, t, self.rev(), &mut branches)?;
        precheck(self, t, &mut branches.iter(), &|_| true)?;
        let (succeeded, responses) = run_reads(self, t, &mut branches.iter())?;
        Ok(TxnDone {
            succeeded,
            responses,
            revision: self.rev(),
        })
    }
}

impl Batch<'_> {
    /// Apply transaction `t` (checked with [`check`] here too: a forged proposal is refused,
    /// not obeyed). `lease_exists` says whether a lease is live in the replicated state.
    pub fn txn(
        &mut self,
        t: &TxnRequest,
        lease_exists: &dyn Fn(i64) -> bool,
    ) -> Result<TxnDone, MvccError> {
        check(t)?;
        let mut branches = Vec::new();
        {
            let r = self.reader();
            path(&r, t, r.rev(), &mut branches)?;
            precheck(&r, t, &mut branches.iter(), lease_exists)?;
        }
        let mut w = self.write();
        let (succeeded, responses) = run(&mut w, t, &mut branches.iter())?;
        let revision = w.commit();
        Ok(TxnDone {
            succeeded,
            responses,
            revision,
        })
    }
}

fn header(rev: i64) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        revision: rev,
        ..Default::default()
    })
}

fn run(
    w: &mut Write<'_, '_>,
    t: &TxnRequest,
    path: &mut std::slice::Iter<'_, bool>,
) -> Result<(bool, Vec<ResponseOp>), MvccError> {
    let ok = *path.next().expect("a branch for every transaction");
    let ops = if ok { &t.success } else { &t.failure };
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops.iter().filter_map(|op| op.request.as_ref()) {
        responses.push(ResponseOp {
            response: Some(run_op(w, op, path)?),
        });
    }
    Ok((ok, responses))
}

fn run_op(
    w: &mut Write<'_, '_>,
    op: &Op,
    path: &mut std::slice::Iter<'_, bool>,
) -> Result<OpResponse, MvccError> {
    Ok(match op {
        Op::RequestRange(r) => range_response(&w.view(), r, w.rev)?,
        Op::RequestPut(p) => OpResponse::ResponsePut(put(w, p)?),
        Op::RequestDeleteRange(d) => OpResponse::ResponseDeleteRange(delete(w, d)?),
        Op::RequestTxn(t) => {
            let (succeeded, responses) = run(w, t, path)?;
            OpResponse::ResponseTxn(PbTxnResponse {
                header: header(w.rev),
                succeeded,
                responses,
            })
        }
    })
}

/// The answer of a range inside a transaction, read at `at` (the transaction's revision).
fn range_response(
    m: &Reader<'_>,
    r: &etcd_client::proto::PbRangeRequest,
    at: i64,
) -> Result<OpResponse, MvccError> {
    let got = m.range(r, at).or_else(storage_only)?;
    Ok(OpResponse::ResponseRange(PbRangeResponse {
        header: header(m.rev()),
        kvs: got.kvs,
        more: got.more,
        count: got.count,
    }))
}

/// A range inside a transaction answers what it can: only a storage failure fails it (a
/// revision it cannot read was refused before anything ran).
fn storage_only(e: MvccError) -> Result<range::Ranged, MvccError> {
    match e {
        MvccError::Storage(_) => Err(e),
        _ => Ok(range::Ranged::default()),
    }
}

/// The answers of a read-only transaction's chosen branch.
fn run_reads(
    m: &Reader<'_>,
    t: &TxnRequest,
    path: &mut std::slice::Iter<'_, bool>,
) -> Result<(bool, Vec<ResponseOp>), MvccError> {
    let ok = *path.next().expect("a branch for every transaction");
    let ops = if ok { &t.success } else { &t.failure };
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops.iter().filter_map(|op| op.request.as_ref()) {
        let response = match op {
            Op::RequestRange(r) => range_response(m, r, m.rev())?,
            Op::RequestTxn(n) => {
                let (succeeded, responses) = run_reads(m, n, path)?;
                OpResponse::ResponseTxn(PbTxnResponse {
                    header: header(m.rev()),
                    succeeded,
                    responses,
                })
            }
            _ => unreachable!("a read-only transaction only reads"),
        };
        responses.push(ResponseOp {
            response: Some(response),
        });
    }
    Ok((ok, responses))
}

fn put(w: &mut Write<'_, '_>, p: &PutRequest) -> Result<PbPutResponse, MvccError> {
    let now = w.view().latest(&p.key)?;
    let value = match (&now, p.ignore_value) {
        (Some(v), true) => v.value.clone().unwrap_or_default(),
        _ => p.value.clone(),
    };
    let lease = match (&now, p.ignore_lease) {
        (Some(v), true) => v.lease,
        _ => p.lease,
    };
    let prev = w.put(&p.key, value, lease)?;
    Ok(PbPutResponse {
        header: header(w.rev),
        prev_kv: prev.filter(|_| p.prev_kv).map(|v| v.key_value(&p.key)),
    })
}

fn delete(w: &mut Write<'_, '_>, d: &DeleteRangeRequest) -> Result<PbDeleteResponse, MvccError> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let rev = w.rev;
    w.view().scan_at(&d.key, &d.range_end, rev, &mut |k, _| {
        keys.push(k.to_vec());
        true
    })?;
    let mut prev_kvs = Vec::new();
    for k in &keys {
        if let Some(v) = w.delete(k)? {
            if d.prev_kv {
                prev_kvs.push(v.key_value(k));
            }
        }
    }
    Ok(PbDeleteResponse {
        header: header(w.rev),
        deleted: keys.len() as i64,
        prev_kvs,
    })
}
