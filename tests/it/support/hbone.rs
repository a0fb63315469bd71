//! HBONE peers around a waypoint Envoy, as ztunnel speaks it: mutual TLS 1.3 with SPIFFE
//! certificates from ambientd's CA, ALPN h2, and one HTTP/2 CONNECT stream per tunnelled
//! connection with `:authority` = the destination `ip:port`.
//!
//! * [`HboneConnection`] / [`connect`]: the calling ztunnel (outbound). A [`Tunnel`] is the
//!   CONNECT stream as an `AsyncRead + AsyncWrite` byte stream; [`super::apps`] speaks HTTP/1.1
//!   or the echo protocol over it.
//! * [`HboneServer`]: the destination node's ztunnel (inbound) on `<pod ip>:15008`. It requires
//!   a client certificate from the same root, records who called and for which authority, and
//!   forwards each stream to the app at that authority.
//!
//! Envoy's listeners set SO_REUSEPORT, and so does [`HboneServer`]: a server on
//! `127.0.20.x:15008` binds beside Envoy's `0.0.0.0:15008` and Linux hands it the connections
//! to its own address (the most specific bound address wins; `waypoint_harness` checks it).
//! The same property means two servers on one address would silently share its connections:
//! tests that bind 15008 hold [`super::envoy::exclusive`].

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tonic::codegen::http::{Method, Request, Response, StatusCode};

use super::ca::WAIT;
use super::identity::WorkloadCert;

/// The HBONE port.
pub const HBONE_PORT: u16 = 15008;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(cert: &WorkloadCert) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for der in ambientd::ca::keys::certificates(cert.root_pem.as_bytes()).expect("root PEM") {
        roots.add(der).expect("root");
    }
    Arc::new(roots)
}

fn chain_and_key(cert: &WorkloadCert) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let chain = ambientd::ca::keys::certificates(cert.chain_pem.as_bytes()).expect("chain PEM");
    let block = ambientd::ca::keys::pem_blocks(cert.key_pem.as_bytes())
        .expect("key PEM")
        .into_iter()
        .find(|b| b.label == "PRIVATE KEY")
        .expect("a PKCS#8 PRIVATE KEY block");
    (chain, PrivateKeyDer::Pkcs8(block.der.into()))
}

/// The SPIFFE URI SAN of a certificate, if it has one.
pub fn spiffe_of(der: &CertificateDer<'_>) -> Option<String> {
    ambientd::ca::authn::spiffe_id_of(der)
        .ok()
        .map(|id| id.to_string())
}

/// Checks the server's chain against the root, not its name: the certificates have only a
/// SPIFFE URI SAN, and ztunnel checks that identity after the handshake (as [`Tunnel`]'s
/// `peer_identity` lets a test do).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first, then the name: a name error means the chain is good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Client TLS as ztunnel's outbound: TLS 1.3 only, `cert` as the client certificate, servers
/// verified against `cert`'s root (chain only), ALPN `alpn` (HBONE: `["h2"]`).
pub fn client_tls(cert: &WorkloadCert, alpn: &[&str]) -> Arc<ClientConfig> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(cert), provider())
        .build()
        .expect("server verifier");
    let (chain, key) = chain_and_key(cert);
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
        .with_client_auth_cert(chain, key)
        .expect("client certificate");
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// [`client_tls`] without a client certificate (for checking that servers refuse one).
pub fn client_tls_anonymous(cert: &WorkloadCert, alpn: &[&str]) -> Arc<ClientConfig> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(cert), provider())
        .build()
        .expect("server verifier");
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// Server TLS as ztunnel's inbound: TLS 1.3 only, `cert` as the server certificate, a client
/// certificate required and verified against `cert`'s root, ALPN `alpn`.
pub fn server_tls(cert: &WorkloadCert, alpn: &[&str]) -> Arc<ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(cert), provider())
        .build()
        .expect("client verifier");
    let (chain, key) = chain_and_key(cert);
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server certificate");
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `address` (no SNI: the server name is the IP address) and the server's
/// SPIFFE identity.
pub async fn tls_connect(
    address: SocketAddr,
    tls: Arc<ClientConfig>,
) -> std::io::Result<(tokio_rustls::client::TlsStream<TcpStream>, Option<String>)> {
    let handshake = async {
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        tokio_rustls::TlsConnector::from(tls)
            .connect(ServerName::IpAddress(address.ip().into()), tcp)
            .await
    };
    let stream = tokio::time::timeout(WAIT, handshake).await.map_err(|_| {
        std::io::Error::other(format!("TLS to {address}: no handshake in {WAIT:?}"))
    })??;
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(spiffe_of);
    Ok((stream, peer))
}

/// Why a CONNECT failed.
#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    #[error("connecting: {0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP/2: {0}")]
    H2(#[from] h2::Error),
    /// The peer answered the CONNECT with a status other than 200.
    #[error("CONNECT answered {0}")]
    Refused(u16),
    #[error("no answer to the CONNECT within the wait")]
    Timeout,
}

