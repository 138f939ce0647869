use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// A frame: its header and payload.
fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame_header(payload.len(), ty, flags, stream, &mut out);
    out.extend_from_slice(payload);
    out
}

/// The frames of `bytes` (after the preface): type, flags, stream, payload.
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes(bytes[5..9].try_into().unwrap());
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

fn request(authority: &str, path: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(enc: &mut Encoder<'static>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    enc.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// Feed `bytes` in chunks of random sizes (seeded), as a socket would deliver them.
fn feed_chunked(bytes: &[u8], seed: u64) -> Result<Vec<u8>, RewriteError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut r, mut out, mut at) = (Rewriter::default(), Vec::new(), 0);
    while at < bytes.len() {
        let n = rng.gen_range(1..=64).min(bytes.len() - at);
        r.feed(&bytes[at..at + n], &mut out)?;
        at += n;
    }
    Ok(out)
}

#[test]
fn every_form_go_clients_send_names_its_host_and_port() {
    let cases: [(&str, Option<&str>); 8] = [
        ("127.0.0.1:2379", Some("127.0.0.1:2379")),
        ("localhost", Some("localhost")),
        ("http://127.0.0.1:2379", Some("127.0.0.1:2379")),
        ("https://node-1.example:2379/", Some("node-1.example:2379")),
        ("#initially=[https://10.0.0.1:2379]", Some("10.0.0.1:2379")),
        ("#initially=[http://a:1;http://b:2]", Some("a:1")),
        ("#initially=[]", None),
        ("", None),
    ];
    for (sent, want) in cases {
        let got = authority(sent.as_bytes()).map(|a| String::from_utf8(a).unwrap());
        assert_eq!(got.as_deref(), want, "{sent:?}");
    }
}

#[test]
fn a_url_authority_reaches_the_server_as_host_and_port_and_the_rest_is_untouched() {
    for seed in 0..16 {
        let mut client = Encoder::new();
        let mut bytes = PREFACE.to_vec();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        bytes.extend_from_slice(&settings);
        let sent = [
            request("http://127.0.0.1:2379", "/etcdserverpb.KV/Range"),
            request(
                "#initially=[https://127.0.0.1:2379]",
                "/etcdserverpb.KV/Put",
            ),
            request("127.0.0.1:2379", "/etcdserverpb.KV/Range"),
        ];
        let data = frame(0x0, 0x1, 1, &[0, 0, 0, 0, 2, 0x0a, 0x00]);
        for (i, fields) in sent.iter().enumerate() {
            let stream = 2 * i as u32 + 1;
            bytes.extend(frame(
                HEADERS,
                END_HEADERS,
                stream,
                &encode(&mut client, fields),
            ));
            bytes.extend(frame(0x0, 0x1, stream, &data[9..]));
        }
        let out = feed_chunked(&bytes, seed).unwrap();
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let got = frames(&out[PREFACE.len()..]);
        assert_eq!(got[0], (0x4, 0, 0, settings[9..].to_vec()));
        let mut server = Decoder::new();
        for (i, fields) in sent.iter().enumerate() {
            let (ty, flags, stream, block) = &got[1 + 2 * i];
            assert_eq!(
                (*ty, *flags, *stream),
                (HEADERS, END_HEADERS, 2 * i as u32 + 1)
            );
            let decoded = server.decode(block).unwrap();
            let mut want = fields.clone();
            want[3].1 = b"127.0.0.1:2379".to_vec();
            assert_eq!(decoded, want, "seed {seed}, request {i}");
            assert_eq!(got[2 + 2 * i].3, data[9..].to_vec());
        }
    }
}

#[test]
fn padding_priority_and_continuations_are_read_and_an_unnamed_authority_is_left_out() {
    let mut client = Encoder::new();
    let block = encode(&mut client, &request("#initially=[]", "/x"));
    let (a, b) = block.split_at(block.len() / 2);
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0x80, 0, 0, 0, 7]); // exclusive dependency on 0, weight 7
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(HEADERS, PADDED | PRIORITY | 0x1, 5, &payload));
    bytes.extend(frame(CONTINUATION, END_HEADERS, 5, b));
    let out = feed_chunked(&bytes, 7).unwrap();
    let got = frames(&out[PREFACE.len()..]);
    assert_eq!(got.len(), 1);
    let (ty, flags, stream, block) = &got[0];
    assert_eq!(
        (*ty, *flags, *stream),
        (HEADERS, PRIORITY | END_HEADERS | 0x1, 5)
    );
    assert_eq!(&block[..5], &[0x80, 0, 0, 0, 7]);
    let decoded = Decoder::new().decode(&block[5..]).unwrap();
    assert!(
        decoded.iter().all(|(n, _)| n != b":authority"),
        "{decoded:?}"
    );
    assert_eq!(decoded.len(), 5);
}

#[test]
fn http1_passes_through_untouched() {
    let bytes = b"GET /health HTTP/1.1\r\nHost: http://x\r\n\r\n".to_vec();
    assert_eq!(feed_chunked(&bytes, 1).unwrap(), bytes);
    // A prefix of the preface that then differs is HTTP/1 too.
    let bytes = b"PRI * HTTP/1.1\r\n\r\n".to_vec();
    assert_eq!(feed_chunked(&bytes, 2).unwrap(), bytes);
}

#[test]
fn a_huge_or_broken_header_block_is_refused() {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(HEADERS, 0, 1, &[0x40; 16]));
    let mut big = bytes.clone();
    for _ in 0..=MAX_HEADER_BLOCK_BYTES / MAX_FRAME_BYTES {
        big.extend(frame(CONTINUATION, 0, 1, &[0u8; MAX_FRAME_BYTES]));
    }
    assert_eq!(feed_chunked(&big, 3), Err(RewriteError::TooLarge));
    let mut interleaved = bytes.clone();
    interleaved.extend(frame(0x0, 0, 1, b"x"));
    assert!(matches!(
        feed_chunked(&interleaved, 4),
        Err(RewriteError::Malformed(_))
    ));
    let mut other_stream = bytes;
    other_stream.extend(frame(CONTINUATION, END_HEADERS, 3, b""));
    assert!(matches!(
        feed_chunked(&other_stream, 5),
        Err(RewriteError::Malformed(_))
    ));
    let mut garbage = PREFACE.to_vec();
    garbage.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ));
    assert!(matches!(
        feed_chunked(&garbage, 6),
        Err(RewriteError::BadHeaderBlock(_))
    ));
}
