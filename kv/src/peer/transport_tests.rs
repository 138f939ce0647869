//! The transport toward a peer that accepts a connection and then reads nothing (as a peer
//! behind a network that drops everything looks once the kernel's buffers are full): the bytes
//! queued for it stay bounded, batches beyond are dropped and reported, and everything is
//! counted.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use raft::eraftpb::{Entry, Message, MessageType};
use raft_lease::multi::NodeBatch;

use super::{Report, Transport, TransportConfig};
use crate::base::budget::Budget;

/// A transport of node 1 whose peer 2 is at `addr`, without TLS, its largest message `max`.
fn config(addr: String, max: usize) -> TransportConfig {
    TransportConfig {
        my_id: 1,
        started_with: BTreeMap::from([(2, addr)]),
        members: Arc::default(),
        peer_delay_ms: Arc::default(),
        peer_delay_in_ms: Arc::default(),
        blocked: Arc::new(RwLock::default()),
        metrics: Arc::default(),
        logger: slog::Logger::root(slog::Discard, slog::o!()),
        tls: None,
        peer_budget: Budget::new(1 << 30),
        max_message_bytes: max,
        heard: Arc::default(),
    }
}

/// An append to node 2 of group 0 with `bytes` of entry data.
fn append(bytes: usize) -> NodeBatch {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgAppend);
    (m.from, m.to) = (1, 2);
    let e = Entry {
        data: vec![7u8; bytes].into(),
        ..Entry::default()
    };
    m.entries = vec![e].into();
    NodeBatch {
        from: 1,
        to: 2,
        raft: vec![(0, m)],
        ..NodeBatch::default()
    }
}

#[test]
fn a_peer_that_reads_nothing_holds_a_bounded_queue_and_every_batch_beyond_is_reported_lost() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // It accepts, and never reads: its receive buffer, then this node's send buffer, fill up.
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = sink.local_addr().unwrap().to_string();
    let accepted = std::thread::spawn(move || sink.accept().map(|(s, _)| s));
    let max = 1 << 20;
    let cfg = config(addr, max);
    let (reports_tx, reports) = crossbeam_channel::unbounded();
    let mut t = Transport::new(&cfg, rt.handle(), Some(reports_tx));
    let cap = t.max_queued_bytes() as u64;
    let (batch_bytes, batches) = (256 << 10, 2_000u64); // 500 MiB offered, far past the cap
    let mut most = 0;
    for _ in 0..batches {
        t.send(append(batch_bytes));
        most = most.max(cfg.metrics.peer_queued_bytes.get());
    }
    let _conn = accepted.join().unwrap().unwrap();
    assert!(most <= cap, "queued {most} bytes, over the cap of {cap}");
    assert!(
        most > cap / 2,
        "the queue never filled ({most} of {cap}): the test proves nothing"
    );
    let dropped = cfg.metrics.dropped_full.get();
    assert!(dropped > 0, "nothing dropped");
    let lost = reports
        .try_iter()
        .filter(|r| matches!(r, Report::Unreachable { to: 2, .. }))
        .count() as u64;
    assert!(
        lost >= dropped,
        "{dropped} dropped, {lost} reported to raft"
    );
    let queued = t.queues[&(2, false)]
        .conn
        .queued_bytes
        .load(Ordering::Acquire) as u64;
    assert_eq!(
        queued,
        cfg.metrics.peer_queued_bytes.get(),
        "the gauge counts the lane"
    );
    rt.shutdown_timeout(Duration::from_millis(100));
}
