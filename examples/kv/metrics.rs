//! Node metrics in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use raft::eraftpb::MessageType;
use raft_lease::{CounterSnapshot, LeaseState};

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Raft message types, by protobuf number (0..=19 in raft-proto 0.7).
const MSG_TYPES: usize = 20;

/// Counters kept outside the lease layer.
#[derive(Debug, Default)]
pub struct Metrics {
    pub proposals: Counter,
    pub http_requests: Counter,
    pub http_errors: Counter,
    pub bad_frames: Counter,
    pub dropped_full: Counter,
    /// HTTP connections open now.
    pub http_open: Gauge,
    /// Idle HTTP connections closed to admit a new one (the table was full).
    pub http_evicted: Counter,
    /// HTTP connections refused: the table was full of busy ones.
    pub http_refused: Counter,
    pub http_accept_errors: Counter,
    pub http_tls_failures: Counter,
    /// `/admin` requests without the right bearer token.
    pub admin_denied: Counter,
    /// Peer connections refused: too many open, or too many from one peer.
    pub peer_refused: Counter,
    /// Peer TLS handshakes that failed, or certificates that name no other member.
    pub peer_tls_failures: Counter,
    /// Peer messages whose `from` is not the id in the connection's certificate.
    pub peer_spoofed: Counter,
    /// Peer messages of a type peers never send (proposals, node-local types).
    pub peer_refused_types: Counter,
    sent: [Counter; MSG_TYPES],
    received: [Counter; MSG_TYPES],
}

impl Metrics {
    pub fn sent(&self, ty: MessageType) {
        if let Some(c) = self.sent.get(ty as usize) {
            c.inc();
        }
    }

    pub fn received(&self, ty: MessageType) {
        if let Some(c) = self.received.get(ty as usize) {
            c.inc();
        }
    }

    /// Render everything, with the lease layer's counters and status.
    pub fn render(&self, id: u64, lease: (LeaseState, u64), c: &CounterSnapshot) -> String {
        let mut out = String::new();
        let state = match lease.0 {
            LeaseState::Valid => 2,
            LeaseState::Suspect => 1,
            LeaseState::Expired => 0,
        };
        let gauges = [
            (
                "raft_lease_state",
                "Lease state: 2 valid, 1 suspect (renewal due), 0 expired.",
                state,
            ),
            (
                "raft_lease_remaining_ms",
                "Time left on the lease.",
                lease.1 / 1_000_000,
            ),
            (
                "kv_http_connections",
                "HTTP connections open.",
                self.http_open.get(),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{node=\"{id}\"}} {v}"
            );
        }
        for (name, help, v) in self.counters(c) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{node=\"{id}\"}} {v}"
            );
        }
        self.render_messages(&mut out, id);
        out
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
