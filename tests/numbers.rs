//! The "Choosing the numbers" table in the crate docs (`src/lib.rs`) is computed here, from
//! [`LeaseConfig::validate`], so that it cannot drift from the code: this test renders the table
//! and fails if the docs differ, printing the table to paste.

use raft_lease::{ConfigError, LeaseConfig};

const NS_PER_MS: u64 = 1_000_000;

/// The quorum round trip (plus tick-thread lateness) the availability columns assume.
const ROUND_TRIP_MS: u64 = 2;

const START: &str = "<!-- numbers-table:start -->";
const END: &str = "<!-- numbers-table:end -->";

/// One typical setting: raft's timing and the lease's numbers.
struct Setting {
    name: &'static str,
    tick_ms: u64,
    election_tick: usize,
    heartbeat_tick: usize,
    promise_ms: u64,
    drift_ppm: u64,
    margin_ms: u64,
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "the simulator's default (`SimConfig`)",
        tick_ms: 10,
        election_tick: 10,
        heartbeat_tick: 2,
        promise_ms: 100,
        drift_ppm: 10_000,
        margin_ms: 2,
    },
    Setting {
        name: "`examples/embed.rs`",
        tick_ms: 10,
        election_tick: 20,
        heartbeat_tick: 3,
        promise_ms: 200,
        drift_ppm: 500,
        margin_ms: 5,
    },
    Setting {
        name: "the `kv` crate's default (ρ safe under any daemon's slewing)",
        tick_ms: 10,
        election_tick: 100,
        heartbeat_tick: 10,
        promise_ms: 1_000,
        drift_ppm: 100_000,
        margin_ms: 10,
    },
    Setting {
        name: "the same, a daemon capped at 500 ppm",
        tick_ms: 10,
        election_tick: 100,
        heartbeat_tick: 10,
        promise_ms: 1_000,
        drift_ppm: 1_000,
        margin_ms: 10,
    },
    Setting {
        name: "1 s ticks, 10 s election timeout",
        tick_ms: 1_000,
        election_tick: 10,
        heartbeat_tick: 2,
        promise_ms: 10_000,
        drift_ppm: 500,
        margin_ms: 10,
    },
    Setting {
        name: "1 ms ticks, 50 ms election timeout",
        tick_ms: 1,
        election_tick: 50,
        heartbeat_tick: 5,
        promise_ms: 50,
        drift_ppm: 500,
        margin_ms: 1,
    },
    Setting {
        name: "`P` just above `H` (accepted, but the lease lapses)",
        tick_ms: 10,
        election_tick: 10,
        heartbeat_tick: 5,
        promise_ms: 53,
        drift_ppm: 10_000,
        margin_ms: 1,
    },
];

impl Setting {
    fn raft(&self) -> raft::Config {
        raft::Config {
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            ..raft::Config::default()
        }
    }

    fn lease(&self) -> LeaseConfig {
        LeaseConfig {
            promise_ms: self.promise_ms,
            drift_ppm: self.drift_ppm,
            margin_ms: self.margin_ms,
            ..LeaseConfig::default()
        }
    }

    fn heartbeat_ns(&self) -> u64 {
        self.heartbeat_tick as u64 * self.tick_ms * NS_PER_MS
    }

    fn lease_ns(&self) -> u64 {
        let derived = self
            .lease()
            .validate(&self.raft(), self.tick_ms)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        derived.lease_ns
    }
}

/// Heartbeat rounds that may be lost in a row while the lease stays held: the most `m` with
/// `(m + 1)·H + r < L`. `None` when the lease lapses even with none lost.
fn lost_rounds_tolerated(lease_ns: u64, heartbeat_ns: u64, round_trip_ns: u64) -> Option<u64> {
    let span_ns = lease_ns.checked_sub(round_trip_ns)?;
    // (m + 1)·H < L − r  ⇔  m + 1 ≤ (L − r − 1) / H.
    (span_ns.saturating_sub(1) / heartbeat_ns).checked_sub(1)
}

