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
        views: None,
        snapshots: None,
    }
}

/// A batch from node 1 to node 2 with one message of group 0, of type `t`, made by `fill`.
fn batch_of(t: MessageType, fill: impl FnOnce(&mut Message)) -> NodeBatch {
    let mut m = Message::default();
    m.set_msg_type(t);
    (m.from, m.to) = (1, 2);
    fill(&mut m);
    NodeBatch {
        from: 1,
        to: 2,
        raft: vec![(0, m)],
        ..NodeBatch::default()
    }
}

/// An append to node 2 of group 0 with `bytes` of entry data.
fn append(bytes: usize) -> NodeBatch {
    batch_of(MessageType::MsgAppend, |m| {
        let data = vec![7u8; bytes].into();
        m.entries = vec![Entry {
            data,
            ..Entry::default()
        }]
        .into();
    })
}

/// A runtime for the transport's tasks.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_peer_that_reads_nothing_holds_a_bounded_queue_and_every_batch_beyond_is_reported_lost() {
    let rt = runtime();
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
    let queued = t.queues[&(2, true)]
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

/// A heartbeat from node 1 to node 2 of group 0.
fn heartbeat() -> NodeBatch {
    batch_of(MessageType::MsgHeartbeat, |_| {})
}

/// A snapshot from node 1 to node 2 of group 0, of `bytes`.
fn snapshot(bytes: usize) -> NodeBatch {
    batch_of(MessageType::MsgSnapshot, |m| {
        m.mut_snapshot().data = vec![9u8; bytes].into()
    })
}

#[test]
fn heartbeats_never_wait_behind_a_snapshot_on_a_slow_connection() {
    let rt = runtime();
    // The peer reads the first connection (the snapshot's) slowly, about 1 MiB/s: it makes
    // progress, so the sender never gives it up. It reads the next connection at once, and says
    // how much of the snapshot had arrived when the first frame came there.
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = config(sink.local_addr().unwrap().to_string(), 64 << 20);
    let snapshot_bytes = 32 << 20;
    let read_slowly = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (got_tx, got) = std::sync::mpsc::channel();
    let (first_tx, first_accepted) = std::sync::mpsc::channel();
    let counted = read_slowly.clone();
    std::thread::spawn(move || {
        let (mut slow, _) = sink.accept().unwrap();
        let _ = first_tx.send(());
        let reader = counted.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n @ 1..) = std::io::Read::read(&mut slow, &mut buf) {
                reader.fetch_add(n, Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(60));
            }
        });
        let (mut next, _) = sink.accept().unwrap();
        let mut first = [0u8; 5];
        let read = std::io::Read::read_exact(&mut next, &mut first);
        let _ = got_tx.send(read.map(|()| counted.load(Ordering::Acquire)));
    });
    let mut t = Transport::new(&cfg, rt.handle(), None);
    t.send(snapshot(snapshot_bytes));
    first_accepted
        .recv_timeout(Duration::from_secs(30))
        .expect("the snapshot's connection");
    t.send(heartbeat());
    // An event awaited, not a time asserted: the deadline only bounds a hang.
    let arrived = got.recv_timeout(Duration::from_secs(60));
    let Ok(Ok(snapshot_read)) = arrived else {
        panic!("the heartbeat never came on a connection of its own: {arrived:?}");
    };
    assert!(
        snapshot_read < snapshot_bytes,
        "the heartbeat came only after the whole snapshot ({snapshot_read} bytes read)"
    );
    drop(t);
    rt.shutdown_timeout(Duration::from_millis(100));
}
