//! Test hosts in network namespaces, for `kv nemesis --netns` and `kv hosts`: each node in a Linux network
//! namespace of its own, with its own address on a bridge in the root namespace (where the
//! clients run), and network faults made by the kernel's packet filter (nftables) inside the
//! namespaces: packets dropped (no reset), connections rejected (a TCP reset), one way only,
//! between two nodes only, or a few percent at random. Every address is one this run gave its
//! own namespaces; nothing else is ever sent to.
//!
//! Made with `ip` (iproute2) and `nft`, as root. Everything is removed on drop.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use thiserror::Error;

/// The exit code of `kv hosts up` and `kv nemesis --netns` where namespaces or nftables cannot
/// be had.
pub const UNAVAILABLE_EXIT: i32 = 5;

/// Why the test hosts could not be made or changed.
#[derive(Debug, Error)]
pub enum NetnsError {
    /// Not root, or `ip`/`nft` missing, or the kernel refused a namespace.
    #[error("network namespaces are not available here: {0}")]
    Unavailable(String),
    /// A command failed while the hosts were in use.
    #[error("{0}")]
    Command(String),
}

/// How packets between two nodes are stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Block {
    /// Dropped: the sender hears nothing (a firewall that drops, a blackhole).
    Drop,
    /// Rejected: a TCP packet is answered with a reset.
    Reject,
}

/// What one node's packet filter does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rules {
    /// Peers whose packets to this node are stopped, and how.
    from: BTreeMap<u64, Block>,
    /// Peers this node's packets to are stopped, and how.
    to: BTreeMap<u64, Block>,
    /// Percent of the packets between this node and every peer dropped at random.
    loss_percent: u32,
}

/// The test hosts: one namespace per node id, a bridge, and each node's packet filter.
pub struct Hosts {
    /// A tag unique to this run, in every name it makes.
    tag: String,
    /// The /24 prefix, `10.77.N`.
    prefix: String,
    ids: Vec<u64>,
    rules: BTreeMap<u64, Rules>,
    /// Whether dropping this removes the hosts (the nemesis's own; `kv hosts` keeps them).
    remove_on_drop: bool,
}

fn run(cmd: &mut Command) -> Result<(), NetnsError> {
    let out = cmd
        .output()
        .map_err(|e| NetnsError::Command(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(NetnsError::Command(format!("{cmd:?}: {}", err.trim())))
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    run(Command::new("ip").args(args))
}

/// Whether this machine already routes `prefix.0/24` (or a network inside it): test hosts there
/// would shadow it.
fn routed(prefix: &str) -> bool {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "root", &format!("{prefix}.0/24")])
        .output();
    out.map_or(true, |o| !o.stdout.is_empty())
}

impl Hosts {
    /// Namespaces for `ids` on a bridge, with the root namespace at `.254`; `Unavailable` if
    /// this machine cannot make them (the caller says so and exits with its own code).
    pub fn create(ids: &[u64]) -> Result<Hosts, NetnsError> {
        Hosts::check_available()?;
        let pid = std::process::id();
        let tag = format!("{}", pid % 100_000);
        let free = (0..250).map(|k| format!("10.77.{}", 1 + (pid + k) % 250));
        let prefix = free.into_iter().find(|p| !routed(p)).ok_or_else(|| {
            NetnsError::Unavailable("every 10.77.N.0/24 is routed here already".into())
        })?;
        let mut hosts = Hosts::named(&tag, &prefix, ids);
        hosts.remove_on_drop = true;
        if let Err(e) = hosts.build() {
            hosts.remove();
            return Err(e);
        }
        Ok(hosts)
    }

