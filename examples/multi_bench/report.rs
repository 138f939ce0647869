//! One cell's results (a liveness mode at a number of groups), the table, the JSON, and the
//! goals computed from the measurements of this run.

use raft_lease::multi::LivenessMode;

use crate::measure::{Failover, Idle, Reads, Setup, BATCH};
use crate::timing;

/// Everything measured for one mode at one number of groups.
pub struct Cell {
    pub mode: LivenessMode,
    pub groups: u64,
    pub delay_us: u64,
    pub setup: Setup,
    pub idle: Idle,
    pub reads: Reads,
    pub failover: Failover,
}

pub fn mode_name(mode: LivenessMode) -> &'static str {
    match mode {
        LivenessMode::PerGroup => "per_group",
        LivenessMode::Shared => "shared",
    }
}

impl Cell {
    pub fn json(&self) -> serde_json::Value {
        let (s, i, r, f) = (&self.setup, &self.idle, &self.reads, &self.failover);
        serde_json::json!({
            "mode": mode_name(self.mode), "groups": self.groups,
            "idle_msgs_per_s": i.msgs_per_s, "idle_batches_per_s": i.batches_per_s,
            "idle_cpu_ms_per_s": i.cpu_ms_per_s, "groups_with_lease_pct": i.min_lease_pct,
            "idle_ticks_missed": i.ticks_missed,
            "read_p50_ns": round1(r.p50_ns), "read_batch": BATCH,
            "read_single_p50_ns": r.single_p50_ns, "read_p99_ns": r.p99_ns,
            "reads": r.reads, "reads_failed": r.failed,
            "read_local_p50_ns": round1(r.local_p50_ns),
            "read_local_single_p50_ns": r.local_single_p50_ns,
            "failover_p50_ms": f.p50_ms, "failover_max_ms": f.max_ms, "failover_groups": f.groups,
            "failover_unrecovered": f.unrecovered, "failover_over_bound": f.over_bound,
            "failover_bound_ms": timing::failover_bound_ms(), "failover_killed_node": f.killed,
            "setup_leased_ms": s.leased_ms, "setup_leased_groups": s.leased,
            "setup_quiescent_pct": s.quiescent_pct,
            "one_way_delay_us": self.delay_us, "tick_ms": timing::TICK_MS,
            "heartbeat_ms": timing::heartbeat_ms(), "election_ms": timing::election_ms(),
            "promise_ms": timing::promise_ms(),
        })
    }
}

/// `v` to one decimal, for the JSON.
fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("none".into(), |v| format!("{v:.0}"))
}

pub fn print_table(cells: &[Cell]) {
    println!(
        "{:<9} {:>6} {:>9} {:>7} {:>8} {:>7} {:>6} {:>7} {:>6} {:>7} {:>7} {:>6} {:>6} {:>6} {:>11} {:>6} {:>6}",
        "mode", "groups", "msgs/s", "batch/s", "cpu_ms/s", "lease%", "missed", "rd_p50",
        "rd_1", "rd_p99", "loc_p50", "loc_1", "fo_p50", "fo_max", "fo_late/led", "boot_s", "quiet%"
    );
    for c in cells {
        let (s, i, r, f) = (&c.setup, &c.idle, &c.reads, &c.failover);
        println!(
            "{:<9} {:>6} {:>9.0} {:>7.1} {:>8.2} {:>7.2} {:>6} {:>7.1} {:>6} {:>7} {:>7.1} {:>6} {:>6.0} {:>6} {:>11} {:>6.1} {:>6.1}",
            mode_name(c.mode), c.groups, i.msgs_per_s, i.batches_per_s, i.cpu_ms_per_s,
            i.min_lease_pct, i.ticks_missed, r.p50_ns, r.single_p50_ns, r.p99_ns, r.local_p50_ns,
            r.local_single_p50_ns, f.p50_ms,
            opt_ms(f.max_ms), format!("{}/{}", f.over_bound, f.groups), s.leased_ms / 1e3,
            s.quiescent_pct
        );
    }
    println!(
        "Per node: msgs/s and batch/s sent, cpu_ms/s node-thread CPU. lease%: lowest share of \
         groups with a leased leader over the idle window. missed: ticks the node threads were \
         too late for (all nodes, idle window). rd: lease reads on random groups through read \
         handles, ns: rd_p50 per read, the median over batches of {BATCH} reads timed together \
         of the batch's time / {BATCH}; rd_1 and rd_p99 of reads timed one by one (each with a \
         timer reading's cost, in the timer's steps). loc: the same random state load and clock \
         reading without the lease check, measured both ways. \
         fo: failover in ms after killing the node leading the most groups; late: groups led \
         again after P + election timeout + 1 s = {} ms, or never. boot_s: boot to every group \
         leased. quiet%: replicas quiescent after boot.",
        timing::failover_bound_ms()
    );
}