/// One mutual-TLS HTTP/2 connection to an HBONE server (Envoy's 15008 or an [`HboneServer`]),
/// on which tunnels open as CONNECT streams, as ztunnel pools them.
pub struct HboneConnection {
    requests: h2::client::SendRequest<Bytes>,
    /// The server's SPIFFE identity from its verified certificate.
    pub peer_identity: Option<String>,
    /// The ALPN protocol the server chose.
    pub alpn: Option<Vec<u8>>,
}

impl HboneConnection {
    /// Opens the TLS connection (ALPN h2) and the HTTP/2 session to `address`.
    pub async fn open(address: SocketAddr, cert: &WorkloadCert) -> Result<Self, HboneError> {
        Self::open_with(address, client_tls(cert, &["h2"])).await
    }

    pub async fn open_with(
        address: SocketAddr,
        tls: Arc<ClientConfig>,
    ) -> Result<Self, HboneError> {
        let (stream, peer_identity) = tls_connect(address, tls).await?;
        let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let (requests, connection) = h2::client::handshake(stream).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("hbone client connection to {address}: {error}");
            }
        });
        Ok(HboneConnection {
            requests,
            peer_identity,
            alpn,
        })
    }

    /// Opens a CONNECT stream to `authority` (`ip:port`); `Err(Refused(status))` if the server
    /// answers with anything but 200.
    pub async fn connect(&self, authority: &str) -> Result<Tunnel, HboneError> {
        self.connect_with_headers(authority, &[]).await
    }

    /// [`HboneConnection::connect`] with extra request headers (ztunnel sends `baggage`,
    /// `forwarded`, `traceparent`).
    pub async fn connect_with_headers(
        &self,
        authority: &str,
        headers: &[(&str, &str)],
    ) -> Result<Tunnel, HboneError> {
        let mut request = Request::builder().method(Method::CONNECT).uri(authority);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(()).expect("CONNECT request");
        let mut requests = self.requests.clone().ready().await?;
        let (response, send) = requests.send_request(request, false)?;
        let response = tokio::time::timeout(WAIT, response)
            .await
            .map_err(|_| HboneError::Timeout)??;
        if response.status() != StatusCode::OK {
            return Err(HboneError::Refused(response.status().as_u16()));
        }
        let (user, ours) = tokio::io::duplex(64 * 1024);
        let recv = response.into_body();
        let task = tokio::spawn(pump(send, recv, ours));
        Ok(Tunnel {
            io: user,
            peer_identity: self.peer_identity.clone(),
            _task: AbortOnDrop(task),
        })
    }
}

/// One CONNECT to `authority` over a new connection to `address` (Envoy's `127.0.0.1:15008`).
pub async fn connect(
    address: SocketAddr,
    authority: &str,
    cert: &WorkloadCert,
) -> Result<Tunnel, HboneError> {
    HboneConnection::open(address, cert)
        .await?
        .connect(authority)
        .await
}

/// A CONNECT stream as a byte stream. Shutting down its write side ends the stream's request
/// body (END_STREAM); the server ending its side reads as EOF.
pub struct Tunnel {
    io: DuplexStream,
    /// The HBONE server's SPIFFE identity (the waypoint's, through Envoy).
    pub peer_identity: Option<String>,
    _task: AbortOnDrop,
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copies both ways between an HTTP/2 stream and `io` until both directions end: `io`'s EOF
/// ends the stream's data (END_STREAM), the stream's end shuts `io`'s write side.
async fn pump(
    mut send: h2::SendStream<Bytes>,
    mut recv: h2::RecvStream,
    io: impl AsyncRead + AsyncWrite + Send + 'static,
) {
    let (mut reader, mut writer) = tokio::io::split(io);
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                send.send_data(Bytes::new(), true)?;
                return Ok::<_, HboneError>(());
            }
            let mut data = Bytes::copy_from_slice(&buf[..n]);
            while !data.is_empty() {
                send.reserve_capacity(data.len());
                let granted = std::future::poll_fn(|cx| send.poll_capacity(cx))
                    .await
                    .ok_or_else(|| std::io::Error::other("stream closed while sending"))??;
                if granted > 0 {
                    send.send_data(data.split_to(granted.min(data.len())), false)?;
                }
            }
        }
    };
    let down = async move {
        while let Some(chunk) = recv.data().await {
            let chunk = chunk?;
            recv.flow_control().release_capacity(chunk.len())?;
            writer.write_all(&chunk).await?;
        }
        writer.shutdown().await?;
        Ok::<_, HboneError>(())
    };
    let (up, down) = tokio::join!(up, down);
    for result in [up, down] {
        if let Err(error) = result {
            // A reset after the test is done with the tunnel is normal; say it for debugging.
            eprintln!("hbone stream: {error}");
        }
    }
}

