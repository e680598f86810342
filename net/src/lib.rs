//! QUIC plumbing shared by the coordinator and its clients: TLS with a pinned
//! certificate, frame I/O with size limits, and the client handshake.
//!
//! A client pins the coordinator's certificate in one of two ways ([`Pin`]):
//! its fingerprint (blake3 of the DER, hex; the coordinator's self-signed
//! certificate by default), or a CA certificate (PEM) the operator signs the
//! coordinator's certificate with. Every client entry point takes the pin as
//! one string, the *pin spec*: 64 hex digits, or the PEM text of the CA
//! ([`read_ca`] reads a CA file into it).
//!
//! The client roles' runtime on top of a [`Session`] (reconnecting, retried
//! and paged requests, the window reads, checkpoint upload and download) is
//! [`client`].

pub mod beacon;
pub mod cli;
pub mod client;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod store_read;
pub use client::{Client, ClientConfig, ClientError, DownloadError, Page, Paged, WindowSource};
pub use logging::{announce, init_logging, init_tracing, now_ms};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tributary_protocol::identity::{self, Keypair, PublicKey};
use tributary_protocol::wire::{
    self, Auth, ErrorFrame, Frame, HEADER_LEN, Hello, PROTOCOL_VERSION, Role, Welcome, WireError,
};

/// Errors on a connection.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The peer sent bad frame bytes.
    #[error("wire: {0}")]
    Wire(#[from] WireError),
    /// Reading failed.
    #[error("read: {0}")]
    Read(#[from] quinn::ReadExactError),
    /// Writing failed.
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    /// Connecting failed.
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The connection failed.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// TLS setup failed.
    #[error("tls: {0}")]
    Tls(String),
    /// Local I/O failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The stream ended.
    #[error("stream closed")]
    Closed,
    /// The peer answered with an error frame.
    #[error("refused: {0:?}: {1}")]
    Refused(wire::ErrorCode, String),
    /// The peer answered with an unexpected frame.
    #[error("unexpected frame {0:?}")]
    Unexpected(wire::Tag),
    /// The coordinator is not the one this client pinned: it names another
    /// key, or it cannot prove on this session that it holds the key it names.
    #[error("refusing coordinator {got}: {why}")]
    CoordinatorKey {
        /// The key the coordinator named.
        got: PublicKey,
        /// What is wrong with it.
        why: String,
    },
}

impl NetError {
    /// A refusal no retry can cure: an unknown key, a wrong role or protocol
    /// version, a failed handshake.
    pub fn is_final(&self) -> bool {
        matches!(self, NetError::Refused(c, _) if matches!(c, wire::ErrorCode::Unauthorized | wire::ErrorCode::Version | wire::ErrorCode::BadHandshake))
            || matches!(self, NetError::CoordinatorKey { .. })
    }
}

/// How a client retries: waits from `min` doubling up to `max`, at most
/// `attempts` tries in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub min: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Tries before giving up.
    pub attempts: u32,
}

/// Why [`Session::connect_with_backoff`] gave up.
#[derive(Debug)]
pub enum ConnectFailure {
    /// The coordinator refused us for good ([`NetError::is_final`]).
    Refused(NetError),
    /// Every attempt failed.
    Unreachable {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: NetError,
    },
}

/// The provider every endpoint uses (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate's fingerprint: blake3 of its DER, in hex.
pub fn fingerprint(cert_der: &[u8]) -> String {
    blake3::hash(cert_der).to_hex().to_string()
}

/// A self-signed certificate for `localhost`/`127.0.0.1`: (cert DER, PKCS#8 key DER).
pub fn self_signed() -> Result<(Vec<u8>, Vec<u8>), NetError> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .map_err(|e| NetError::Tls(e.to_string()))?;
    Ok((ck.cert.der().to_vec(), ck.key_pair.serialize_der()))
}

/// How long a server connection may stay silent at the QUIC level.
pub const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The TLS exporter label the handshake signature is bound to.
const HANDSHAKE_EXPORTER_LABEL: &[u8] = b"tributary handshake v1";

