//! Node metrics in the Prometheus text format: times in seconds, counters ending in `_total`,
//! and latency histograms for lease reads, ReadIndex reads and writes (as the HTTP side sees
//! them, from the request's start to its answer).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use raft::eraftpb::MessageType;
use raft_lease::{CounterSnapshot, LeaseState};

use crate::base::budget::Budget;

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Set it.
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// Its value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Raise it by `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Lower it by `n` (raised by as much before).
    pub fn sub(&self, n: u64) {
        let before = self.0.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "a gauge lowered past zero: {before} - {n}");
    }
}

/// Latency buckets, in seconds: 25 µs to 10 s.
const SECONDS: [f64; 16] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    1.0, 2.5, 10.0,
];
/// Batch-size buckets: entries proposed per `Ready`.
const BATCH: [f64; 16] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0,
];

/// A Prometheus histogram with fixed buckets (cumulative when rendered).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64; 16],
    /// Observations per bucket (not cumulative); the last counts those above every bound.
    counts: [AtomicU64; 17],
    /// The sum of observations, in millionths.
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64; 16]) -> Self {
        Histogram {
            bounds,
            counts: Default::default(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Record one observation.
    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(16);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((v * 1e6) as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {cumulative}"
        );
    }
}

/// Raft message types, by protobuf number (0..=19 in raft-proto 0.7).
const MSG_TYPES: usize = 20;

/// Counters kept outside the lease layer.
#[derive(Debug)]
pub struct Metrics {
    /// Commands proposed.
    pub proposals: Counter,
    /// HTTP requests handled.
    pub http_requests: Counter,
    /// HTTP requests answered with an error.
    pub http_errors: Counter,
    /// Garbage or misaddressed peer frames.
    pub bad_frames: Counter,
    /// Messages dropped on a full queue.
    pub dropped_full: Counter,
    /// Inbound peer connections closed because a newer one of the same member took their place.
    pub peer_superseded: Counter,
    /// Bytes of batches queued for peers and not yet written.
    pub peer_queued_bytes: Gauge,
    /// Peer connections the transport gave up on (a failed write, flush or connect), each with
    /// everything queued behind it reported lost.
    pub peer_queue_drained: Counter,
    /// Peer batches the raft thread wrote into their connection itself (`peer::express`).
    pub express_sent: Counter,
    /// HTTP connections open now.
    pub http_open: Gauge,
    /// HTTP connections closed to admit a new one (the table, or an address's share, was full).
    pub http_evicted: Counter,
    /// HTTP connections refused: every candidate was waiting for its answer.
    pub http_refused: Counter,
    /// HTTP accept errors.
    pub http_accept_errors: Counter,
    /// HTTPS handshakes that failed.
    pub http_tls_failures: Counter,
    /// `/admin` requests without the right bearer token.
    pub admin_denied: Counter,
    /// Peer connections refused: too many from one peer, or every pending one started.
    pub peer_refused: Counter,
    /// Pending peer handshakes closed to admit a newcomer.
    pub peer_evicted: Counter,
    /// Peer messages no correct peer sends, dropped before raft (see `raft::admission`).
    pub peer_inadmissible: Counter,
    /// Peer connections that failed while sending (messages reported lost to raft).
    pub peer_write_failures: Counter,
    /// Snapshots flushed to a peer (reported delivered).
    pub snapshots_delivered: Counter,
    /// Snapshots lost on the way to a peer (reported failed).
    pub snapshots_lost: Counter,
    /// Lease reads, from the request's start to its answer.
    pub lease_read_seconds: Histogram,
    /// ReadIndex reads, from the request's start to its answer.
    pub index_read_seconds: Histogram,
    /// Writes, from the request's start to their answer.
    pub write_seconds: Histogram,
    /// Commands proposed per pass of the raft loop (group commit).
    pub batch_sizes: Histogram,
    /// Durable writes of the raft log (one transaction and fsync per `Ready` that changes more
    /// than the commit index).
    pub persist_seconds: Histogram,
    /// A write's wait in the raft thread's queue, from the HTTP worker to its proposal.
    pub write_queue_seconds: Histogram,
    /// A write's commit, from its proposal to the pass that applies it (the leader's fsync and
    /// the followers' round, which overlap).
    pub write_commit_seconds: Histogram,
    /// A write's apply, from the start of its pass's apply to its answer's hand-off.
    pub write_apply_seconds: Histogram,
    /// On a follower: from an append's arrival off the connection to the end of the pass that
    /// persisted it and handed its answer to the transport.
    pub append_turnaround_seconds: Histogram,
    /// Peer TLS handshakes that failed, or certificates that name no other member.
    pub peer_tls_failures: Counter,
    /// Peer messages whose `from` is not the id in the connection's certificate.
    pub peer_spoofed: Counter,
    /// Peer messages of a type peers never send (proposals, node-local types).
    pub peer_refused_types: Counter,
    /// Node batches queued for peers (one per peer per pass at most).
    pub batches_sent: Counter,
    /// Messages in those batches: raft, support and fortification, one by one.
    pub peer_messages_sent: Counter,
    sent: [Counter; MSG_TYPES],
    received: [Counter; MSG_TYPES],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            proposals: Counter::default(),
            http_requests: Counter::default(),
            http_errors: Counter::default(),
            bad_frames: Counter::default(),
            dropped_full: Counter::default(),
            peer_superseded: Counter::default(),
            peer_queued_bytes: Gauge::default(),
            peer_queue_drained: Counter::default(),
            express_sent: Counter::default(),
            http_open: Gauge::default(),
            http_evicted: Counter::default(),
            http_refused: Counter::default(),
            http_accept_errors: Counter::default(),
            http_tls_failures: Counter::default(),
            admin_denied: Counter::default(),
            peer_refused: Counter::default(),
            peer_evicted: Counter::default(),
            peer_tls_failures: Counter::default(),
            peer_spoofed: Counter::default(),
            peer_refused_types: Counter::default(),
            batches_sent: Counter::default(),
            peer_messages_sent: Counter::default(),
            peer_inadmissible: Counter::default(),
            peer_write_failures: Counter::default(),
            snapshots_delivered: Counter::default(),
            snapshots_lost: Counter::default(),
            lease_read_seconds: Histogram::new(&SECONDS),
            index_read_seconds: Histogram::new(&SECONDS),
            write_seconds: Histogram::new(&SECONDS),
            batch_sizes: Histogram::new(&BATCH),
            persist_seconds: Histogram::new(&SECONDS),
            write_queue_seconds: Histogram::new(&SECONDS),
            write_commit_seconds: Histogram::new(&SECONDS),
            write_apply_seconds: Histogram::new(&SECONDS),
            append_turnaround_seconds: Histogram::new(&SECONDS),
            sent: Default::default(),
            received: Default::default(),
        }
    }
}

