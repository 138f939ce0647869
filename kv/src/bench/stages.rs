//! Where the time of one write goes, from the nodes' own histograms (`/metrics`) read before and
//! after each cell (also the leader's writes per fsync): the leader's queue, commit and apply stages and its fsync, the followers'
//! turnaround of an append and their fsync; the client's measured mean gives the rest.

use serde_json::{json, Value};

/// Sums and counts of the histograms a write passes through, on one node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scrape {
    /// (sum, count) of: the HTTP write, queue, commit, apply, persist and append turnaround
    /// histograms (in seconds), and the proposals per batch.
    hist: [(f64, f64); 7],
}

const NAMES: [&str; 7] = [
    "kv_write_duration_seconds",
    "kv_write_stage_duration_seconds{stage=\"queue\"",
    "kv_write_stage_duration_seconds{stage=\"commit\"",
    "kv_write_stage_duration_seconds{stage=\"apply\"",
    "kv_log_persist_duration_seconds",
    "kv_append_turnaround_duration_seconds",
    "kv_proposals_per_batch",
];

impl Scrape {
    /// Read `addr`'s `/metrics` (zeros for what cannot be read).
    pub fn of(addr: &str) -> Scrape {
        let text = crate::http::client::request(addr, "GET", "/metrics", b"", &[])
            .map_or(String::new(), |a| a.body);
        let mut s = Scrape::default();
        for (i, name) in NAMES.iter().enumerate() {
            s.hist[i] = (value(&text, name, "_sum"), value(&text, name, "_count"));
        }
        s
    }

    /// The mean of histogram `i` between `self` (before) and `after` (0 if none).
    fn mean(&self, after: &Scrape, i: usize) -> f64 {
        let n = after.hist[i].1 - self.hist[i].1;
        match n > 0.0 {
            true => (after.hist[i].0 - self.hist[i].0) / n,
            false => 0.0,
        }
    }

    /// The same, of a histogram in seconds, in µs.
    fn mean_us(&self, after: &Scrape, i: usize) -> f64 {
        self.mean(after, i) * 1e6
    }

    /// On the leader, between `self` and `after`: writes proposed per batch (one fsync), and the
    /// mean time of that fsync in µs.
    pub fn batches(&self, after: &Scrape) -> (f64, f64) {
        (self.mean(after, 6), self.mean_us(after, 4))
    }
}