/// What a client signs to prove possession of its key on this connection:
/// the handshake bytes ([`wire::handshake_bytes`]) followed by 32 bytes of
/// TLS keying material exported for the nonce. Both ends of one TLS session
/// derive the same bytes and no other session does, so a signature relayed
/// from another connection (a server the client dialled forwarding its
/// challenge) does not verify here.
pub fn handshake_message(
    conn: &quinn::Connection,
    nonce: &[u8; 32],
    coordinator: &PublicKey,
    hello: &Hello,
) -> Result<Vec<u8>, NetError> {
    let mut exported = [0u8; 32];
    conn.export_keying_material(&mut exported, HANDSHAKE_EXPORTER_LABEL, nonce)
        .map_err(|_| NetError::Tls("exporting TLS keying material failed".into()))?;
    let mut msg = wire::handshake_bytes(nonce, coordinator, hello);
    msg.extend_from_slice(&exported);
    Ok(msg)
}

/// What the coordinator signs (under
/// [`identity::domain::COORDINATOR_HANDSHAKE`]) to prove it holds the key it
/// names in its [`wire::Challenge`]: the nonce and the same TLS keying
/// material as [`handshake_message`], so the proof is valid on this session only.
pub fn coordinator_proof_message(conn: &quinn::Connection, nonce: &[u8; 32]) -> Result<Vec<u8>, NetError> {
    let mut exported = [0u8; 32];
    conn.export_keying_material(&mut exported, HANDSHAKE_EXPORTER_LABEL, nonce)
        .map_err(|_| NetError::Tls("exporting TLS keying material failed".into()))?;
    let mut msg = nonce.to_vec();
    msg.extend_from_slice(&exported);
    Ok(msg)
}

/// The file in a client's data folder holding the coordinator key it pinned
/// on first sight (when none is configured).
pub const COORDINATOR_PIN_FILE: &str = "coordinator.pub";

/// Which coordinator key a client accepts. Whatever the pin, the coordinator
/// must prove on the session that it holds the key it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPin {
    /// Any key (`--dev`, tests).
    Any,
    /// Exactly this key (`coordinator_key` in the configuration, `--coordinator-key`).
    Exact(PublicKey),
    /// The key in this file; written with the first key seen if the file is
    /// absent (trust on first use).
    File(std::path::PathBuf),
}

impl KeyPin {
    /// The pin of a client role: the configured key if any; else nothing
    /// with `--dev`; else the pin file in the data folder (if there is one).
    pub fn resolve(configured: Option<&str>, data: Option<&Path>, dev: bool) -> Result<KeyPin, NetError> {
        if let Some(k) = configured {
            let key = k.trim().parse::<PublicKey>().map_err(|e| {
                NetError::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("coordinator_key {k:?}: {e}"),
                ))
            })?;
            return Ok(KeyPin::Exact(key));
        }
        Ok(match data {
            Some(d) if !dev => KeyPin::File(d.join(COORDINATOR_PIN_FILE)),
            _ => KeyPin::Any,
        })
    }

    /// Checks the key a coordinator named (before the client signs anything).
    fn check(&self, got: &PublicKey) -> Result<(), NetError> {
        let (expected, whence) = match self {
            KeyPin::Any => return Ok(()),
            KeyPin::Exact(k) => (*k, "configured (`coordinator_key` / --coordinator-key)".to_string()),
            KeyPin::File(path) => match std::fs::read_to_string(path) {
                Ok(text) => {
                    let k = text.trim().parse::<PublicKey>().map_err(|e| NetError::CoordinatorKey {
                        got: *got,
                        why: format!("pin file {}: {e}", path.display()),
                    })?;
                    (k, format!("pinned on first sight in {}", path.display()))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(NetError::Io(e)),
            },
        };
        if expected == *got {
            return Ok(());
        }
        Err(NetError::CoordinatorKey {
            got: *got,
            why: format!(
                "this client trusts coordinator key {expected}, {whence}; a coordinator with another key is another network"
            ),
        })
    }

    /// After a successful handshake: writes the key to an absent pin file.
    fn record(&self, got: &PublicKey) -> Result<(), NetError> {
        if let KeyPin::File(path) = self
            && !path.exists()
        {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, format!("{got}\n"))?;
            tracing::info!(coordinator = %got, file = %path.display(), "coordinator key pinned");
        }
        Ok(())
    }
}

