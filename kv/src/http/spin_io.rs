//! A connection that, after it answers, keeps looking for the next request for a short while
//! instead of leaving that to the reactor at once.
//!
//! Why: on an otherwise idle machine (a 2-vCPU VM here) a worker that parks in `epoll_wait` lets
//! its virtual CPU halt, and waking it for the next request costs tens of microseconds, far more
//! than a lease read. tokio cannot spin before it parks (`on_thread_park` runs before the park
//! but polls no I/O), so the connection does: when a read finds nothing within `spin` of the
//! connection's last write, it reads the socket itself (a non-blocking `recv`: tokio retries a
//! socket only after the reactor reports it) and, if that finds nothing either, yields the
//! worker to any waiting task ([`tokio::task::yield_now`]: the task runs again when its worker
//! has nothing else to do, after a zero-timeout poll of the I/O driver, and it never wakes
//! another worker). So the spin uses time the worker would have spent parked, and only right
//! after an answer:
//! - after `spin` with no byte, reads wait on the reactor: an idle connection costs nothing;
//! - reads after a read (a request arriving slowly, or being served) wait on the reactor, so a
//!   slow body costs no spin;
//! - a connection whose next request does not come within the spin (a client across a network,
//!   or a slow one) stops spinning after a few misses in a row ([`SpinOdds`]);
//! - no spin starts while the server has more connections open than workers: a busy worker
//!   rarely parks, and spins would take CPU from the other connections (and, on one machine,
//!   from their clients);
//! - a spin that loses its CPU to other work stops, and counts as a miss: on a busy machine
//!   CPUs do not halt, and a thread that blocks is woken ahead of that work, where a spinning
//!   one waits behind it;
//! - every timeout and limit of the server is a timer or check above this layer and works as
//!   before.
//!
//! Bytes read here bypass tokio's readiness cache; that is sound with its edge-triggered
//! registration: the data's arrival still reports the socket readable later, and a read then
//! finds nothing and waits again (one spurious poll).

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Spins in a row that run out with no byte before a connection stops spinning.
const MISSES_TO_STOP: u8 = 4;
/// Polls further apart than this mean the spin lost its CPU (or its worker) to other work: that
/// CPU is busy and will not halt, and a spinning thread only queues behind the work where a woken
/// one would preempt it. Such a spin stops and counts as a miss.
const MAX_POLL_GAP: Duration = Duration::from_micros(20);
/// A connection that stopped spinning still spins after every this many answers, to notice a
/// client that has become quick.
const PROBE_EVERY: u8 = 16;

/// When to spin, learned from the connection's own last spins. A client whose next request
/// comes within the spin (a local one in a loop) keeps it; one whose requests come later (across
/// a network, or slower than the spin) stops costing CPU after [`MISSES_TO_STOP`] misses in a
/// row, and is tried again after every [`PROBE_EVERY`]th answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct SpinOdds {
    /// Spins in a row that ran out with no byte; at most `MISSES_TO_STOP`.
    misses: u8,
    /// Answers since the last probe while stopped; below `PROBE_EVERY`.
    skipped: u8,
}

impl SpinOdds {
    /// Whether to spin for the input that follows this answer.
    fn should_spin(&mut self) -> bool {
        debug_assert!(self.misses <= MISSES_TO_STOP && self.skipped < PROBE_EVERY);
        if self.misses < MISSES_TO_STOP {
            return true;
        }
        self.skipped += 1;
        if self.skipped == PROBE_EVERY {
            self.skipped = 0;
            return true;
        }
        false
    }

    /// A spin found input.
    fn hit(&mut self) {
        *self = SpinOdds::default();
    }

    /// A spin ran out.
    fn missed(&mut self) {
        self.misses = (self.misses + 1).min(MISSES_TO_STOP);
    }
}

/// How the next read that finds nothing waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// On the reactor: the last activity was a read (a request arriving or being served).
    Reactor,
    /// The connection wrote last; the read decides (by [`SpinOdds`]) whether to spin.
    Undecided,
    /// Polling the socket itself until `active_at + spin`.
    Spinning,
}

/// Asked before each spin: true when the server is too busy for one.
pub type Crowded = Box<dyn Fn() -> bool + Send + Sync>;

