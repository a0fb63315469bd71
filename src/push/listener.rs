//! The xDS listeners' socket and HTTP/2 settings (15010, and 15012 with the CA).

use std::time::Duration;

/// How often the server pings an idle connection, and how long it waits for the answer
/// (istiod's keepalive: 30 s and 10 s). ztunnel pings every 30 s itself; the h2 server answers
/// pings at any rate (it has no ping-abuse limit, so no ENHANCE_YOUR_CALM), which is tested.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's HTTP/2 receive windows (stream and connection): how much of a request a proxy
/// may send before the server reads it. A stream waiting for the large-request budget
/// (`route::REQUEST_BUDGET_BYTES`) holds up to this much of its request in HTTP/2's buffers: at
/// hyper's default of 1 MiB, 1,000 reconnecting proxies (benchmark T6) would hold about 1 GB.
/// 256 KiB still uploads a reconnect's 8 MB request at hundreds of MB/s over an in-cluster round
/// trip.
pub const RECEIVE_WINDOW: u32 = 256 * 1024;

/// The largest header block (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`: names, values and 32
/// bytes per field) a request may carry: hyper's default, set here so it is ours and
/// documented (docs/xds.md, "Limits"). A ztunnel's largest is its bearer token (a projected
/// service-account token, 1–2 KiB). A larger block is answered with HTTP 431 and the stream
/// refused before any handler runs.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// The tonic server settings for a listener that serves xDS (15010, and 15012 with the CA):
/// keepalive so that dead proxies are noticed, and [`RECEIVE_WINDOW`]. The receive windows only
/// bound what proxies upload (requests; the largest is a reconnect's
/// `initial_resource_versions`); how fast responses go out is set by the proxy's windows
/// (ztunnel: hyper's client defaults). None of the HTTP/2 settings tonic or hyper expose
/// changes what an idle connection holds: windows are counters, 16 KiB frames are HTTP/2's
/// minimum, and h2's codec buffers (16 KiB write, 8 KiB read, 4 KiB HPACK) are fixed in stock
/// h2, which is why ambientd builds with a patched one (vendor/h2/AMBIENTD-PATCH.md).
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(Some(RECEIVE_WINDOW))
        .initial_connection_window_size(Some(RECEIVE_WINDOW))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
}

/// Binds a listener for proxies (15010, 15012) with an accept queue as long as the kernel
/// allows (`net.core.somaxconn`, as Go's listeners and so istiod's use), not tokio's 1,024.
/// After a control-plane restart every ztunnel reconnects at once; while the server is busy
/// answering the first of them, a short queue overflows, and the kernel then drops or resets
/// the rest: benchmark T6's 1,000 clients overflow tokio's default (docs/xds.md).
pub fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match address {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    let backlog = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4096);
    socket.listen(backlog)
}

/// A proxy's TCP connection (15010, 15012) that acknowledges at once what it receives.
///
/// A client that writes one request in two small writes with Nagle's algorithm on holds the
/// second until the first is acknowledged, and Linux delays that ACK (up to 40 ms) on a
/// connection that has been answering. ztunnel's CA client does just that: each CSR's HTTP/2
/// HEADERS and DATA frames go out separately, so every certificate asked for on an existing
/// connection (a new pod's) waited 40 ms before ambientd saw its body. The end-to-end bed
/// measured it (docs/testing.md, BENCHMARKS.md E1: a new pod's first request 99 ms after its
/// manifest, 60 ms without the stall). Linux clears `TCP_QUICKACK` as the connection goes on
/// (sending soon after receiving turns delayed ACKs back on), so it is set again after every
/// read and write: one `setsockopt` each.
#[derive(Debug)]
pub struct ProxyConnection {
    inner: tokio::net::TcpStream,
}

impl ProxyConnection {
    pub fn new(tcp: tokio::net::TcpStream) -> Self {
        let connection = ProxyConnection { inner: tcp };
        connection.ack_at_once();
        connection
    }

    fn ack_at_once(&self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let _ = self.inner.set_quickack(true);
    }
}

impl tokio::io::AsyncRead for ProxyConnection {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.ack_at_once();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for ProxyConnection {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.ack_at_once();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.ack_at_once();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The plaintext listener's connections (15010), each a [`ProxyConnection`], for
/// `Server::serve_with_incoming`.
pub fn proxy_connections(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<ProxyConnection>> {
    use futures::StreamExt as _;
    tokio_stream::wrappers::TcpListenerStream::new(listener)
        .map(|accepted| accepted.map(ProxyConnection::new))
}

impl tonic::transport::server::Connected for ProxyConnection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::ProxyConnection;

    /// A client with Nagle's algorithm on (as ztunnel's CA client) writes each request in two
    /// small writes, the second held until the first is acknowledged. On a connection that
    /// has been answering, Linux delays that ACK 40 ms; a `ProxyConnection` acknowledges at
    /// once, so the answer comes in well under that.
    #[tokio::test]
    async fn a_request_written_in_two_pieces_is_answered_without_a_delayed_ack() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut connection = ProxyConnection::new(tcp);
            let mut request = [0u8; 2];
            while connection.read_exact(&mut request).await.is_ok() {
                if connection.write_all(b"k").await.is_err() {
                    return;
                }
            }
        });
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        client.set_nodelay(false).unwrap();
        let mut answer = [0u8; 1];
        // Request and answer a few times, as a proxy does: the server side leaves the quick
        // ACKs of a new connection and starts delaying them.
        for _ in 0..8 {
            client.write_all(b"ab").await.unwrap();
            client.read_exact(&mut answer).await.unwrap();
        }
        let mut fastest = Duration::MAX;
        for _ in 0..5 {
            let started = Instant::now();
            client.write_all(b"a").await.unwrap();
            client.write_all(b"b").await.unwrap();
            client.read_exact(&mut answer).await.unwrap();
            fastest = fastest.min(started.elapsed());
        }
        assert!(
            fastest < Duration::from_millis(20),
            "the fastest of five two-piece requests took {fastest:?}: a delayed ACK held it"
        );
    }
}