/// A QUIC server config with the ALPN and transport limits.
pub fn server_config(cert_der: Vec<u8>, key_der: Vec<u8>) -> Result<quinn::ServerConfig, NetError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| NetError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(cert_der)], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)))
        .map_err(|e| NetError::Tls(e.to_string()))?;
    tls.alpn_protocols = vec![wire::ALPN.to_vec()];
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| NetError::Tls(e.to_string()))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    // One control stream per connection, so what a peer can make the server
    // buffer is one stream window; datagrams are never read, so none are
    // taken (quinn would otherwise buffer up to 1.25 MB of them per
    // connection, before authentication).
    transport.max_concurrent_bidi_streams(1u32.into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport.datagram_receive_buffer_size(None);
    // No server keep-alive: a peer that sends nothing is dropped after the
    // idle timeout (clients keep their sessions alive themselves).
    transport.keep_alive_interval(None);
    transport.max_idle_timeout(Some(SERVER_IDLE_TIMEOUT.try_into().map_err(|_| NetError::Closed)?));
    cfg.transport_config(Arc::new(transport));
    // Address validation (QUIC Retry) is the server's own decision per
    // Initial (`quinn::Incoming::retry`); the token lifetime is quinn's default.
    Ok(cfg)
}

/// How a client recognises the coordinator's certificate.
#[derive(Debug, Clone)]
pub enum Pin {
    /// Exactly the certificate with this fingerprint (hex, [`fingerprint`]).
    Fingerprint(String),
    /// Any certificate signed directly by one of these CA certificates. The
    /// name in the certificate is not checked (clients connect by address):
    /// the CA is the network's own, and whatever it signs is the coordinator.
    Ca(Vec<CertificateDer<'static>>),
}

/// The marker that makes a pin spec a CA (PEM) rather than a fingerprint.
const PEM_MARKER: &str = "-----BEGIN";

impl Pin {
    /// Parses a pin spec: the PEM text of one or more CA certificates, or
    /// else a certificate fingerprint (hex).
    pub fn parse(spec: &str) -> Result<Self, NetError> {
        let spec = spec.trim();
        if !spec.contains(PEM_MARKER) {
            return Ok(Pin::Fingerprint(spec.to_string()));
        }
        let certs = CertificateDer::pem_slice_iter(spec.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| NetError::Tls(format!("CA certificate (PEM): {e}")))?;
        if certs.is_empty() {
            return Err(NetError::Tls("CA file holds no certificate (PEM `BEGIN CERTIFICATE`)".into()));
        }
        ca_roots(&certs).map_err(|e| NetError::Tls(format!("CA certificate: {e}")))?;
        Ok(Pin::Ca(certs))
    }
}

/// Reads a CA certificate file (PEM) and returns it as a pin spec (its PEM
/// text), after checking that it holds at least one usable certificate.
pub fn read_ca(path: &Path) -> Result<String, NetError> {
    let text = std::fs::read_to_string(path).map_err(|e| NetError::Tls(format!("CA file {}: {e}", path.display())))?;
    if !text.contains(PEM_MARKER) {
        return Err(NetError::Tls(format!("CA file {}: not PEM (no `-----BEGIN CERTIFICATE-----`)", path.display())));
    }
    Pin::parse(&text).map_err(|e| NetError::Tls(format!("CA file {}: {e}", path.display())))?;
    Ok(text)
}

/// The coordinator a client role's configuration names: its address
/// (`HOST:PORT`, resolved) and its pin spec ([`Pin::parse`]) — the
/// `fingerprint`, or the PEM text of the `ca` file; exactly one of the two.
pub fn coordinator_target(
    address: Option<&str>,
    fingerprint: Option<&str>,
    ca: Option<&Path>,
) -> Result<(std::net::SocketAddr, String), NetError> {
    use std::net::ToSocketAddrs;
    let config = |m: String| NetError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, m));
    let c = address.ok_or_else(|| config("give the coordinator's address (`coordinator` or --coordinator)".into()))?;
    let addr = c
        .to_socket_addrs()
        .map_err(|e| config(format!("coordinator {c:?}: {e}")))?
        .next()
        .ok_or_else(|| config(format!("coordinator {c:?} has no address")))?;
    let pin = match (fingerprint, ca) {
        (Some(f), None) => {
            let f = f.trim();
            if f.len() != 64 || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(config(format!(
                    "fingerprint {f:?}: expected 64 hex digits (the `fingerprint=` line of `coordinator run`, or \
                     `coordinator fingerprint --data DIR`)"
                )));
            }
            f.to_string()
        }
        (None, Some(ca)) => read_ca(ca)?,
        (Some(_), Some(_)) => {
            return Err(config("give the coordinator's `fingerprint` or a `ca` file, not both".into()));
        }
        (None, None) => {
            return Err(config(
                "give the coordinator's `fingerprint` or a `ca` file (--fingerprint HEX / --ca FILE)".into(),
            ));
        }
    };
    Ok((addr, pin))
}

