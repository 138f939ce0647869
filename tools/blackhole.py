#!/usr/bin/env python3
"""The KV under a blackhole the kernel makes, beside the same cut made inside the process.

Three nodes on test hosts of their own (`kv hosts up`, network namespaces 10.77.0.1-3), writes
going on throughout. Each trial cuts one node off for HOLD seconds, either with nftables in its
namespace (every packet to and from the other nodes dropped: no reset, as a firewall that drops)
or with `/admin/partition` (the transport drops the messages itself), and measures:

- a follower cut off: how long the leader's transport takes to give up its connection (the log
  line), the most bytes the leader queues for it (`kv_peer_queued_bytes`) and the leader's
  resident memory, and how long the follower takes to catch up once healed;
- the leader cut off: when its lease ends (its `/status`), when another node leads with a lease,
  and when a write is answered (failover), each from the cut; and how long the old leader takes
  to follow again once healed.

Run as root from the repository, after `cargo build --release --bin kv`:
`python3 tools/blackhole.py [--trials 5] [--hold-s 6] [--json FILE]`. It prints a table of
medians and maxima per way of cutting. It only ever sends to its own test hosts' addresses.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

KV = os.environ.get("KV", "target/release/kv")
IDS = [1, 2, 3]
ADDR = {i: f"10.77.0.{i}" for i in IDS}
TOKEN = "blackhole-admin-token-0123456789"


def http(i, method, path, body=None, timeout=1.0):
    req = urllib.request.Request(f"http://{ADDR[i]}:8001{path}", data=body, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception:
        return None, b""


def status(i):
    code, body = http(i, "GET", "/status", timeout=0.5)
    return json.loads(body) if code == 200 else None


def nft(i, rules):
    """Replace node i's packet filter with `rules` (lines for an inet input/output filter)."""
    inp = [r for r in rules if r.startswith("ip saddr")]
    out = [r for r in rules if r.startswith("ip daddr")]
    def chain(n, rs):
        body = "".join(f"    {r}\n" for r in rs)
        return f"  chain {n} {{\n    type filter hook {n} priority 0; policy accept;\n{body}  }}\n"
    script = f"table inet bh\ndelete table inet bh\ntable inet bh {{\n{chain('input', inp)}{chain('output', out)}}}\n"
    subprocess.run(["ip", "netns", "exec", f"rlkhost-{i}", "nft", "-f", "-"], input=script.encode(), check=True)


def cut(i, kernel):
    others = [ADDR[o] for o in IDS if o != i]
    if kernel:
        s = "{ " + ", ".join(others) + " }"
        nft(i, [f"ip saddr {s} drop", f"ip daddr {s} drop"])
    else:
        for o in IDS:
            body = json.dumps({"peers": [o for o in IDS if o != i] if o == i else [i]}).encode()
            http(o, "POST", "/admin/partition", body)


def heal(i, kernel):
    if kernel:
        nft(i, [])
    for o in IDS:
        http(o, "POST", "/admin/heal", b"")


def leader(exclude=()):
    for i in IDS:
        if i in exclude:
            continue
        s = status(i)
        if s and s["role"] == "leader" and s["lease"]["state"] != "expired":
            return i
    return None


def wait(cond, secs=30, step=0.01, since=None):
    """Poll `cond` until it holds: (seconds since `since`, default now, and its value)."""
    t0 = time.monotonic()
    since = t0 if since is None else since
    while time.monotonic() - t0 < secs:
        v = cond()
        if v:
            return time.monotonic() - since, v
        time.sleep(step)
    return None, None


def log_time(path, pattern, after_wall):
    """The wall time of the first line of the log matching `pattern` logged after `after_wall`."""
    for line in open(path, errors="replace"):
        m = re.match(r"(\w{3} \d{2} \d{2}:\d{2}:\d{2}\.\d{3})", line)
        if not m or not re.search(pattern, line):
            continue
        t = time.strptime(time.strftime("%Y ") + m.group(1)[:-4], "%Y %b %d %H:%M:%S")
        wall = time.mktime(t) + int(m.group(1)[-3:]) / 1000
        if wall >= after_wall - 0.001:
            return wall
    return None


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def queued_bytes(i):
    code, body = http(i, "GET", "/metrics", timeout=0.5)
    m = re.search(rb"^kv_peer_queued_bytes\{[^}]*\} (\S+)", body or b"", re.M)
    return float(m.group(1)) if code == 200 and m else 0.0


