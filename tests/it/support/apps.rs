//! The apps behind the mesh: an HTTP/1.1 server and a line echo server, each answering with
//! its own name so a test knows which backend answered, and the clients that speak to them over
//! any byte stream (a TCP connection, a TLS stream, an HBONE [`super::hbone::Tunnel`]).

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::ca::WAIT;

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An HTTP/1.1 server answering every request `200` with the body
/// `backend <name> path <path>` (keep-alive, Content-Length).
pub struct HttpApp {
    pub address: SocketAddr,
    _accept: AbortOnDrop,
}

/// How an [`HttpApp`] answers, beyond its name and the path.
#[derive(Clone, Debug, Default)]
pub struct HttpAppOptions {
    /// Waits this long before each answer (a slow backend, for timeouts).
    pub delay: Option<std::time::Duration>,
    /// Adds the request's headers to the body, one `name: value` line each (names
    /// lower-cased, in order) after the first line.
    pub echo_headers: bool,
}

impl HttpApp {
    /// Listens on `address` (`127.0.20.x:port`; port 0 picks one).
    pub async fn start(address: SocketAddr, name: &str) -> Self {
        Self::start_with(address, name, HttpAppOptions::default()).await
    }

    /// [`HttpApp::start`] answering as `options` say.
    pub async fn start_with(address: SocketAddr, name: &str, options: HttpAppOptions) -> Self {
        let listener = TcpListener::bind(address)
            .await
            .unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let address = listener.local_addr().expect("local addr");
        let name = name.to_string();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let name = name.clone();
                let options = options.clone();
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    while let Some((path, headers)) = read_request(&mut stream).await {
                        if let Some(delay) = options.delay {
                            tokio::time::sleep(delay).await;
                        }
                        let mut body = format!("backend {name} path {path}");
                        if options.echo_headers {
                            for (header, value) in &headers {
                                body.push_str(&format!("\n{header}: {value}"));
                            }
                        }
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(response.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        HttpApp {
            address,
            _accept: AbortOnDrop(accept),
        }
    }
}

/// Reads one request's head (and a Content-Length body) and returns its path and headers
/// (names lower-cased); `None` at EOF or on garbage.
async fn read_request<S: AsyncRead + Unpin>(
    stream: &mut BufReader<S>,
) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if stream.read_line(&mut header).await.ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((path, headers))
}

/// A line echo server: each line `L` it reads is answered `<name>: L`.
pub struct EchoApp {
    pub address: SocketAddr,
    _accept: AbortOnDrop,
}

impl EchoApp {
    pub async fn start(address: SocketAddr, name: &str) -> Self {
        let listener = TcpListener::bind(address)
            .await
            .unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let address = listener.local_addr().expect("local addr");
        let name = name.to_string();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let name = name.clone();
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stream);
                    let mut line = String::new();
                    while matches!(lines.read_line(&mut line).await, Ok(n) if n > 0) {
                        let reply = format!("{name}: {line}");
                        if lines.write_all(reply.as_bytes()).await.is_err() {
                            break;
                        }
                        line.clear();
                    }
                });
            }
        });
        EchoApp {
            address,
            _accept: AbortOnDrop(accept),
        }
    }
}

/// Sends `line` (no newline) to an [`EchoApp`] over `stream` and returns its answer without
/// the newline (`"<name>: <line>"`). Fails the test on EOF or after the wait.
pub async fn echo<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, line: &str) -> String {
    let exchange = async {
        stream
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write the echo line");
        stream.flush().await.expect("flush");
        let mut answer = Vec::new();
        loop {
            let byte = stream.read_u8().await.unwrap_or_else(|e| {
                panic!(
                    "echo: stream ended after {:?}: {e}",
                    String::from_utf8_lossy(&answer)
                )
            });
            if byte == b'\n' {
                break;
            }
            answer.push(byte);
        }
        String::from_utf8(answer).expect("UTF-8 echo")
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .expect("no echo within the wait")
}

/// An HTTP/1.1 response.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Lower-case names, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET <path>` with `Host: <host>` over `stream` (keep-alive, so a stream can carry several);
/// returns (status, body). The body is read by Content-Length, chunked, or to EOF.
pub async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    path: &str,
) -> (u16, String) {
    let response = http_request(stream, "GET", host, path, &[]).await;
    (response.status, response.body)
}

/// A request with extra headers; fails the test if no whole response comes within the wait.
pub async fn http_request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    tokio::time::timeout(WAIT, try_http_request(stream, method, host, path, headers))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no response within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A request with extra headers, or why no whole response came (for tests that expect a
/// refusal); no timeout of its own.
pub async fn try_http_request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.flush().await?;
    read_response(stream).await
}

/// Reads one response. Reads byte by byte up to the body, so that nothing after the response
/// is consumed and the stream can carry the next one.
async fn read_response<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<HttpResponse> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let status_line = read_line(stream).await?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad(format!("status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(stream).await?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("header {line:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(length) = header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|_| bad(format!("content-length {length:?}")))?;
        body.resize(length, 0);
        stream.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let size = read_line(stream).await?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad(format!("chunk size {size:?}")))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !read_line(stream).await?.is_empty() {}
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            stream.read_exact(&mut body[start..]).await?;
            read_line(stream).await?;
        }
    } else if !matches!(status, 100..=199 | 204 | 304) {
        stream.read_to_end(&mut body).await?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// One CRLF- (or LF-) terminated line without its terminator.
async fn read_line<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<String> {
    let mut line = Vec::new();
    loop {
        match stream.read_u8().await? {
            b'\n' => break,
            byte => line.push(byte),
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}