/// Reads a certificate and its private key (PEM, the key PKCS#8) and returns
/// them as DER, as [`server_config`] takes them, after checking that they
/// belong together. For a coordinator run with an operator's certificate.
pub fn read_cert_and_key(cert_pem: &Path, key_pem: &Path) -> Result<(Vec<u8>, Vec<u8>), NetError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| NetError::Tls(format!("{}: {e}", p.display())));
    let cert_text = read(cert_pem)?;
    let cert = CertificateDer::pem_slice_iter(&cert_text)
        .next()
        .ok_or_else(|| NetError::Tls(format!("{}: no PEM certificate", cert_pem.display())))?
        .map_err(|e| NetError::Tls(format!("{}: {e}", cert_pem.display())))?;
    let key = PrivateKeyDer::from_pem_slice(&read(key_pem)?)
        .map_err(|e| NetError::Tls(format!("{}: {e}", key_pem.display())))?;
    let PrivateKeyDer::Pkcs8(key) = key else {
        return Err(NetError::Tls(format!(
            "{}: the key must be PKCS#8 (`-----BEGIN PRIVATE KEY-----`); convert it with \
             `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`",
            key_pem.display()
        )));
    };
    let (cert, key) = (cert.to_vec(), key.secret_pkcs8_der().to_vec());
    // A key that does not match the certificate is refused here, not at the first handshake.
    let signing = provider()
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.clone())))
        .map_err(|e| NetError::Tls(format!("{}: {e}", key_pem.display())))?;
    rustls::sign::CertifiedKey::new(vec![CertificateDer::from(cert.clone())], signing)
        .keys_match()
        .map_err(|e| NetError::Tls(format!("{} and {} do not match: {e}", cert_pem.display(), key_pem.display())))?;
    Ok((cert, key))
}

/// The trust anchors of CA certificates.
fn ca_roots(certs: &[CertificateDer<'static>]) -> Result<rustls::RootCertStore, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c.clone())?;
    }
    Ok(roots)
}

/// What a [`PinVerifier`] accepts.
#[derive(Debug)]
enum Accept {
    /// Exactly the certificate with this fingerprint.
    Fingerprint(String),
    /// Any certificate signed directly by one of these trust anchors.
    Ca(rustls::RootCertStore),
}