/// A TCP connection that, after it answers, polls for the next request for a short while.
pub struct SpinIo {
    tcp: TcpStream,
    /// How long after the last write a read keeps polling; zero disables.
    spin: Duration,
    /// Whether the server has more open connections than workers: then a worker rarely parks
    /// anyway, and a spin would only take CPU from the others (asked before each spin).
    crowded: Crowded,
    /// The last time a byte was read or written (or the connection began).
    active_at: Instant,
    /// While spinning: the last poll (or the spin's start).
    polled_at: Instant,
    /// [`MAX_POLL_GAP`] (a test's clock can stall anywhere).
    max_poll_gap: Duration,
    wait: Wait,
    odds: SpinOdds,
}

impl SpinIo {
    /// Wrap `tcp`; `spin` zero makes it a plain `TcpStream`. No spin starts while `crowded()`.
    pub fn new(tcp: TcpStream, spin: Duration, crowded: Crowded) -> Self {
        SpinIo {
            tcp,
            spin,
            crowded,
            active_at: Instant::now(),
            polled_at: Instant::now(),
            max_poll_gap: MAX_POLL_GAP,
            wait: Wait::Reactor,
            odds: SpinOdds::default(),
        }
    }

    /// Bytes arrived (by the reactor or by the spin).
    fn arrived(&mut self) {
        if self.wait == Wait::Spinning {
            self.odds.hit();
        }
        self.wait = Wait::Reactor;
        self.active_at = Instant::now();
    }

    /// Whether a read that found nothing should poll again rather than wait on the reactor.
    fn keep_spinning(&mut self) -> bool {
        let now = Instant::now();
        if self.wait == Wait::Undecided {
            self.wait = match !(self.crowded)() && self.odds.should_spin() {
                true => Wait::Spinning,
                false => Wait::Reactor,
            };
            self.polled_at = now;
        }
        if self.wait != Wait::Spinning {
            return false;
        }
        let ran_out = now.saturating_duration_since(self.active_at) >= self.spin;
        let preempted = now.saturating_duration_since(self.polled_at) > self.max_poll_gap;
        self.polled_at = now;
        if ran_out || preempted {
            self.odds.missed();
            self.wait = Wait::Reactor;
        }
        self.wait == Wait::Spinning
    }

    /// One non-blocking read straight from the socket into `buf`.
    fn try_recv(&self, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
        // SAFETY: `recv` only writes bytes into the slice; it never de-initializes any.
        let n = SockRef::from(&self.tcp).recv(unsafe { buf.unfilled_mut() })?;
        // SAFETY: the kernel wrote (initialized) the first `n` bytes of the unfilled part.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Ok(n)
    }
}