class Writer(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop = False
        self.ok = 0

    def run(self):
        n = 0
        while not self.stop:
            n += 1
            code, _ = http(IDS[n % 3], "PUT", f"/kv/k{n % 100}", b"x" * 512, timeout=0.5)
            self.ok += code == 200
            time.sleep(0.005)


def follower_trial(procs, logs, kernel, hold):
    l = wait(leader)[1]
    f = next(i for i in IDS if i != l)
    t0 = time.time()
    cut(f, kernel)
    most_q, most_rss, t_end = 0.0, 0, time.monotonic() + hold
    while time.monotonic() < t_end:
        most_q = max(most_q, queued_bytes(l))
        most_rss = max(most_rss, rss_kib(procs[l].pid))
        time.sleep(0.1)
    gave_up = log_time(logs[l], rf"peer: {f}\b.*(peer connection failed|peer unreachable)|(peer connection failed|peer unreachable).*peer: {f}\b", t0)
    target = status(l)["commit"]
    heal(f, kernel)
    caught_up, _ = wait(lambda: (status(f) or {}).get("applied", 0) >= target)
    return {
        "gave_up_s": None if gave_up is None else round(gave_up - t0, 3),
        "max_queued_bytes": most_q,
        "max_rss_kib": most_rss,
        "caught_up_after_heal_s": caught_up,
    }


def leader_trial(kernel, hold):
    l = wait(leader)[1]
    t0 = time.monotonic()
    cut(l, kernel)
    expired = lambda: (status(l) or {"lease": {"state": "expired"}})["lease"]["state"] == "expired"
    lease_end, _ = wait(expired, since=t0)
    failover, new = wait(lambda: leader(exclude=(l,)), since=t0)
    put = lambda: http(new, "PUT", "/kv/after", b"1", timeout=0.5)[0] == 200
    wrote, _ = wait(put, since=t0) if new else (None, None)
    time.sleep(max(0.0, hold - (time.monotonic() - t0)))
    heal(l, kernel)
    back, _ = wait(lambda: (status(l) or {}).get("role") == "follower")
    return {
        "lease_ended_s": lease_end,
        "new_leader_s": failover,
        "write_served_s": wrote,
        "old_leader_follows_after_heal_s": back,
    }


def start(tmp):
    subprocess.run([KV, "hosts", "down", "--ids", "1,2,3"], capture_output=True)
    subprocess.run([KV, "hosts", "up", "--ids", "1,2,3"], check=True, capture_output=True)
    subprocess.run([KV, "certs", "--dir", f"{tmp}/tls", "--ids", "1,2,3"], check=True, capture_output=True)
    open(f"{tmp}/token", "w").write(TOKEN)
    peers = ",".join(f"{i}={ADDR[i]}:7001" for i in IDS)
    peer_http = ",".join(f"{i}={ADDR[i]}:8001" for i in IDS)
    procs, logs = {}, {}
    for i in IDS:
        logs[i] = f"{tmp}/node{i}.log"
        cmd = ["ip", "netns", "exec", f"rlkhost-{i}", KV, "node", "--id", str(i), "--cluster-id", "bh",
               "--peers", peers, "--peer-http", peer_http, "--http", f"{ADDR[i]}:8001",
               "--data-dir", f"{tmp}/data{i}", "--peer-ca", f"{tmp}/tls/ca.pem",
               "--peer-cert", f"{tmp}/tls/node-{i}.pem", "--peer-key", f"{tmp}/tls/node-{i}.key",
               "--admin-token-file", f"{tmp}/token", "--fault-injection"]
        procs[i] = subprocess.Popen(cmd, stderr=open(logs[i], "w"), stdout=subprocess.DEVNULL)
    if wait(leader)[0] is None:
        raise SystemExit("no leader within 30 s")
    return procs, logs


def summary(rows, key):
    vals = [r[key] for r in rows if r[key] is not None]
    if not vals:
        return "none"
    return f"median {statistics.median(vals):.3f}, max {max(vals):.3f} (n={len(vals)}/{len(rows)})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--hold-s", type=float, default=6.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = start(tmp)
        writer = Writer()
        writer.start()
        results = {}
        try:
            for kernel in (True, False):
                way = "nftables" if kernel else "in-process"
                results[way] = {"follower": [], "leader": []}
                for _ in range(a.trials):
                    results[way]["follower"].append(follower_trial(procs, logs, kernel, a.hold_s))
                    time.sleep(1)
                    results[way]["leader"].append(leader_trial(kernel, a.hold_s))
                    time.sleep(1)
        finally:
            writer.stop = True
            for p in procs.values():
                p.kill()
            subprocess.run([KV, "hosts", "down", "--ids", "1,2,3"], capture_output=True)
        results["writes_acknowledged"] = writer.ok
        results["hold_s"] = a.hold_s
        for way in ("nftables", "in-process"):
            print(f"== {way} (cut {a.hold_s} s, {a.trials} trials)")
            for part, keys in (("follower", ["gave_up_s", "max_queued_bytes", "max_rss_kib", "caught_up_after_heal_s"]),
                               ("leader", ["lease_ended_s", "new_leader_s", "write_served_s", "old_leader_follows_after_heal_s"])):
                for k in keys:
                    print(f"  {part} {k}: {summary(results[way][part], k)}")
        if a.json:
            json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