/// Accepts the coordinator's certificate as the client's [`Pin`] names it.
#[derive(Debug)]
struct PinVerifier {
    accept: Accept,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.accept {
            Accept::Fingerprint(pinned) => {
                if !fingerprint(end_entity).eq_ignore_ascii_case(pinned) {
                    return Err(rustls::Error::General("certificate fingerprint does not match the pin".into()));
                }
            }
            Accept::Ca(roots) => {
                let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &cert,
                    roots,
                    intermediates,
                    now,
                    self.provider.signature_verification_algorithms.all,
                )
                .map_err(|e| match e {
                    rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature,
                    ) => rustls::Error::General("certificate is not signed by the pinned CA".into()),
                    other => other,
                })?;
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A QUIC client config that pins the coordinator's certificate: `pin` is a
/// pin spec ([`Pin::parse`]): a fingerprint (hex) or a CA's PEM text.
pub fn client_config(pin: &str) -> Result<quinn::ClientConfig, NetError> {
    let provider = provider();
    let accept = match Pin::parse(pin)? {
        Pin::Fingerprint(fingerprint) => Accept::Fingerprint(fingerprint),
        Pin::Ca(certs) => Accept::Ca(ca_roots(&certs).map_err(|e| NetError::Tls(format!("CA certificate: {e}")))?),
    };
    let verifier = Arc::new(PinVerifier { accept, provider: provider.clone() });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| NetError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![wire::ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| NetError::Tls(e.to_string()))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    // Keep-alives make a client waiting for an answer send now and then, so a
    // coordinator restarted on the same port answers with a stateless reset
    // ([`endpoint_config`]) and the client reconnects at once instead of
    // waiting out the idle timeout.
    transport.keep_alive_interval(Some(std::time::Duration::from_secs(2)));
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}

/// The stateless-reset key of a server endpoint: HMAC = keyed BLAKE3 under a
/// key derived from a secret that survives restarts.
struct ResetKey([u8; 32]);

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let mac = blake3::keyed_hash(&self.0, data);
        let n = signature_out.len().min(32);
        signature_out[..n].copy_from_slice(&mac.as_bytes()[..n]);
    }

    fn signature_len(&self) -> usize {
        32
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        let mac = blake3::keyed_hash(&self.0, data);
        // blake3::Hash compares in constant time.
        match <[u8; 32]>::try_from(signature) {
            Ok(sig) if blake3::Hash::from(sig) == mac => Ok(()),
            _ => Err(quinn::crypto::CryptoError),
        }
    }
}

/// Random 8-byte connection ids that any restart of the server accepts as
/// its own (quinn's default generator keys them per process, so packets of a
/// predecessor's connections would be dropped instead of reset).
struct RandomCid;