impl AsyncRead for SpinIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        if let Poll::Ready(r) = Pin::new(&mut self.tcp).poll_read(cx, buf) {
            if buf.filled().len() > before {
                self.arrived();
            }
            return Poll::Ready(r);
        }
        if !self.keep_spinning() {
            return Poll::Pending; // the reactor wakes the task
        }
        match self.try_recv(buf) {
            Ok(n) => {
                if n > 0 {
                    self.arrived();
                }
                Poll::Ready(Ok(())) // n == 0: end of stream
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                // Poll again once the worker is out of other work, so the spin never delays a
                // task. (Not `sched_yield`: on a busy machine it queues the spinner behind
                // other work, and measured 10 µs slower at the p50.)
                std::hint::spin_loop();
                let _ = pin!(tokio::task::yield_now()).poll(cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for SpinIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) && !self.spin.is_zero() {
            self.active_at = Instant::now();
            self.wait = Wait::Undecided;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    const HOUR: Duration = Duration::from_secs(3600);
    const SECOND: Duration = Duration::from_secs(1);

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A server-side `SpinIo` and its client. The runtime's reactor runs only until the socket
    /// is writable, before any input: after that only the spin can see input, and only the spin
    /// wakes the task.
    fn pair(rt: &tokio::runtime::Runtime, spin: Duration) -> (SpinIo, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut io = SpinIo::new(
            TcpStream::from_std(server).unwrap(),
            spin,
            Box::new(|| false),
        );
        io.max_poll_gap = HOUR; // a stalled test thread is no preemption (see the preempted case)
        rt.block_on(io.tcp.writable()).unwrap();
        (io, client)
    }

    /// A runtime whose reactor runs only when a test drives it.
    fn reactor() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    /// One poll: its result (`None`: pending) and the bytes it read.
    fn poll(io: &mut SpinIo, waker: &Waker) -> Option<Vec<u8>> {
        let mut store = [0u8; 64];
        let mut buf = ReadBuf::new(&mut store);
        match Pin::new(io).poll_read(&mut Context::from_waker(waker), &mut buf) {
            Poll::Ready(r) => {
                r.unwrap();
                Some(buf.filled().to_vec())
            }
            Poll::Pending => None,
        }
    }

    /// The server answers (writes) on `io`.
    fn answer(io: &mut SpinIo, waker: &Waker) {
        let w = Pin::new(io).poll_write(&mut Context::from_waker(waker), b"HTTP/1.1 200 OK\r\n");
        assert!(matches!(w, Poll::Ready(Ok(n)) if n > 0));
    }

    #[test]
    fn only_a_connection_that_just_answered_polls_again() {
        let rt = reactor();
        let _in = rt.enter();
        // (spin, answered, what else happened, whether the task is woken to poll again)
        let cases = [
            (HOUR, true, "", true),
            (HOUR, false, "", false), // read last (or nothing yet): the reactor
            (HOUR, true, "ran out", false),
            (HOUR, true, "preempted", false),
            (HOUR, true, "crowded", false),
            (Duration::ZERO, true, "", false),
        ];
        for (spin, answered, event, spins) in cases {
            let (mut io, _client) = pair(&rt, spin);
            let wakes = Arc::new(Wakes::default());
            let waker = Waker::from(wakes.clone());
            if event == "crowded" {
                io.crowded = Box::new(|| true);
            }
            if answered {
                answer(&mut io, &waker);
            }
            assert_eq!(poll(&mut io, &waker), None, "no input yet");
            let polls = wakes.0.load(Ordering::SeqCst);
            match event {
                "ran out" => {
                    io.spin = Duration::from_millis(500);
                    io.active_at -= SECOND;
                }
                "preempted" => {
                    io.max_poll_gap = MAX_POLL_GAP;
                    io.polled_at -= SECOND;
                }
                _ => {}
            }
            assert_eq!(poll(&mut io, &waker), None, "no input yet");
            let woken = wakes.0.load(Ordering::SeqCst) > polls;
            assert_eq!(woken, spins, "spin {spin:?}, answered {answered}, {event}");
            let missed = u8::from(event == "ran out" || event == "preempted");
            assert_eq!(io.odds.misses, missed, "a spin that stops early is a miss");
        }
    }

    #[test]
    fn the_spin_reads_bytes_whole_and_in_order_and_sees_the_end() {
        let rt = reactor();
        let _in = rt.enter();
        let waker = Waker::from(Arc::new(Wakes::default()));
        // Control: without the spin, input waits for the reactor, which nothing drives here.
        let (mut plain, mut client) = pair(&rt, Duration::ZERO);
        answer(&mut plain, &waker);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(poll(&mut plain, &waker), None);
        let (mut io, mut client) = pair(&rt, HOUR);
        let mut got = Vec::new();
        for part in [&b"GET / HTTP/1.1\r\n"[..], b"Host: kv\r\n\r\n"] {
            answer(&mut io, &waker);
            client.write_all(part).unwrap();
            let before = got.len();
            while got.len() < before + part.len() {
                got.extend(poll(&mut io, &waker).unwrap_or_default());
            }
            assert_eq!(io.wait, Wait::Reactor, "a read ends the spin");
        }
        assert_eq!(got, b"GET / HTTP/1.1\r\nHost: kv\r\n\r\n");
        assert_eq!(io.odds, SpinOdds::default(), "every spin found its input");
        answer(&mut io, &waker);
        client.shutdown(std::net::Shutdown::Write).unwrap(); // (a drop would reset: answers unread)
        let end = loop {
            if let Some(bytes) = poll(&mut io, &waker) {
                break bytes;
            }
        };
        assert!(end.is_empty(), "the end of the stream reads as no bytes");
    }

    #[test]
    fn a_client_that_never_comes_within_the_spin_stops_costing_it_until_a_probe_hits() {
        let mut odds = SpinOdds::default();
        for _ in 0..MISSES_TO_STOP {
            assert!(odds.should_spin(), "a miss or three do not stop it");
            odds.missed();
        }
        let spun: Vec<bool> = (0..2 * PROBE_EVERY).map(|_| odds.should_spin()).collect();
        let probes: Vec<usize> = (0..spun.len()).filter(|&i| spun[i]).collect();
        let every = usize::from(PROBE_EVERY);
        assert_eq!(probes, [every - 1, 2 * every - 1], "one answer in {every}");
        odds.missed(); // a probe that misses keeps it stopped
        assert!(!odds.should_spin());
        odds.hit(); // one that hits starts it again
        assert!((0..PROBE_EVERY).all(|_| odds.should_spin()));
    }
}
