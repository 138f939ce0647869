use raft_lease::sim::history::OpKind;
use raft_lease::sim::scenarios;
use raft_lease::sim::{OpResult, SimCluster};

#[test]
fn dbg() {
    let s = scenarios::all()
        .into_iter()
        .find(|s| s.name == "read round retried under its first context")
        .unwrap();
    let mut sim = SimCluster::new(s.config(0, false));
    (s.run)(&mut sim);
    for op in sim.history().ops() {
        let t = op.invoke_ns / 1_000_000;
        if t < 380 {
            continue;
        }
        let done = op.done.as_ref().map(|(d, r)| {
            (
                d / 1_000_000,
                match r {
                    OpResult::Read { value, served } => {
                        format!("read {:?} {:?}", value.as_ref().map(|v| v.1), served)
                    }
                    OpResult::Written { revision } => format!("w {revision}"),
                    OpResult::Failed(e) => format!("fail {e}"),
                },
            )
        });
        let kind = match &op.kind {
            OpKind::Put { .. } => "put",
            _ => "get",
        };
        println!("{} node {} {} {:?}", t, op.node, kind, done);
    }
    println!("{}", sim.describe());
}
