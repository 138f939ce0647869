//! Every `:authority` etcd's Go clients send, written raw: a test client that writes HTTP/2's
//! frames itself (HPACK literals, RFC 7541), since ordinary clients refuse to send these.
//! Each form gets an answer from `Maintenance/Status`, on the store and on etcd 3.4; the
//! store's control (`--unsafe-authority-as-sent`) gets the URL forms refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use loona_hpack::{Decoder, Encoder};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The forms sent, `{ep}` standing for the endpoint's `host:port`; `None` sends no
/// `:authority` at all.
pub fn forms(ep: &str) -> Vec<Option<String>> {
    vec![
        Some(ep.to_string()),
        Some(format!("http://{ep}")),
        Some(format!("https://{ep}")),
        Some(format!("#initially=[http://{ep}]")),
        Some(format!("#initially=[http://{ep};http://127.0.0.1:1]")),
        Some("passthrough:///etcd-endpoints://0x1/127.0.0.1:2379".into()),
        None,
    ]
}

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[ty, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// What the server answered to one `Status` call on stream 1.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// The call's `grpc-status` trailer (0 is OK).
    GrpcStatus(String),
    /// The stream was reset, with this error code.
    Reset(u32),
    /// The connection ended (GOAWAY or closed) before an answer.
    Closed,
}

/// Call `Maintenance/Status` on `ep` with `authority` in the HEADERS frame.
pub fn status_call(ep: &str, authority: Option<&str>) -> Answer {
    let mut s = TcpStream::connect(ep).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut fields: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/etcdserverpb.Maintenance/Status"),
    ];
    if let Some(a) = authority {
        fields.push((b":authority", a.as_bytes()));
    }
    fields.push((b"content-type", b"application/grpc"));
    fields.push((b"te", b"trailers"));
    let block = Encoder::new().encode(fields);
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    bytes.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    bytes.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // an empty StatusRequest, END_STREAM
    s.write_all(&bytes).unwrap();
    read_answer(&mut s)
}

/// Read frames until stream 1 ends: its trailers, a reset, or the connection's end.
fn read_answer(s: &mut TcpStream) -> Answer {
    let mut decoder = Decoder::new();
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).is_err() {
            return Answer::Closed;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return Answer::Closed;
        }
        let (ty, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
        match ty {
            0x4 if flags & 0x1 == 0 => {
                let _ = s.write_all(&frame(0x4, 0x1, 0, &[])); // SETTINGS ACK
            }
            0x7 => return Answer::Closed, // GOAWAY
            0x3 if stream == 1 => {
                return Answer::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()))
            }
            0x1 if stream == 1 => {
                let fields = decoder
                    .decode(&payload)
                    .expect("the server's headers decode");
                if let Some((_, v)) = fields.iter().find(|(n, _)| n == b"grpc-status") {
                    return Answer::GrpcStatus(String::from_utf8_lossy(v).into());
                }
            }
            _ => {}
        }
    }
}

/// Every form gets `Status` answered (`grpc-status: 0`) at every member.
pub async fn every_form_answers(t: &crate::target::Target) {
    for ep in t.endpoints() {
        for form in forms(&ep) {
            let got = status_call(&ep, form.as_deref());
            assert_eq!(
                got,
                Answer::GrpcStatus("0".into()),
                "{}: :authority {form:?} on {ep}",
                t.name()
            );
        }
    }
}
