//! Limits on what clients and peers can make a node hold: connections, header and body sizes,
//! and how long a connection may sit idle or dribble. Every limit has a documented default and
//! (for HTTP) a flag; peers' limits are constants, as only authenticated members reach them.

use std::time::Duration;

use clap::Args;

/// HTTP limits, as flags of `kv node`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open HTTP connections at most. When full, a newcomer closes the connection that matters
    /// least: one that never sent a request, then one idle between requests, then the slowest
    /// body; a connection waiting for its answer is never closed.
    #[arg(long = "http-max-connections", default_value_t = 512)]
    pub max_connections: usize,
    /// Open HTTP connections from one IP address at most; over it, a newcomer closes that
    /// address's own least useful connection (behind a proxy, raise it to the maximum).
    #[arg(long = "http-max-connections-per-ip", default_value_t = 128)]
    pub max_connections_per_ip: usize,
    /// Largest request head (request line and headers), in bytes; more gets 431. At least 8192.
    #[arg(long = "http-max-header-bytes", default_value_t = 16 << 10)]
    pub max_header_bytes: usize,
    /// Largest request body, in bytes (a PUT's value); more gets 413.
    #[arg(long = "http-max-body-bytes", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Time allowed, from a connection's start or its previous response, to the end of the next
    /// request head. It bounds idle keep-alive connections and slow headers.
    #[arg(long = "http-idle-timeout-ms", default_value_t = 30_000)]
    pub idle_timeout_ms: u64,
    /// Time allowed to receive a whole request body; a slower body gets 408.
    #[arg(long = "http-body-timeout-ms", default_value_t = 10_000)]
    pub body_timeout_ms: u64,
    /// Slowest body accepted, in bytes per second, after the first second: a body that falls
    /// behind it gets 408 at once.
    #[arg(long = "http-min-body-bytes-per-s", default_value_t = 16_384)]
    pub min_body_bytes_per_s: u64,
    /// Microseconds a connection keeps polling for its next request after it last moved a byte,
    /// before it waits on the reactor: on an idle machine a parked worker's CPU takes tens of
    /// microseconds to wake (see `http::spin_io`). It only uses time the worker would spend parked, at
    /// most this much per request, and nothing on an idle connection. 0 disables; at most 1000.
    #[arg(long = "http-spin-us", default_value_t = 50)]
    pub spin_us: u64,
}

/// hyper refuses a read buffer smaller than this.
pub const MIN_HEADER_BYTES: usize = 8192;
/// HTTPS handshakes must finish within this (peers: `transport::HANDSHAKE_TIMEOUT`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The grace before the minimum body rate applies.
pub const BODY_GRACE: Duration = Duration::from_secs(1);
/// Largest `--http-spin-us`: a spin is a short bridge over a wake-up, not a way to serve.
pub const MAX_SPIN_US: u64 = 1000;

impl HttpLimits {
    /// Refuse limits that would panic the server or make it useless.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            return Err(
                "--http-max-connections and --http-max-connections-per-ip must be at least 1"
                    .into(),
            );
        }
        if self.max_header_bytes < MIN_HEADER_BYTES {
            return Err(format!(
                "--http-max-header-bytes must be at least {MIN_HEADER_BYTES}"
            ));
        }
        if self.max_body_bytes == 0
            || self.idle_timeout_ms == 0
            || self.body_timeout_ms == 0
            || self.min_body_bytes_per_s == 0
        {
            return Err("HTTP body size, body rate and timeouts must be positive".into());
        }
        if self.spin_us > MAX_SPIN_US {
            return Err(format!("--http-spin-us must be at most {MAX_SPIN_US}"));
        }
        Ok(())
    }

    /// The idle / head timeout.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    /// The whole-body timeout.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }

    /// How long a connection polls for its next request (zero: not at all).
    pub fn spin(&self) -> Duration {
        Duration::from_micros(self.spin_us)
    }
}