/// The share of time the leader holds the lease at steady state, in hundredths of a percent:
/// a round sent every `H` and acknowledged after `r` holds it over `[t0 + r, t0 + L)`.
fn held_share_bp(lease_ns: u64, heartbeat_ns: u64, round_trip_ns: u64) -> u64 {
    let held_ns = lease_ns.saturating_sub(round_trip_ns).min(heartbeat_ns);
    held_ns * 10_000 / heartbeat_ns
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(ns: u64) -> String {
    let tenths = ns / (NS_PER_MS / 10);
    match tenths % 10 {
        0 => format!("{} ms", thousands(tenths / 10)),
        t => format!("{}.{t} ms", thousands(tenths / 10)),
    }
}

fn render_row(s: &Setting) -> String {
    let (lease_ns, heartbeat_ns) = (s.lease_ns(), s.heartbeat_ns());
    let round_trip_ns = ROUND_TRIP_MS * NS_PER_MS;
    let election_ns = s.election_tick as u64 * s.tick_ms * NS_PER_MS;
    let lost = match lost_rounds_tolerated(lease_ns, heartbeat_ns, round_trip_ns) {
        Some(m) => m.to_string(),
        None => "none".into(),
    };
    let share = held_share_bp(lease_ns, heartbeat_ns, round_trip_ns);
    let share = match share {
        10_000 => "100%".to_string(),
        bp => format!("{}.{}%", bp / 100, bp % 100 / 10),
    };
    format!(
        "| {} | {} / {} | {} | {} ppm | {} | **{}** | {}% | {} | {} |",
        s.name,
        ms(election_ns),
        ms(heartbeat_ns),
        ms(s.promise_ms * NS_PER_MS),
        thousands(s.drift_ppm),
        ms(s.margin_ms * NS_PER_MS),
        ms(lease_ns),
        lease_ns * 100 / (s.promise_ms * NS_PER_MS),
        lost,
        share,
    )
}

fn render_table() -> String {
    let mut lines = vec![
        "| setting | election timeout / heartbeat `H` | `P` | `ρ` | `ε` | lease `L` | `L ÷ P` | heartbeat rounds lost in a row with no lapse | lease held, steady state |".to_string(),
        "|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    lines.extend(SETTINGS.iter().map(render_row));
    lines.join("\n")
}

/// The table as written in the crate docs, with the `//! ` prefixes removed.
fn documented_table() -> String {
    let lib = include_str!("../src/lib.rs");
    let start = lib.find(START).expect("start marker in src/lib.rs") + START.len();
    let end = lib.find(END).expect("end marker in src/lib.rs");
    lib[start..end]
        .lines()
        .map(|l| l.trim_start_matches("//!").trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_documented_table_is_the_computed_one() {
    let computed = render_table();
    let documented = documented_table();
    if computed != documented {
        let paste: Vec<String> = computed.lines().map(|l| format!("//! {l}")).collect();
        panic!(
            "the numbers table in src/lib.rs is out of date; replace it with:\n{}",
            paste.join("\n")
        );
    }
}

#[test]
fn availability_arithmetic_at_its_edges() {
    let (h, r) = (100 * NS_PER_MS, 2 * NS_PER_MS);
    // L = 2H + r exactly: one lost round would leave the lease lapsing at the very instant the
    // next acknowledgement arrives, so none may be lost; zero lost is continuous.
    assert_eq!(lost_rounds_tolerated(2 * h + r, h, r), Some(0));
    assert_eq!(lost_rounds_tolerated(2 * h + r + 1, h, r), Some(1));
    assert_eq!(
        lost_rounds_tolerated(h + r, h, r),
        None,
        "lapses between rounds"
    );
    assert_eq!(lost_rounds_tolerated(r, h, r), None);
    assert_eq!(held_share_bp(h + r, h, r), 10_000);
    assert_eq!(held_share_bp(h / 2 + r, h, r), 5_000);
    assert_eq!(held_share_bp(r / 2, h, r), 0);
}

#[test]
fn every_row_is_valid_and_a_shorter_promise_is_refused() {
    for s in SETTINGS {
        let lease_ns = s.lease_ns();
        assert!(lease_ns > s.heartbeat_ns(), "{}: L above H", s.name);
        assert!(lease_ns < s.promise_ms * NS_PER_MS, "{}: L below P", s.name);
    }
    // The last row sits just above the limit: one millisecond less promise is refused.
    let edge = SETTINGS.last().expect("rows");
    let shorter = LeaseConfig {
        promise_ms: edge.promise_ms - 1,
        ..edge.lease()
    };
    assert!(matches!(
        shorter.validate(&edge.raft(), edge.tick_ms),
        Err(ConfigError::LeaseNotAboveHeartbeat { .. })
    ));
}
