//! `kv bench --data-scale`: the same data-scale scenario on the store and on etcd 3.4, one
//! system after the other, in one invocation.
//!
//! Each system runs three members on this machine, fresh in a dir of its own under the bench
//! dir, with a space quota of 8 GiB (`--quota-backend-bytes`); it is stopped and its dir
//! removed before the next starts. While a probe puts one small key every 20 ms (see `probe`),
//! the scenario runs five phases (see `phases`): a bulk load of N keys of 256-byte values by 32
//! writers in transactions of 100 puts, a follower killed with SIGKILL and restarted, all three
//! killed and restarted, a follower replaced by a fresh member, and ranges of the whole
//! keyspace from a follower and from the leader. Each phase reports the probe's p99 and
//! maximum, the failed client requests and its duration; the systems also report elections
//! outside the restart phases, each member's peak memory and its data dir's size.
//!
//! `--runs R` repeats the whole (the store then etcd, each run) and reports the medians; the
//! targets then hold the store to etcd's medians, and to zero failures, zero elections and
//! probe maxima of 1 s on its worst run. With no etcd binary the store runs alone.

pub mod phases;
pub mod probe;
pub mod report;
pub mod stats;
pub mod system;
pub mod view;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::bench::etcd::member;
use phases::{Phase, NAMES, TXN_PUTS, VALUE_BYTES, WRITERS};
use probe::Probe;
use report::{Run, SystemRun, ETCD, STORE};
use stats::RssSampler;
use system::{System, MEMBERS};

/// Both systems' space quota, bytes (8 GiB, etcd's largest recommended).
const QUOTA_BYTES: u64 = 8 << 30;

/// How long a started system may take to elect its first leader.
const FIRST_LEADER_WAIT: Duration = Duration::from_secs(60);

/// The most keys `key/%010d` can name.
const MAX_KEYS: u64 = 10_000_000_000;

/// What `kv bench --data-scale` runs.
pub struct DataScale {
    /// Keys to load (N).
    pub keys: u64,
    /// Runs of the whole scenario on both systems.
    pub runs: usize,
    /// The store's ports start here (as `kv cluster`'s); etcd's at 3000 above.
    pub base_port: u16,
    /// The etcd binary, if given.
    pub etcd_bin: Option<PathBuf>,
    /// Where to write the JSON.
    pub json: Option<PathBuf>,
    /// More flags for the store's nodes.
    pub node_args: Vec<String>,
}

/// Which system to start.
enum Which<'a> {
    /// The store.
    Store,
    /// etcd, this binary.
    Etcd(&'a Path),
}