impl Metrics {
    /// Count a message sent.
    pub fn sent(&self, ty: MessageType) {
        if let Some(c) = self.sent.get(ty as usize) {
            c.inc();
        }
    }

    /// Count a message received.
    pub fn received(&self, ty: MessageType) {
        if let Some(c) = self.received.get(ty as usize) {
            c.inc();
        }
    }

    /// Render everything, with the lease layer's counters and status.
    pub fn render(
        &self,
        id: u64,
        lease: (LeaseState, u64),
        c: &CounterSnapshot,
        inflight: &Budget,
    ) -> String {
        let mut out = String::new();
        let state = match lease.0 {
            LeaseState::Valid => 2.0,
            LeaseState::Suspect => 1.0,
            LeaseState::Expired => 0.0,
        };
        let gauges = [
            (
                "raft_lease_state",
                "Lease state: 2 valid, 1 suspect (renewal due), 0 expired.",
                state,
            ),
            (
                "raft_lease_remaining_seconds",
                "Time left on the lease.",
                lease.1 as f64 / 1e9,
            ),
            (
                "kv_http_connections",
                "HTTP connections open.",
                self.http_open.get() as f64,
            ),
            (
                "kv_peer_queued_bytes",
                "Bytes of batches queued for peers and not yet written (bounded per peer).",
                self.peer_queued_bytes.get() as f64,
            ),
            (
                "kv_inflight_bytes",
                "Bytes of writes waiting for the raft thread or for their entries to apply.",
                inflight.used() as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{node=\"{id}\"}} {v}"
            );
        }
        let mut counters = self.counters(c);
        counters.push((
            "kv_inflight_refused_total",
            "Writes refused at once: the in-flight byte budget was used up.",
            inflight.refused(),
        ));
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{node=\"{id}\"}} {v}"
            );
        }
        self.render_messages(&mut out, id);
        self.render_histograms(&mut out, id);
        out
    }

