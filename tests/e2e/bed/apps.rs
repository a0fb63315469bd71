//! The pods' applications and their clients. A server answers with what it saw, so a test
//! can tell which pod answered and what reached it: the HTTP server's body is `key=value`
//! lines (`server`, `peer`, `method`, `path`, then `header.<name>` for each header), and the
//! TCP server greets with `server=<name> peer=<address>` and then echoes each line.
//!
//! Servers run on threads inside the pod's namespace and stop when their [`Server`] is
//! dropped. Clients connect from inside a namespace (the socket is made there, so ztunnel's
//! redirection in that pod applies) and use blocking I/O with timeouts.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::netns::Netns;

/// How long a client waits to connect, and for each read.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A server thread; stopped on drop.
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    port: u16,
    /// The pod's namespace, to wake the blocked `accept` from inside it.
    netns: std::fs::File,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let (file, port) = (self.netns.try_clone(), self.port);
        if let Ok(file) = file {
            let _ = std::thread::spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
                TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), IO_TIMEOUT).ok()
            })
            .join();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Tcp,
    /// Reads to the end of the stream, then answers `received=<bytes>` (for throughput).
    Sink,
}

/// Starts a `protocol` server named `name` on `0.0.0.0:port` inside `netns`. It accepts
/// blocking (a connection is served the moment it comes) until dropped.
pub fn serve(netns: &Netns, name: &str, protocol: Protocol, port: u16) -> Server {
    let listener = netns.run(|| TcpListener::bind(("0.0.0.0", port)));
    let listener = listener.unwrap_or_else(|e| panic!("bind {port} in {}: {e}", netns.name()));
    let stop = Arc::new(AtomicBool::new(false));
    let name = name.to_string();
    let stopped = stop.clone();
    std::thread::Builder::new()
        .name(format!("app-{name}-{port}"))
        .spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let Ok(peer) = stream.peer_addr() else {
                    continue;
                };
                let name = name.clone();
                std::thread::spawn(move || {
                    // No Nagle: a reply waiting for a delayed ACK measures 40 ms of the
                    // kernel's, not the mesh's.
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
                    match protocol {
                        Protocol::Http => answer_http(stream, &name, peer),
                        Protocol::Tcp => answer_tcp(stream, &name, peer),
                        Protocol::Sink => answer_sink(stream),
                    }
                });
            }
        })
        .expect("spawn server");
    Server {
        stop,
        port,
        netns: netns.file(),
    }
}

/// Answers HTTP/1.1 requests on one connection until the client closes it or asks for the
/// connection to be closed.
fn answer_http(stream: TcpStream, name: &str, peer: SocketAddr) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let mut body = format!("server={name}\npeer={peer}\nmethod={method}\npath={path}\n");
        let mut length = 0usize;
        let mut close = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((key, value)) = line.split_once(':') {
                let key = key.trim().to_ascii_lowercase();
                if key == "content-length" {
                    length = value.trim().parse().unwrap_or(0);
                }
                if key == "connection" && value.trim().eq_ignore_ascii_case("close") {
                    close = true;
                }
                body.push_str(&format!("header.{key}={}\n", value.trim()));
            }
        }
        let mut discard = vec![0; length];
        if reader.read_exact(&mut discard).is_err() {
            return;
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// Greets, then echoes lines until the client closes.
fn answer_tcp(stream: TcpStream, name: &str, peer: SocketAddr) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    if writeln!(writer, "server={name} peer={peer}").is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if writer.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Counts what arrives until the client's end of stream, then says how much.
fn answer_sink(mut stream: TcpStream) {
    let mut buffer = vec![0u8; 256 * 1024];
    let mut received = 0u64;
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received += n as u64,
            Err(_) => return,
        }
    }
    let _ = writeln!(stream, "received={received}");
}

/// Sends `bytes` to a [`Protocol::Sink`] server and waits for its count: the whole transfer
/// has arrived when this returns.
pub fn send_bulk(from: &Netns, to: SocketAddr, bytes: u64) -> std::io::Result<u64> {
    let mut stream = connect(from, to)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let chunk = vec![0x5au8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer
        .trim()
        .strip_prefix("received=")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("the sink answered {answer:?}")))
}

/// An HTTP response as the client read it.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    /// A `key=value` line of an echo server's body.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.body.lines().find_map(|line| {
            line.split_once('=')
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)
        })
    }
}