/// Peer port limits. Reached only by authenticated members (or anyone, with `--insecure-peers`).
pub mod peer {
    use std::time::Duration;

    /// Largest frame: a message longer than this travels in several frames. A length prefix
    /// above it closes the connection before anything is allocated.
    pub const MAX_FRAME_BYTES: usize = 1 << 20;
    /// Bytes read per step while a frame arrives.
    pub const READ_STEP_BYTES: usize = 64 << 10;
    /// Connections whose handshake is not done, at once.
    pub const MAX_PENDING: usize = 64;
    /// Connections whose handshake is not done, from one address.
    pub const MAX_PENDING_PER_IP: usize = 16;
    /// Inbound connections per authenticated peer id (a reconnect may briefly overlap the old one).
    pub const MAX_CONNECTIONS_PER_PEER: usize = 4;
    /// Data sent on a peer connection and not acknowledged by the other end for this long fails
    /// the connection (`TCP_USER_TIMEOUT`): a peer behind a network that drops everything sends
    /// no reset, and without it a connection whose writes still fit in the kernel's buffer
    /// would look alive for minutes, then deliver stale messages after TCP's backed-off
    /// retransmissions once the network heals.
    pub const USER_TIMEOUT: Duration = Duration::from_secs(2);
    /// An idle peer connection is probed after this long, then every this long, and fails after
    /// [`KEEPALIVE_PROBES`] unanswered probes: a dead inbound connection ends within seconds.
    pub const KEEPALIVE: Duration = Duration::from_secs(1);
    /// Unanswered keep-alive probes before an idle peer connection fails.
    pub const KEEPALIVE_PROBES: u32 = 2;

    /// Set the peer connection options on `tcp`: no Nagle delay, the user timeout and
    /// keep-alives above.
    pub fn tune(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
        let sock = socket2::SockRef::from(tcp);
        sock.set_tcp_nodelay(true)?;
        sock.set_tcp_user_timeout(Some(USER_TIMEOUT))?;
        let probes = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE)
            .with_interval(KEEPALIVE)
            .with_retries(KEEPALIVE_PROBES);
        sock.set_tcp_keepalive(&probes)
    }
}

/// Raise this process's soft open-file limit to its hard limit and check that `needed`
/// descriptors fit; an HTTP server that runs out of descriptors cannot accept anyone.
pub fn ensure_open_files(needed: u64) -> Result<u64, String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err("getrlimit(RLIMIT_NOFILE) failed".into());
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    if lim.rlim_cur < needed {
        return Err(format!(
            "the open-file limit is {} but the connection limits need {needed}: lower \
             --http-max-connections or raise the limit (ulimit -n)",
            lim.rlim_cur
        ));
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> HttpLimits {
        HttpLimits {
            max_connections: 512,
            max_header_bytes: 16 << 10,
            max_body_bytes: 1 << 20,
            idle_timeout_ms: 30_000,
            body_timeout_ms: 10_000,
            max_connections_per_ip: 128,
            min_body_bytes_per_s: 16_384,
            spin_us: 50,
        }
    }

    #[test]
    fn limits_that_would_break_the_server_are_refused() {
        assert_eq!(defaults().validate(), Ok(()));
        let small_header = HttpLimits {
            max_header_bytes: MIN_HEADER_BYTES - 1,
            ..defaults()
        };
        assert!(small_header.validate().is_err());
        let no_conns = HttpLimits {
            max_connections: 0,
            ..defaults()
        };
        assert!(no_conns.validate().is_err());
        let no_timeout = HttpLimits {
            body_timeout_ms: 0,
            ..defaults()
        };
        assert!(no_timeout.validate().is_err());
        let long_spin = HttpLimits {
            spin_us: MAX_SPIN_US + 1,
            ..defaults()
        };
        assert!(long_spin.validate().is_err());
        let no_spin = HttpLimits {
            spin_us: 0,
            ..defaults()
        };
        assert_eq!(no_spin.validate(), Ok(()), "0 disables the spin");
    }
}
