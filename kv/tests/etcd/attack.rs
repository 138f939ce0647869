//! Bad input on the etcd API's port, as an adversary or a broken client sends it: each gets
//! etcd's error code with a clear message, and the node keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, LeaseGrantOptions, PutOptions, WatchOptions,
};

use crate::cluster::Cluster;

fn status(e: etcd_client::Error) -> (tonic::Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC status: {other:?}"),
    }
}

async fn still_serves(ep: &str) {
    let mut c = Client::connect([ep], None).await.unwrap();
    c.put("alive", "yes", None).await.unwrap();
    assert_eq!(c.get("alive", None).await.unwrap().kvs()[0].value(), b"yes");
}

/// Oversized values, huge TTLs, chosen lease ids, membership calls, a full store: etcd's codes.
pub async fn refusals(c: &Cluster) {
    let ep = format!("127.0.0.1:{}", c.etcd_port(1));
    let mut cl = Client::connect([ep.as_str()], None).await.unwrap();
    let big = vec![b'x'; 4 << 20];
    let e = cl.put("big", big, None).await.unwrap_err();
    let (code, msg) = status(e);
    assert!(
        matches!(
            code,
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{code:?} {msg}"
    );
    let near = vec![b'y'; (1 << 20) + (64 << 10) + 1];
    let (code, msg) = status(cl.put("near", near, None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: request is too large"
        )
    );
    let (code, msg) = status(cl.lease_grant(10_000_000, None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (tonic::Code::OutOfRange, "etcdserver: too large lease TTL")
    );
    let chosen = Some(LeaseGrantOptions::new().with_id(42));
    let (code, msg) = status(cl.lease_grant(10, chosen).await.unwrap_err());
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(msg.contains("grant with ID 0"), "{msg}");
    let (code, msg) = status(cl.member_remove(2).await.unwrap_err());
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(msg.contains("/admin/members"), "says where to go: {msg}");
    let (code, _) = status(
        cl.put(
            "k",
            "v",
            Some(PutOptions::new().with_ignore_lease().with_lease(3)),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    still_serves(&ep).await;
}

/// The store refuses writes past `--quota-backend-bytes` with etcd's "database space exceeded"
/// and raises the NOSPACE alarm, as etcd does: a delete and a compaction still pass, writes and
/// lease grants stay refused while the alarm is raised (room or not), and `alarm disarm` lets
/// them through again.
pub async fn a_full_store(c: &Cluster) {
    let ep = format!("127.0.0.1:{}", c.etcd_port(1));
    let mut cl = Client::connect([ep.as_str()], None).await.unwrap();
    let value = vec![b'v'; 64 << 10];
    let mut puts = 0;
    let full = loop {
        match cl.put("same-key", value.clone(), None).await {
            Ok(_) => puts += 1,
            Err(e) => break status(e),
        }
        assert!(puts < 10_000, "never full");
    };
    let no_space = (
        tonic::Code::ResourceExhausted,
        "etcdserver: mvcc: database space exceeded".to_string(),
    );
    assert_eq!(full, no_space);
    let raised = cl
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    let raised: Vec<_> = raised.alarms().iter().map(|a| a.alarm()).collect();
    assert_eq!(raised, vec![AlarmType::Nospace], "the quota raised NOSPACE");
    let st = cl.status().await.unwrap();
    assert!(
        st.errors().iter().any(|e| e.contains("alarm:NOSPACE")),
        "{:?}",
        st.errors()
    );
    // As in etcd's no-space mode, a delete still passes (a lock can be released).
    let del = cl
        .delete("same-key", None)
        .await
        .expect("a delete passes a full store");
    let last = del.header().unwrap().revision();
    cl.compact(last, None).await.unwrap();
    // Room again, but the alarm holds every write back until it is disarmed.
    let held = cl.put("same-key", "small", None).await.unwrap_err();
    assert_eq!(status(held), no_space, "a put while NOSPACE is raised");
    let grant = cl.lease_grant(10, None).await.unwrap_err();
    assert_eq!(
        status(grant),
        no_space,
        "a lease grant while NOSPACE is raised"
    );
    // `etcdctl alarm disarm`: each raised alarm deactivated for its member.
    let member = raised_member(&mut cl).await;
    let opts = Some(member_of(member));
    let disarm = cl.alarm(AlarmAction::Deactivate, AlarmType::Nospace, opts);
    assert_eq!(
        disarm.await.unwrap().alarms().len(),
        1,
        "the disarm lowered it"
    );
    let left = cl
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    assert!(left.alarms().is_empty());
    cl.put("same-key", value, None)
        .await
        .expect("room again once disarmed");
}

/// The member that raised the NOSPACE alarm.
async fn raised_member(cl: &mut Client) -> u64 {
    let got = cl
        .alarm(AlarmAction::Get, AlarmType::Nospace, None)
        .await
        .unwrap();
    got.alarms()[0].member_id()
}

/// Alarm options naming `member`.
fn member_of(member: u64) -> AlarmOptions {
    let mut o = AlarmOptions::new();
    o.with_member(member);
    o
}

/// A stream may hold at most 1024 watchers: the next is canceled with the reason.
pub async fn too_many_watchers(c: &Cluster) {
    let ep = format!("127.0.0.1:{}", c.etcd_port(1));
    let mut cl = Client::connect([ep.as_str()], None).await.unwrap();
    let mut w = cl.watch("w0", None).await.unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    for i in 1..1025 {
        w.watch(format!("w{i}"), Some(WatchOptions::new()))
            .await
            .unwrap();
    }
    let mut refused = None;
    for _ in 0..1024 {
        let m = tokio::time::timeout(Duration::from_secs(10), w.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if m.canceled() {
            refused = Some(m.cancel_reason().to_string());
            break;
        }
    }
    assert!(refused.is_some_and(|r| r.contains("at most 1024 watchers")));
    still_serves(&ep).await;
}

/// Garbage on the port: random bytes, an HTTP/1 request, a cut HTTP/2 preface, a connection
/// left open and silent. The node keeps serving.
pub async fn garbage_on_the_port(c: &Cluster) {
    let port = c.etcd_port(1);
    let sends: [&[u8]; 4] = [
        b"\x00\x01\x02\xff\xfe garbage garbage garbage",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x00\x00\x00\x00\x00\x00garbage-frame",
    ];
    let mut silent = Vec::new();
    for bytes in sends {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(bytes);
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
        silent.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    still_serves(&format!("127.0.0.1:{port}")).await;
}

/// Connections past `--http-max-connections-per-ip` (128) are closed at once (of 140 from
/// one address, at most 128 are answered, and the rest see the connection closed), and when
/// the crowd leaves a client is served again.
pub async fn too_many_connections(c: &Cluster) {
    let port = c.etcd_port(1);
    let crowd: Vec<TcpStream> = (0..140)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (mut answered, mut closed) = (0, 0);
    for s in &crowd {
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        match s.read(&mut [0u8; 64]) {
            Ok(0) => closed += 1,
            Ok(_) => answered += 1,
            Err(_) => {}
        }
    }
    assert!(
        answered <= 128 && closed >= 1,
        "{answered} answered, {closed} closed of 140"
    );
    drop(crowd);
    std::thread::sleep(Duration::from_millis(300));
    still_serves(&format!("127.0.0.1:{port}")).await;
}

/// A request marked as forwarded, sent to a node that does not lead: refused as etcd's
/// "leader changed" (a forwarded request is never forwarded again), never looped.
pub async fn a_forged_forward_mark(c: &Cluster, follower: u64) {
    let ep = format!("http://127.0.0.1:{}", c.etcd_port(follower));
    let channel = tonic::transport::Endpoint::from_shared(ep)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(etcd_client::proto::PbPutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-raft-lease-forwarded", "1".parse().unwrap());
    let codec = tonic_prost::ProstCodec::<
        etcd_client::proto::PbPutRequest,
        etcd_client::proto::PbPutResponse,
    >::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Put");
    let e = grpc.unary(req, path, codec).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unavailable, "etcdserver: leader changed")
    );
}