fn find(cells: &[Cell], mode: LivenessMode, groups: u64) -> Option<&Cell> {
    cells.iter().find(|c| c.mode == mode && c.groups == groups)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "HOLDS"
    } else {
        "FAILS"
    }
}

/// The goals at the largest number of groups measured, shared against per-group.
pub fn print_targets(cells: &[Cell]) {
    let Some(g) = cells.iter().map(|c| c.groups).max() else {
        return;
    };
    let (Some(s), Some(p)) = (
        find(cells, LivenessMode::Shared, g),
        find(cells, LivenessMode::PerGroup, g),
    ) else {
        println!("\ntargets: need both modes at {g} groups");
        return;
    };
    println!("\ntargets at {g} groups, shared liveness against per-group heartbeats:");
    let msgs = s.idle.msgs_per_s / p.idle.msgs_per_s.max(f64::MIN_POSITIVE);
    println!(
        "  idle messages   {:>9.0} / {:>9.0} msgs/s per node = 1/{:<8.0} (target ≤ 1/100)  {}",
        s.idle.msgs_per_s,
        p.idle.msgs_per_s,
        1.0 / msgs,
        verdict(msgs <= 0.01)
    );
    let cpu = s.idle.cpu_ms_per_s / p.idle.cpu_ms_per_s.max(f64::MIN_POSITIVE);
    println!(
        "  idle CPU        {:>9.2} / {:>9.2} ms/s per node  = 1/{:<8.1} (target ≤ 1/10)   {}",
        s.idle.cpu_ms_per_s,
        p.idle.cpu_ms_per_s,
        1.0 / cpu,
        verdict(cpu <= 0.1)
    );
    if p.idle.ticks_missed > 0 {
        println!(
            "                  (per-group node threads fell {} ticks behind over the idle window: \
             its CPU is what it got on this machine, not what it needed)",
            p.idle.ticks_missed
        );
    }
    let lease = s.idle.min_lease_pct;
    println!(
        "  groups leased   {lease:.2}% (lowest sample; per-group: {:.2}%)          (target 100%)   {}",
        p.idle.min_lease_pct, verdict(lease >= 100.0)
    );
    print_read_target(cells, s, p);
    let bound = timing::failover_bound_ms();
    let (fo, late) = (s.failover.max_ms, s.failover.over_bound);
    println!(
        "  failover max    {} ms, {late} of {} groups later than {bound} ms = P + election + 1 s (per-group: {} ms, {} of {})  {}",
        opt_ms(fo), s.failover.groups, opt_ms(p.failover.max_ms), p.failover.over_bound,
        p.failover.groups, verdict(late == 0 && s.failover.groups > 0)
    );
}

fn print_read_target(cells: &[Cell], s: &Cell, p: &Cell) {
    let Some(one) = find(cells, LivenessMode::Shared, 1) else {
        println!("  read p50        no shared cell at 1 group to compare with");
        return;
    };
    let ratio = s.reads.p50_ns / one.reads.p50_ns.max(f64::MIN_POSITIVE);
    let ok = ratio <= 1.2 && s.reads.reads > 0 && one.reads.reads > 0;
    println!(
        "  read p50        {:.1} ns at {} groups / {:.1} ns at 1 group = {ratio:.2}x  (target ≤ 1.2x)  {}",
        s.reads.p50_ns, s.groups, one.reads.p50_ns, verdict(ok)
    );
    let floor = s.reads.local_p50_ns / one.reads.local_p50_ns.max(f64::MIN_POSITIVE);
    println!(
        "                  (per read, batches of {BATCH}; floor without the lease check: {:.1} ns at {} groups, {:.1} ns at 1 = {floor:.2}x; \
         timed one by one: {} / {} ns, floor {} / {} ns; per-group mode: {:.1} ns at {} groups)",
        s.reads.local_p50_ns, s.groups, one.reads.local_p50_ns, s.reads.single_p50_ns,
        one.reads.single_p50_ns, s.reads.local_single_p50_ns, one.reads.local_single_p50_ns,
        p.reads.p50_ns, p.groups
    );
}