impl quinn::ConnectionIdGenerator for RandomCid {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        quinn::ConnectionId::new(&rand::random::<[u8; 8]>())
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The endpoint configuration of a server whose stateless-reset key is
/// derived from `secret` (the coordinator's certificate key). A server
/// restarted with the same secret (after a crash, on the same port) answers
/// packets of its predecessor's connections with stateless resets the
/// clients accept, so they learn at once that the connection is gone.
pub fn endpoint_config(secret: &[u8]) -> quinn::EndpointConfig {
    let key = ResetKey(blake3::derive_key(tributary_protocol::domain::context::QUIC_STATELESS_RESET, secret));
    let mut cfg = quinn::EndpointConfig::new(Arc::new(key));
    cfg.cid_generator(|| Box::new(RandomCid));
    cfg
}

/// A server endpoint on `listen` with [`server_config`] and [`endpoint_config`]
/// (reset key derived from the certificate key).
pub fn server_endpoint(listen: SocketAddr, cert_der: Vec<u8>, key_der: Vec<u8>) -> Result<quinn::Endpoint, NetError> {
    let endpoint_cfg = endpoint_config(&key_der);
    let server = server_config(cert_der, key_der)?;
    let socket = std::net::UdpSocket::bind(listen)?;
    let runtime = quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime"))?;
    Ok(quinn::Endpoint::new(endpoint_cfg, Some(server), socket, runtime)?)
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a header.
/// The header is checked before the body is read, so at most the tag's
/// limit is ever allocated.
pub async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Option<Frame>, NetError> {
    read_frame_with(recv, |_, _| Ok(())).await
}

/// Bytes a frame body's buffer grows by as its bytes arrive.
const BODY_STEP: usize = 64 << 10;

/// [`read_frame`] with a check of the header (tag and declared length) by
/// the caller before any of the body is read: a frame the reader's state does
/// not take is refused without reading it.
pub async fn read_frame_with(
    recv: &mut quinn::RecvStream,
    accept: impl FnOnce(wire::Tag, u32) -> Result<(), NetError>,
) -> Result<Option<Frame>, NetError> {
    let Some((tag, len)) = read_header(recv).await? else { return Ok(None) };
    accept(tag, len)?;
    Ok(Some(read_body(recv, tag, len).await?))
}

/// Reads and checks a frame header ([`wire::parse_header`]); `Ok(None)` on a
/// clean end of stream before it.
pub async fn read_header(recv: &mut quinn::RecvStream) -> Result<Option<(wire::Tag, u32)>, NetError> {
    let mut header = [0u8; HEADER_LEN];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    Ok(Some(wire::parse_header(&header)?))
}

/// Reads the body of a frame whose header was read ([`read_header`]). The
/// buffer grows as the bytes arrive, so a peer that declares a large frame
/// and stalls holds only what it sent.
pub async fn read_body(recv: &mut quinn::RecvStream, tag: wire::Tag, len: u32) -> Result<Frame, NetError> {
    let len = len as usize;
    let mut body = Vec::with_capacity(len.min(BODY_STEP));
    while body.len() < len {
        let have = body.len();
        let step = (len - have).min(BODY_STEP.max(have));
        body.resize(have + step, 0);
        recv.read_exact(&mut body[have..]).await?;
    }
    Ok(Frame::decode_body(tag, &body)?)
}

/// Writes one frame.
pub async fn write_frame(send: &mut quinn::SendStream, frame: &Frame) -> Result<(), NetError> {
    send.write_all(&frame.encode()).await?;
    Ok(())
}

/// An authenticated client session on one control stream.
#[derive(Debug)]
pub struct Session {
    /// The connection.
    pub conn: quinn::Connection,
    /// Frames to the coordinator.
    pub send: quinn::SendStream,
    /// Frames from the coordinator.
    pub recv: quinn::RecvStream,
    /// The coordinator's key.
    pub coordinator: PublicKey,
    /// The coordinator's greeting.
    pub welcome: Welcome,
    /// The endpoint (kept alive with the session).
    pub endpoint: quinn::Endpoint,
}

impl Session {
    /// Connects, pins the certificate (`pin`: a pin spec, [`Pin::parse`]), and
    /// proves possession of `key` for `role`, to a coordinator with any key
    /// ([`KeyPin::Any`]; see [`Session::connect_pinned`]).
    pub async fn connect(addr: SocketAddr, pin: &str, key: &Keypair, role: Role) -> Result<Self, NetError> {
        Self::connect_pinned(addr, pin, &KeyPin::Any, key, role).await
    }

    /// Connects, pins the certificate (`pin`: a pin spec, [`Pin::parse`]),
    /// checks that the coordinator holds a key `coordinator_key` accepts
    /// (before signing anything), and proves possession of `key` for `role`.
    pub async fn connect_pinned(
        addr: SocketAddr,
        pin: &str,
        coordinator_key: &KeyPin,
        key: &Keypair,
        role: Role,
    ) -> Result<Self, NetError> {
        let bind: SocketAddr =
            if addr.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse().map_err(|_| NetError::Closed)?;
        let mut endpoint = quinn::Endpoint::client(bind)?;
        endpoint.set_default_client_config(client_config(pin)?);
        let conn = endpoint.connect(addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let hello = Hello { version: PROTOCOL_VERSION, role, key: key.public() };
        write_frame(&mut send, &Frame::Hello(hello.clone())).await?;
        let challenge = match read_frame(&mut recv).await?.ok_or(NetError::Closed)? {
            Frame::Challenge(c) => c,
            Frame::Error(ErrorFrame { code, detail }) => return Err(NetError::Refused(code, detail)),
            other => return Err(NetError::Unexpected(other.tag())),
        };
        coordinator_key.check(&challenge.coordinator)?;
        let proof = coordinator_proof_message(&conn, &challenge.nonce)?;
        if challenge.coordinator.verify(identity::domain::COORDINATOR_HANDSHAKE, &proof, &challenge.proof).is_err() {
            return Err(NetError::CoordinatorKey {
                got: challenge.coordinator,
                why: "it did not prove on this connection that it holds that key".into(),
            });
        }
        let msg = handshake_message(&conn, &challenge.nonce, &challenge.coordinator, &hello)?;
        let signature = key.sign(identity::domain::HANDSHAKE, &msg);
        write_frame(&mut send, &Frame::Auth(Auth { signature })).await?;
        let welcome = match read_frame(&mut recv).await?.ok_or(NetError::Closed)? {
            Frame::Welcome(w) => w,
            Frame::Error(ErrorFrame { code, detail }) => return Err(NetError::Refused(code, detail)),
            other => return Err(NetError::Unexpected(other.tag())),
        };
        coordinator_key.record(&challenge.coordinator)?;
        Ok(Self { conn, send, recv, coordinator: challenge.coordinator, welcome, endpoint })
    }

    /// The network this session's coordinator names ([`wire::NetworkId::of`]
    /// its key): what this client signs documents for.
    pub fn network(&self) -> wire::NetworkId {
        wire::NetworkId::of(&self.coordinator)
    }

    /// [`connect`](Self::connect), retried with `backoff` while the failure is
    /// not final; `on_retry(error, wait)` runs before each wait (metrics).
    pub async fn connect_with_backoff(
        addr: SocketAddr,
        pin: &str,
        coordinator_key: &KeyPin,
        key: &Keypair,
        role: Role,
        backoff: Backoff,
        mut on_retry: impl FnMut(&NetError, Duration),
    ) -> Result<Self, ConnectFailure> {
        let mut delay = backoff.min;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::connect_pinned(addr, pin, coordinator_key, key, role).await {
                Ok(s) => return Ok(s),
                Err(e) if e.is_final() => return Err(ConnectFailure::Refused(e)),
                Err(e) if attempt >= backoff.attempts => {
                    return Err(ConnectFailure::Unreachable { attempts: attempt, last: e });
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?delay, "coordinator unreachable, retrying");
                    on_retry(&e, delay);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(backoff.max);
                }
            }
        }
    }

    /// Sends one frame.
    pub async fn send(&mut self, frame: &Frame) -> Result<(), NetError> {
        write_frame(&mut self.send, frame).await
    }

    /// Receives one frame; an error frame becomes [`NetError::Refused`].
    pub async fn recv(&mut self) -> Result<Frame, NetError> {
        match read_frame(&mut self.recv).await?.ok_or(NetError::Closed)? {
            Frame::Error(ErrorFrame { code, detail }) => Err(NetError::Refused(code, detail)),
            f => Ok(f),
        }
    }

    /// Sends a request and waits for its answer.
    pub async fn request(&mut self, frame: &Frame) -> Result<Frame, NetError> {
        self.send(frame).await?;
        self.recv().await
    }
}

/// Installs the Prometheus recorder ([`metrics::install`] for `role`) and
/// serves its text on `addr` (plain HTTP, any path): the `/metrics`
/// listener of the validator, the trainer and the miner.
pub async fn serve_metrics(addr: SocketAddr, role: &str) -> std::io::Result<SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    crate::metrics::install(role).ok_or_else(|| std::io::Error::other("another metrics recorder is installed"))?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = crate::metrics::render();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut buf)).await;
                let head = format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_refusals() {
        for code in [wire::ErrorCode::Unauthorized, wire::ErrorCode::Version, wire::ErrorCode::BadHandshake] {
            assert!(NetError::Refused(code, String::new()).is_final(), "{code:?}");
        }
        assert!(!NetError::Refused(wire::ErrorCode::NotYet, String::new()).is_final());
        assert!(!NetError::Closed.is_final());
    }

    #[tokio::test]
    async fn backoff_gives_up_after_its_attempts() {
        let key = Keypair::from_seed([3; 32]);
        let backoff = Backoff { min: Duration::from_millis(1), max: Duration::from_millis(4), attempts: 4 };
        let mut waits = Vec::new();
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        // a CA pin holding no certificate fails before any packet is sent,
        // and is not a final refusal
        let pin = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
        let r =
            Session::connect_with_backoff(addr, pin, &KeyPin::Any, &key, Role::Miner, backoff, |_, d| waits.push(d))
                .await;
        match r {
            Err(ConnectFailure::Unreachable { attempts, last }) => {
                assert_eq!(attempts, 4);
                assert!(!last.is_final(), "{last}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(waits, [1, 2, 4].map(Duration::from_millis), "doubling, capped at max");
    }
}
