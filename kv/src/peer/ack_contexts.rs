//! Test data: heartbeat acknowledgement contexts a peer may send, for the frame, listener and
//! admission tests.

use raft_lease::ctx::{LayerCtx, Promised};

/// Heartbeat acknowledgement contexts a peer may send: a follower's acknowledgement with the
/// promise it made (25 bytes), the bare context of an older build, and garbage around both.
pub fn ack_contexts() -> Vec<Vec<u8>> {
    let promised = Promised {
        promise_ns: 300_000_000,
        drift_ppm: 100_000,
    };
    let ack = LayerCtx::Round(7).encode_ack(promised);
    assert_eq!(ack.len(), 25);
    let absurd = Promised {
        promise_ns: u64::MAX,
        drift_ppm: u32::MAX,
    };
    let mut odd_kind = ack.clone();
    odd_kind[12] = b'x';
    vec![
        ack.clone(),
        LayerCtx::Read(u64::MAX).encode_ack(absurd),
        LayerCtx::Round(1).encode_ack(Promised {
            promise_ns: 0,
            drift_ppm: 0,
        }),
        LayerCtx::Round(7).encode(),
        odd_kind,
        ack[..24].to_vec(),
        [ack.clone(), vec![0]].concat(),
        vec![0xa5; 25],
        vec![0xff; 64 << 10],
        Vec::new(),
    ]
}