    /// Root, `ip` and `nft`, or why not.
    fn check_available() -> Result<(), NetnsError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetnsError::Unavailable("run as root".into()));
        }
        for tool in ["ip", "nft"] {
            let found = Command::new(tool).arg("-V").stdout(Stdio::null()).status();
            if !found.is_ok_and(|s| s.success()) {
                return Err(NetnsError::Unavailable(format!(
                    "`{tool}` not found (iproute2 and nftables are needed)"
                )));
            }
        }
        Ok(())
    }

    /// The hosts `ids` of the name `tag` on the /24 `prefix` (`10.77.0`), as [`Hosts::create`]
    /// or `kv hosts up` makes them: nothing is made, checked, or removed on drop.
    pub fn named(tag: &str, prefix: &str, ids: &[u64]) -> Hosts {
        Hosts {
            tag: tag.to_string(),
            prefix: prefix.to_string(),
            ids: ids.to_vec(),
            rules: ids.iter().map(|&i| (i, Rules::default())).collect(),
            remove_on_drop: false,
        }
    }

    /// Make these hosts, kept after this process ends (`kv hosts up`; `kv hosts down` removes
    /// them).
    pub fn build_and_keep(&self) -> Result<(), NetnsError> {
        self.build()
    }

    /// Remove whatever of these hosts exists: the namespaces (and so their links), the bridge.
    pub fn remove(&self) {
        for &id in &self.ids {
            let _ = ip(&["netns", "del", &self.ns(id)]);
            let _ = ip(&["link", "del", &format!("rlkv{}n{id}", self.tag)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }

    fn bridge(&self) -> String {
        format!("rlkb{}", self.tag)
    }

    /// Node `id`'s namespace.
    pub fn ns(&self, id: u64) -> String {
        format!("rlk{}-{id}", self.tag)
    }

    /// Node `id`'s address.
    pub fn addr(&self, id: u64) -> String {
        format!("{}.{id}", self.prefix)
    }

    /// Make the bridge, the namespaces and their (empty) packet filters; `Unavailable` where
    /// this machine cannot.
    fn build(&self) -> Result<(), NetnsError> {
        Hosts::check_available()?;
        if routed(&self.prefix) {
            return Err(NetnsError::Command(format!(
                "{}.0/24 is routed here already (another network, or hosts not removed): \
                 choose another subnet",
                self.prefix
            )));
        }
        match self.build_all() {
            Err(NetnsError::Command(e)) if e.starts_with(r#""ip" "netns" "add""#) => {
                Err(NetnsError::Unavailable(e))
            }
            built => built,
        }
    }

    fn build_all(&self) -> Result<(), NetnsError> {
        let br = self.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.254/24", self.prefix),
            "dev",
            &br,
        ])?;
        ip(&["link", "set", &br, "up"])?;
        for &id in &self.ids {
            let (ns, host_end, ns_end) = (self.ns(id), format!("rlkv{}n{id}", self.tag), "eth0");
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", ns_end, "netns", &ns,
            ])?;
            ip(&["link", "set", &host_end, "master", &br, "up"])?;
            let inside = |args: &[&str]| {
                let mut a = vec!["netns", "exec", &ns, "ip"];
                a.extend_from_slice(args);
                ip(&a)
            };
            inside(&["link", "set", "lo", "up"])?;
            inside(&[
                "addr",
                "add",
                &format!("{}/24", self.addr(id)),
                "dev",
                ns_end,
            ])?;
            inside(&["link", "set", ns_end, "up"])?;
            self.apply(id)?;
        }
        Ok(())
    }

    /// The command that runs `program` in node `id`'s namespace.
    pub fn command(&self, id: u64, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(id)]).arg(program);
        c
    }

    /// Stop packets between `a` and `b`: both ways, or (`one_way`) only what `a` sends `b`.
    pub fn block(&mut self, a: u64, b: u64, how: Block, one_way: bool) -> Result<(), NetnsError> {
        self.rules.entry(a).or_default().to.insert(b, how);
        self.rules.entry(b).or_default().from.insert(a, how);
        if !one_way {
            self.rules.entry(a).or_default().from.insert(b, how);
            self.rules.entry(b).or_default().to.insert(a, how);
        }
        self.apply(a)?;
        self.apply(b)
    }

    /// Drop `percent` of the packets between `id` and every peer, at random (both ways).
    pub fn loss(&mut self, id: u64, percent: u32) -> Result<(), NetnsError> {
        assert!(percent <= 100, "a loss of {percent}%");
        self.rules.entry(id).or_default().loss_percent = percent;
        self.apply(id)
    }

    /// Remove every rule that stops packets to or from `id`, on every node.
    pub fn heal(&mut self, id: u64) -> Result<(), NetnsError> {
        let mut touched = BTreeSet::from([id]);
        self.rules.insert(id, Rules::default());
        for (&other, r) in self.rules.iter_mut() {
            if r.from.remove(&id).is_some() | r.to.remove(&id).is_some() {
                touched.insert(other);
            }
        }
        touched.into_iter().try_for_each(|n| self.apply(n))
    }

    /// Node `id`'s whole ruleset, replaced at once (`nft -f`: one transaction).
    fn apply(&self, id: u64) -> Result<(), NetnsError> {
        let text = self.render(id);
        let mut child = self
            .command_in(id, "nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| NetnsError::Command(format!("nft: {e}")))?;
        let written = child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes());
        let out = child
            .wait_with_output()
            .map_err(|e| NetnsError::Command(e.to_string()))?;
        if written.is_err() || !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(NetnsError::Command(format!(
                "nft in {}: {}\n{text}",
                self.ns(id),
                err.trim()
            )));
        }
        Ok(())
    }

    fn command_in(&self, id: u64, tool: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(id), tool]);
        c
    }

    /// The nft script for node `id`: a table of its own, made anew.
    fn render(&self, id: u64) -> String {
        let r = self.rules.get(&id).cloned().unwrap_or_default();
        let set = |ids: Vec<u64>| {
            let addrs: Vec<String> = ids.into_iter().map(|i| self.addr(i)).collect();
            format!("{{ {} }}", addrs.join(", "))
        };
        let of = |m: &BTreeMap<u64, Block>, how: Block| -> Vec<u64> {
            m.iter()
                .filter(|(_, &b)| b == how)
                .map(|(&i, _)| i)
                .collect()
        };
        let peers: Vec<u64> = self.ids.iter().copied().filter(|&i| i != id).collect();
        let mut input = Vec::new();
        let mut output = Vec::new();
        for (rules, m, dir) in [
            (&mut input, &r.from, "saddr"),
            (&mut output, &r.to, "daddr"),
        ] {
            let dropped = of(m, Block::Drop);
            if !dropped.is_empty() {
                rules.push(format!("ip {dir} {} drop", set(dropped)));
            }
            let rejected = of(m, Block::Reject);
            if !rejected.is_empty() {
                let s = set(rejected);
                rules.push(format!(
                    "ip {dir} {s} meta l4proto tcp reject with tcp reset"
                ));
                rules.push(format!("ip {dir} {s} drop"));
            }
            if r.loss_percent > 0 && !peers.is_empty() {
                let p = r.loss_percent;
                rules.push(format!(
                    "ip {dir} {} numgen random mod 100 < {p} drop",
                    set(peers.clone())
                ));
            }
        }
        let chain = |name: &str, rules: &[String]| {
            let body: String = rules.iter().map(|l| format!("    {l}\n")).collect();
            format!("  chain {name} {{\n    type filter hook {name} priority 0; policy accept;\n{body}  }}\n")
        };
        format!(
            "table inet rl\ndelete table inet rl\ntable inet rl {{\n{}{}}}\n",
            chain("input", &input),
            chain("output", &output)
        )
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if self.remove_on_drop {
            self.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Hosts {
        Hosts::named("1", "10.77.9", &[1, 2, 3])
    }

    #[test]
    fn rules_name_only_the_peers_a_fault_touches() {
        let mut h = hosts();
        assert!(!h.render(1).contains("drop"), "no fault, no rule");
        h.rules.get_mut(&1).unwrap().to.insert(2, Block::Drop);
        h.rules.get_mut(&1).unwrap().from.insert(3, Block::Reject);
        h.rules.get_mut(&1).unwrap().loss_percent = 4;
        let text = h.render(1);
        assert!(text.contains("ip daddr { 10.77.9.2 } drop"), "{text}");
        assert!(
            text.contains("ip saddr { 10.77.9.3 } meta l4proto tcp reject with tcp reset"),
            "{text}"
        );
        assert!(
            text.contains("ip saddr { 10.77.9.2, 10.77.9.3 } numgen random mod 100 < 4 drop"),
            "{text}"
        );
        assert!(
            !text.contains("10.77.9.254"),
            "the clients' address is never stopped: {text}"
        );
        assert!(
            text.starts_with("table inet rl\ndelete table inet rl\n"),
            "replaced at once"
        );
    }
}