/// Connects from inside `from` to `to`.
pub fn connect(from: &Netns, to: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = from.run(|| TcpStream::connect_timeout(&to, IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(stream)
}

/// One HTTP/1.1 request from inside `from` (`Connection: close`); an error when no whole
/// response came back (refused, reset, or closed before a status line).
pub fn http(
    from: &Netns,
    to: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
) -> std::io::Result<Response> {
    let mut stream = connect(from, to)?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\nuser-agent: ambientd-e2e\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let raw = read_response(&mut stream)?;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "no HTTP response from {to} ({} bytes: {:?})",
                raw.len(),
                String::from_utf8_lossy(&raw)
            ),
        )
    })
}

/// Reads one response: up to the end of a `content-length` body, else to the end of the
/// stream. (Envoy keeps a connection it answered itself open for a second after a
/// `connection: close` reply, waiting for the client to close first: reading to the end
/// would time that second, not the answer.)
fn read_response(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
            let length = head.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if length.is_some_and(|n| raw.len() >= head_end + 4 + n) {
                return Ok(raw);
            }
        }
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buffer[..n]);
    }
}

fn parse_response(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = match headers.get("transfer-encoding") {
        Some(coding) if coding.eq_ignore_ascii_case("chunked") => dechunk(body)?,
        _ => body.to_string(),
    };
    Some(Response { status, body })
}

/// A chunked body's content (Envoy's admin answers so).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// A TCP connection to an echo server: its greeting, then line round trips.
#[derive(Debug)]
pub struct TcpSession {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// `server=<name> peer=<address>`.
    pub greeting: String,
}

impl TcpSession {
    /// Connects from `from` and reads the greeting; an error if none came (the mesh refused
    /// the connection: ztunnel accepts it locally, then closes or resets it).
    pub fn open(from: &Netns, to: SocketAddr) -> std::io::Result<TcpSession> {
        let stream = connect(from, to)?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut greeting = String::new();
        if reader.read_line(&mut greeting)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("{to} closed the connection before its greeting"),
            ));
        }
        Ok(TcpSession {
            reader,
            writer: stream,
            greeting: greeting.trim_end().to_string(),
        })
    }

    /// Sends `line` and reads its echo.
    pub fn round_trip(&mut self, line: &str) -> std::io::Result<String> {
        writeln!(self.writer, "{line}")?;
        let mut echo = String::new();
        if self.reader.read_line(&mut echo)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(echo.trim_end().to_string())
    }

    pub fn close(self) {
        let _ = self.writer.shutdown(Shutdown::Both);
    }
}

/// Asks `server` (UDP port 53) inside `from` for the A records of `name`: the addresses,
/// or the response code when there are none (3 is NXDOMAIN). In a pod with DNS capture,
/// any server address reaches ztunnel's DNS proxy.
pub fn resolve(
    from: &Netns,
    server: std::net::Ipv4Addr,
    name: &str,
) -> Result<Vec<std::net::Ipv4Addr>, u8> {
    let mut query = vec![0x4e, 0x2d, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let answer = from
        .run(|| {
            let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
            socket.set_read_timeout(Some(IO_TIMEOUT))?;
            socket.send_to(&query, (server, 53))?;
            let mut buffer = [0u8; 1500];
            let n = socket.recv(&mut buffer)?;
            Ok::<_, std::io::Error>(buffer[..n].to_vec())
        })
        .unwrap_or_else(|e| panic!("DNS query for {name} to {server}: {e}"));
    parse_a_records(&answer).ok_or(answer.get(3).map_or(255, |flags| flags & 0x0f))
}

/// The A records of a DNS response, or `None` when it has none.
fn parse_a_records(message: &[u8]) -> Option<Vec<std::net::Ipv4Addr>> {
    let count = |at: usize| u16::from_be_bytes([message[at], message[at + 1]]) as usize;
    if message.len() < 12 || message[3] & 0x0f != 0 {
        return None;
    }
    let (questions, answers) = (count(4), count(6));
    // A name: labels up to a zero, or a compression pointer (two bytes).
    let skip_name = |mut at: usize| -> Option<usize> {
        loop {
            let length = *message.get(at)?;
            if length & 0xc0 == 0xc0 {
                return Some(at + 2);
            }
            if length == 0 {
                return Some(at + 1);
            }
            at += 1 + length as usize;
        }
    };
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(at)? + 4;
    }
    let mut found = Vec::new();
    for _ in 0..answers {
        at = skip_name(at)?;
        let record = message.get(at..at + 10)?;
        let (kind, length) = (
            u16::from_be_bytes([record[0], record[1]]),
            u16::from_be_bytes([record[8], record[9]]) as usize,
        );
        let data = message.get(at + 10..at + 10 + length)?;
        if kind == 1 && length == 4 {
            found.push(std::net::Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        at += 10 + length;
    }
    (!found.is_empty()).then_some(found)
}