    fn render_histograms(&self, out: &mut String, id: u64) {
        let node = format!("node=\"{id}\"");
        let reads = "Reads answered over HTTP, from the request's start to the answer.";
        self.lease_read_seconds.render(
            out,
            "kv_read_duration_seconds",
            reads,
            &format!("{node},read=\"lease\""),
        );
        let mut index = String::new();
        self.index_read_seconds.render(
            &mut index,
            "kv_read_duration_seconds",
            reads,
            &format!("{node},read=\"index\""),
        );
        out.extend(index.lines().skip(2).map(|l| format!("{l}\n"))); // one HELP/TYPE per name
        self.write_seconds.render(
            out,
            "kv_write_duration_seconds",
            "Writes answered over HTTP, from the request's start to the answer.",
            &node,
        );
        self.persist_seconds.render(
            out,
            "kv_log_persist_duration_seconds",
            "Durable writes of the raft log: one transaction and fsync per Ready with entries, a term or a vote.",
            &node,
        );
        let stages = [
            ("queue", &self.write_queue_seconds),
            ("commit", &self.write_commit_seconds),
            ("apply", &self.write_apply_seconds),
        ];
        for (i, (stage, h)) in stages.into_iter().enumerate() {
            let mut text = String::new();
            let help = "A write's stages on the leader: queue (to the raft thread), commit (proposal to apply), apply (to the answer).";
            h.render(
                &mut text,
                "kv_write_stage_duration_seconds",
                help,
                &format!("{node},stage=\"{stage}\""),
            );
            out.extend(
                text.lines()
                    .skip(2 * (i > 0) as usize)
                    .map(|l| format!("{l}\n")),
            );
        }
        self.append_turnaround_seconds.render(
            out,
            "kv_append_turnaround_duration_seconds",
            "On a follower: from an append's arrival to its answer handed to the transport.",
            &node,
        );
        self.batch_sizes.render(
            out,
            "kv_proposals_per_batch",
            "Commands proposed per pass of the raft loop (one fsync covers them all).",
            &node,
        );
    }

