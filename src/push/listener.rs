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