/// Run the scenario `args.runs` times on each system, in `dir`; print and write the report.
pub fn run(args: &DataScale, dir: &Path) -> Result<(), (i32, String)> {
    if args.keys == 0 || args.keys > MAX_KEYS || args.runs == 0 {
        return Err((
            2,
            format!("--keys must be 1 to {MAX_KEYS}, --runs at least 1"),
        ));
    }
    let uptime_before = crate::bench::etcd::uptime();
    let etcd = find_etcd(args.etcd_bin.as_deref()).map_err(|e| (1, e))?;
    println!(
        "kv bench --data-scale: 3 members of the store, then of {}, on this machine ({} CPUs); \
         {} keys of {VALUE_BYTES} bytes by {WRITERS} writers in transactions of {TXN_PUTS} \
         puts; quota {QUOTA_BYTES} bytes; a probe puts one key every 20 ms; {} run(s)",
        etcd.as_ref()
            .map_or("etcd (absent: skipped)", |(_, v)| v.as_str()),
        crate::bench::report::cores(),
        args.keys,
        args.runs
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| (1, e.to_string()))?;
    let mut runs = Vec::new();
    for index in 1..=args.runs {
        let mut systems = Vec::new();
        let mut which = vec![Which::Store];
        which.extend(etcd.as_ref().map(|(bin, _)| Which::Etcd(bin)));
        for w in which {
            let measured = one_system(&runtime, &w, args, dir).map_err(|e| (1, e))?;
            measured.print(index);
            systems.push(measured);
        }
        runs.push(Run { index, systems });
    }
    report::print_medians(&runs);
    let targets = report::targets(&runs, &NAMES);
    report::print_targets(&targets);
    if etcd.is_none() {
        println!("  (etcd was skipped: no comparison with it)");
    }
    let Some(path) = &args.json else {
        return Ok(());
    };
    let (per_run, medians) = report::runs_json(&runs);
    let doc = json!({
        "bench": "kv bench --data-scale",
        "keys": args.keys,
        "value_bytes": VALUE_BYTES,
        "writers": WRITERS,
        "txn_puts": TXN_PUTS,
        "quota_backend_bytes": QUOTA_BYTES,
        "runs": args.runs,
        "cores": crate::bench::report::cores() as u64,
        "etcd": etcd.as_ref().map(|(_, v)| v.clone()),
        "etcd_skipped": etcd.is_none(),
        "uptime_before": uptime_before,
        "uptime_after": crate::bench::etcd::uptime(),
        "per_run": per_run,
        "medians": medians,
        "ratios_store_over_etcd": report::ratios(&runs),
        "targets": targets.iter().map(report::Target::to_json).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| (1, e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| (1, format!("{}: {e}", path.display())))
}

/// The etcd binary and its version, or `None` (said so: the store then runs alone).
fn find_etcd(explicit: Option<&Path>) -> Result<Option<(PathBuf, String)>, String> {
    let Some(bin) = member::etcd_bin(explicit) else {
        println!(
            "SKIPPED etcd: no etcd binary on the PATH (Debian and Ubuntu: apt-get install \
             etcd-server; or give --etcd-bin or $ETCD_BIN); the store runs alone"
        );
        return Ok(None);
    };
    let version = member::version(&bin)?;
    Ok(Some((bin, version)))
}

/// Start `which` fresh in a dir of its own under `dir`, run the phases with the probe and the
/// memory sampler, measure the data dirs, stop it and remove its dir.
fn one_system(
    runtime: &tokio::runtime::Runtime,
    which: &Which<'_>,
    args: &DataScale,
    dir: &Path,
) -> Result<SystemRun, String> {
    let quota = ["--quota-backend-bytes".to_string(), QUOTA_BYTES.to_string()];
    let name = match which {
        Which::Store => STORE,
        Which::Etcd(_) => ETCD,
    };
    let sys_dir = dir.join(name);
    std::fs::create_dir_all(&sys_dir).map_err(|e| format!("{}: {e}", sys_dir.display()))?;
    println!("\n{name}: starting 3 members in {}", sys_dir.display());
    let mut sys = match which {
        Which::Store => {
            let node_args: Vec<String> = quota.iter().chain(&args.node_args).cloned().collect();
            System::start_store(&sys_dir, args.base_port, &node_args)?
        }
        Which::Etcd(bin) => System::start_etcd(bin, &sys_dir, args.base_port + 3000, &quota)?,
    };
    let sampler = RssSampler::start(sys.rss.clone());
    let phases = runtime.block_on(measure(&mut sys, args.keys));
    drop(sampler);
    let data_dir_bytes = (0..MEMBERS)
        .map(|slot| stats::dir_bytes(&sys.member_dir(slot)))
        .collect();
    sys.stop();
    let rss_peak_bytes = sys.rss.peaks_bytes();
    drop(sys);
    let phases = phases.map_err(|e| format!("{name}: {e}\n{}", log_tails(&sys_dir)));
    let removed = std::fs::remove_dir_all(&sys_dir);
    let phases = phases?;
    removed.map_err(|e| format!("{}: {e}", sys_dir.display()))?;
    Ok(SystemRun {
        system: name,
        phases,
        rss_peak_bytes,
        data_dir_bytes,
    })
}

/// Wait for the first leader, then run the phases with the probe.
async fn measure(sys: &mut System, keys: u64) -> Result<Vec<Phase>, String> {
    view::view(sys.endpoints(), FIRST_LEADER_WAIT).await?;
    let probe = Probe::start(sys.endpoints().to_vec());
    let name = sys.name;
    let print = |p: &Phase| println!("  {}: {}", name, report::phase_line(p));
    let phases = phases::run_all(sys, &probe, keys, &print).await;
    let stopped = probe.stop();
    let phases = phases?;
    stopped?;
    Ok(phases)
}

/// The last lines of every log in `dir`, to show why a system failed before its dir goes.
fn log_tails(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut logs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out += &format!("--- {}\n", log.display());
        for line in &lines[lines.len().saturating_sub(8)..] {
            out += line;
            out.push('\n');
        }
    }
    out
}