/// The value of the sample `name` + `suffix` (labels follow a `{`, or `name` opened them).
fn value(text: &str, name: &str, suffix: &str) -> f64 {
    let (base, labels) = name.split_once('{').unwrap_or((name, ""));
    let prefix = format!("{base}{suffix}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// One write's time, by stage, in mean µs over a cell.
#[derive(Debug, Clone, Copy)]
pub struct Stages {
    /// The client's measured mean.
    pub total_us: f64,
    /// The leader's HTTP worker: from the request's start to its answer.
    pub server_us: f64,
    /// To the raft thread.
    pub queue_us: f64,
    /// Proposal to apply.
    pub commit_us: f64,
    /// Apply to the answer's hand-off.
    pub apply_us: f64,
    /// The leader's log write and fsync.
    pub leader_fsync_us: f64,
    /// The followers' append turnaround: arrival to answer sent.
    pub follower_turnaround_us: f64,
    /// The followers' log write and fsync.
    pub follower_fsync_us: f64,
}

impl Stages {
    /// The stages of a cell whose client mean was `total_us`, from the leader's and the
    /// followers' scrapes before and after it.
    pub fn of(total_us: f64, leader: (&Scrape, &Scrape), followers: &[(Scrape, Scrape)]) -> Stages {
        let (b, a) = leader;
        let per_follower = |i| {
            let sum: f64 = followers.iter().map(|(b, a)| b.mean_us(a, i)).sum();
            sum / followers.len().max(1) as f64
        };
        Stages {
            total_us,
            server_us: b.mean_us(a, 0),
            queue_us: b.mean_us(a, 1),
            commit_us: b.mean_us(a, 2),
            apply_us: b.mean_us(a, 3),
            leader_fsync_us: b.mean_us(a, 4),
            follower_turnaround_us: per_follower(5),
            follower_fsync_us: per_follower(4),
        }
    }

    /// The stages of a write cell whose client mean was `total_us`, from every node's scrape
    /// before and after it; `leader` indexes the node the clients wrote to.
    pub fn around(total_us: f64, leader: usize, before: &[Scrape], after: &[Scrape]) -> Stages {
        let followers: Vec<(Scrape, Scrape)> = (0..before.len())
            .filter(|&i| i != leader)
            .map(|i| (before[i], after[i]))
            .collect();
        Stages::of(total_us, (&before[leader], &after[leader]), &followers)
    }

    /// Client, HTTP and loopback: the client's mean less the leader's own time.
    pub fn http_us(&self) -> f64 {
        (self.total_us - self.server_us).max(0.0)
    }

    /// The answer's way back from the raft thread to the HTTP worker.
    pub fn answer_us(&self) -> f64 {
        (self.server_us - self.queue_us - self.commit_us - self.apply_us).max(0.0)
    }

    /// The round to the followers less their turnaround: both transports, both ways, and the
    /// leader's wake-up on the answer.
    pub fn network_us(&self) -> f64 {
        (self.commit_us - self.follower_turnaround_us).max(0.0)
    }

    /// One line for the table.
    pub fn line(&self, engine: &str, clients: usize) -> String {
        format!(
            "{engine}: where a write's {:.0} µs go at {clients} client(s): client+HTTP {:.0}, queue {:.0}, commit {:.0} (leader fsync {:.0} overlaps the followers' turnaround {:.0}, of which fsync {:.0}, plus transport both ways {:.0}), apply {:.0}, answer hand-off {:.0}",
            self.total_us,
            self.http_us(),
            self.queue_us,
            self.commit_us,
            self.leader_fsync_us,
            self.follower_turnaround_us,
            self.follower_fsync_us,
            self.network_us(),
            self.apply_us,
            self.answer_us(),
        )
    }

    /// A JSON cell: `{"op": "write_stages", ...}`, every figure a mean in µs.
    pub fn to_json(self, engine: &str, clients: usize) -> Value {
        json!({
            "op": "write_stages",
            "engine": engine,
            "clients": clients,
            "total_us": self.total_us,
            "client_http_us": self.http_us(),
            "queue_us": self.queue_us,
            "commit_us": self.commit_us,
            "leader_fsync_us": self.leader_fsync_us,
            "follower_turnaround_us": self.follower_turnaround_us,
            "follower_fsync_us": self.follower_fsync_us,
            "transport_us": self.network_us(),
            "apply_us": self.apply_us,
            "answer_us": self.answer_us(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_by_name_and_label() {
        let text = "kv_write_stage_duration_seconds_sum{node=\"1\",stage=\"queue\"} 0.5\n\
                    kv_write_stage_duration_seconds_sum{node=\"1\",stage=\"commit\"} 2\n\
                    kv_write_duration_seconds_count{node=\"1\"} 4\n";
        assert_eq!(value(text, NAMES[1], "_sum"), 0.5);
        assert_eq!(value(text, NAMES[2], "_sum"), 2.0);
        assert_eq!(value(text, NAMES[0], "_count"), 4.0);
        assert_eq!(value(text, NAMES[3], "_sum"), 0.0, "absent: zero");
    }

    #[test]
    fn stages_add_up_to_the_clients_mean() {
        let before = Scrape::default();
        let leader = Scrape {
            hist: [
                (0.4, 1.0),
                (0.05, 1.0),
                (0.3, 1.0),
                (0.01, 1.0),
                (0.1, 1.0),
                (0.0, 0.0),
                (4.0, 2.0),
            ],
        };
        let mut follower = Scrape::default();
        follower.hist[4] = (0.1, 1.0);
        follower.hist[5] = (0.2, 1.0);
        let s = Stages::of(500_000.0, (&before, &leader), &[(before, follower)]);
        let parts = s.http_us() + s.queue_us + s.commit_us + s.apply_us + s.answer_us();
        assert!((parts - s.total_us).abs() < 1e-6, "{s:?}");
        assert!((s.network_us() - 100_000.0).abs() < 1e-6, "{s:?}");
        assert_eq!(before.batches(&leader), (2.0, 100_000.0));
    }
}