    fn counters(&self, c: &CounterSnapshot) -> Vec<(&'static str, &'static str, u64)> {
        vec![
            (
                "raft_lease_reads_total",
                "Reads served under the lease.",
                c.lease_reads,
            ),
            (
                "raft_lease_index_reads_total",
                "Reads served by ReadIndex.",
                c.index_reads,
            ),
            (
                "raft_lease_fallbacks_total",
                "Auto reads that fell back to ReadIndex.",
                c.fallbacks,
            ),
            (
                "raft_lease_renewals_total",
                "Quorum acknowledgements that extended the lease.",
                c.renewals,
            ),
            (
                "raft_lease_expirations_total",
                "Times a held lease ran out or was lost.",
                c.expirations,
            ),
            (
                "raft_lease_refused_votes_total",
                "Votes refused under the promise.",
                c.refused_votes,
            ),
            (
                "raft_lease_refusals_total",
                "Strict lease reads refused for want of a lease.",
                c.lease_refusals,
            ),
            (
                "raft_lease_index_rounds_total",
                "read_index rounds issued.",
                c.index_rounds,
            ),
            (
                "kv_proposals_total",
                "Commands proposed to raft.",
                self.proposals.get(),
            ),
            (
                "kv_http_requests_total",
                "HTTP requests handled.",
                self.http_requests.get(),
            ),
            (
                "kv_http_errors_total",
                "HTTP requests answered with an error.",
                self.http_errors.get(),
            ),
            (
                "kv_peer_bad_frames_total",
                "Garbage or misaddressed frames from peer sockets.",
                self.bad_frames.get(),
            ),
            (
                "kv_peer_dropped_total",
                "Messages dropped on a full queue.",
                self.dropped_full.get(),
            ),
            (
                "kv_peer_superseded_total",
                "Inbound peer connections closed for a newer one of the same member.",
                self.peer_superseded.get(),
            ),
            (
                "kv_peer_queue_drained_total",
                "Peer connections given up on, with everything queued behind them reported lost.",
                self.peer_queue_drained.get(),
            ),
            (
                "kv_peer_express_total",
                "Peer batches the raft thread wrote into their connection itself.",
                self.express_sent.get(),
            ),
            (
                "kv_http_evicted_total",
                "Idle HTTP connections closed to admit a new one.",
                self.http_evicted.get(),
            ),
            (
                "kv_http_refused_total",
                "HTTP connections refused: all open ones were busy.",
                self.http_refused.get(),
            ),
            (
                "kv_http_accept_errors_total",
                "HTTP accept errors (such as running out of descriptors).",
                self.http_accept_errors.get(),
            ),
            (
                "kv_http_tls_failures_total",
                "HTTPS handshakes that failed.",
                self.http_tls_failures.get(),
            ),
            (
                "kv_admin_denied_total",
                "/admin requests without the right bearer token.",
                self.admin_denied.get(),
            ),
            (
                "kv_peer_refused_total",
                "Peer connections refused by the connection limits.",
                self.peer_refused.get(),
            ),
            (
                "kv_peer_tls_failures_total",
                "Peer TLS handshakes failed or certificates naming no other member.",
                self.peer_tls_failures.get(),
            ),
            (
                "kv_peer_spoofed_total",
                "Peer messages whose sender is not the certificate's node.",
                self.peer_spoofed.get(),
            ),
            (
                "kv_peer_refused_types_total",
                "Peer messages of a type peers never send (proposals, local types).",
                self.peer_refused_types.get(),
            ),
            (
                "kv_peer_evicted_total",
                "Pending peer handshakes closed to admit a newcomer.",
                self.peer_evicted.get(),
            ),
            (
                "kv_peer_inadmissible_total",
                "Peer messages no correct peer sends (a heartbeat's commit past the log, a leader's message from a non-leader), dropped.",
                self.peer_inadmissible.get(),
            ),
            (
                "kv_snapshots_delivered_total",
                "Snapshots flushed to a peer.",
                self.snapshots_delivered.get(),
            ),
            (
                "kv_snapshots_lost_total",
                "Snapshots lost on the way to a peer (a full queue, a failed or stalled connection).",
                self.snapshots_lost.get(),
            ),
            (
                "kv_peer_batches_sent_total",
                "Node batches queued for peers (every group's raft messages, the support session and fortification, per peer and pass).",
                self.batches_sent.get(),
            ),
            (
                "kv_peer_messages_sent_total",
                "Messages in those batches, one by one: raft, support and fortification.",
                self.peer_messages_sent.get(),
            ),
            (
                "kv_peer_write_failures_total",
                "Peer connections that failed while sending; their messages were reported lost to raft.",
                self.peer_write_failures.get(),
            ),
        ]
    }

    fn render_messages(&self, out: &mut String, id: u64) {
        for (name, set) in [
            ("raft_messages_sent_total", &self.sent),
            ("raft_messages_received_total", &self.received),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} Raft messages by type.\n# TYPE {name} counter"
            );
            for (i, c) in set.iter().enumerate().filter(|(_, c)| c.get() > 0) {
                let ty = protobuf::ProtobufEnum::from_i32(i as i32)
                    .map_or("Unknown".into(), |t: MessageType| format!("{t:?}"));
                let _ = writeln!(out, "{name}{{node=\"{id}\",type=\"{ty}\"}} {}", c.get());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets_in_seconds() {
        let h = Histogram::new(&SECONDS);
        for v in [20e-6, 0.003, 0.003, 20.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help", "node=\"1\"");
        assert!(
            out.contains("x_seconds_bucket{node=\"1\",le=\"0.000025\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{node=\"1\",le=\"0.005\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{node=\"1\",le=\"+Inf\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{node=\"1\"} 4"), "{out}");
        assert_eq!(h.count(), 4);
    }
}