/// What an [`HboneServer`] saw of one CONNECT.
#[derive(Clone, Debug)]
pub struct Connect {
    /// The client's SPIFFE identity from its verified certificate (the waypoint's when the
    /// waypoint calls).
    pub peer_identity: Option<String>,
    pub authority: String,
    /// Every request header, in order (lower-case names).
    pub headers: Vec<(String, String)>,
    /// What the server answered: 200, 400 (authority not on this pod), 503 (app unreachable).
    pub status: u16,
}

#[derive(Default)]
struct Seen {
    connects: Vec<Connect>,
    /// TCP connections whose TLS handshake or HTTP/2 session failed, with why.
    failures: Vec<String>,
}

/// The destination ztunnel's inbound: mutual TLS (ALPN h2) with a pod's certificate on
/// `<pod ip>:15008`, HTTP/2 CONNECT to `<pod ip>:<port>` forwarded to the app there.
pub struct HboneServer {
    pub address: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    _accept: AbortOnDrop,
}

impl HboneServer {
    /// Listens on `pod_ip:15008` (SO_REUSEPORT) with `cert` (the pod's identity).
    pub async fn start(pod_ip: IpAddr, cert: &WorkloadCert) -> Self {
        Self::start_on(SocketAddr::new(pod_ip, HBONE_PORT), cert).await
    }

    pub async fn start_on(address: SocketAddr, cert: &WorkloadCert) -> Self {
        let listener = reuseport_listener(address);
        let address = listener.local_addr().expect("local addr");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let tls = tokio_rustls::TlsAcceptor::from(server_tls(cert, &["h2"]));
        let accept = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    let Ok((tcp, from)) = listener.accept().await else {
                        continue;
                    };
                    let (tls, seen) = (tls.clone(), seen.clone());
                    tokio::spawn(async move {
                        if let Err(error) = serve(tls, tcp, address.ip(), seen.clone()).await {
                            let failure = format!("from {from}: {error}");
                            seen.lock().unwrap().failures.push(failure);
                        }
                    });
                }
            }
        });
        HboneServer {
            address,
            seen,
            _accept: AbortOnDrop(accept),
        }
    }

    /// Every CONNECT so far, in order.
    pub fn connects(&self) -> Vec<Connect> {
        self.seen.lock().unwrap().connects.clone()
    }

    /// The client identities of every CONNECT so far.
    pub fn peer_identities(&self) -> Vec<Option<String>> {
        self.connects()
            .into_iter()
            .map(|c| c.peer_identity)
            .collect()
    }

    /// Connections that failed before or outside a CONNECT (TLS handshake, HTTP/2), with why.
    pub fn failures(&self) -> Vec<String> {
        self.seen.lock().unwrap().failures.clone()
    }
}

/// A listener on `address` with SO_REUSEPORT (and SO_REUSEADDR), as Envoy binds its own.
pub fn reuseport_listener(address: SocketAddr) -> TcpListener {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .expect("socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket.set_reuseport(true).expect("SO_REUSEPORT");
    socket
        .bind(address)
        .unwrap_or_else(|e| panic!("bind {address}: {e}"));
    socket.listen(128).expect("listen")
}

async fn serve(
    tls: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    pod_ip: IpAddr,
    seen: Arc<Mutex<Seen>>,
) -> Result<(), HboneError> {
    tcp.set_nodelay(true)?;
    let stream = tokio::time::timeout(WAIT, tls.accept(tcp))
        .await
        .map_err(|_| HboneError::Timeout)??;
    let peer_identity = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(spiffe_of);
    let mut connection = h2::server::handshake(stream).await?;
    while let Some(request) = connection.accept().await {
        let (request, respond) = request?;
        let (peer_identity, seen) = (peer_identity.clone(), seen.clone());
        tokio::spawn(async move {
            if let Err(error) = forward(request, respond, peer_identity, pod_ip, &seen).await {
                eprintln!("hbone server stream: {error}");
            }
        });
    }
    Ok(())
}

async fn forward(
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    peer_identity: Option<String>,
    pod_ip: IpAddr,
    seen: &Mutex<Seen>,
) -> Result<(), HboneError> {
    let authority = request
        .uri()
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_string(), value)
        })
        .collect();
    let target: Option<SocketAddr> = authority
        .parse()
        .ok()
        .filter(|a: &SocketAddr| a.ip() == pod_ip && request.method() == Method::CONNECT);
    let app = match target {
        Some(target) => TcpStream::connect(target).await.ok(),
        None => None,
    };
    let status = match (&target, &app) {
        (None, _) => StatusCode::BAD_REQUEST,
        (Some(_), None) => StatusCode::SERVICE_UNAVAILABLE,
        (Some(_), Some(_)) => StatusCode::OK,
    };
    seen.lock().unwrap().connects.push(Connect {
        peer_identity,
        authority,
        headers,
        status: status.as_u16(),
    });
    let response = Response::builder()
        .status(status)
        .body(())
        .expect("response");
    let Some(app) = app else {
        respond.send_response(response, true)?;
        return Ok(());
    };
    let send = respond.send_response(response, false)?;
    pump(send, request.into_body(), app).await;
    Ok(())
}
