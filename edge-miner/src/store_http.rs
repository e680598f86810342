//! Checkpoints and deltas over HTTP(S) from the object store, or a CDN in
//! front of it, so that a new model reaches many miners without the
//! coordinator carrying the bytes.
//!
//! The coordinator names the store's public base URL in a
//! [`CheckpointPath::store_url`](tributary_protocol::wire::CheckpointPath)
//! once the store holds every step of the path; each step's object is at
//! [`PathStep::store_key`] under it. Nothing here is trusted: the caller
//! ([`crate::sync`]) checks every payload against the step's length and
//! blake3 (the trainer-signed hash for the announced payload) and the
//! content ids (a full file's, a delta's base and result) exactly as it
//! checks the relay's chunks, and falls back to the relay on any error here
//! (unreachable, missing, wrong bytes, a stall).
//!
//! Blocking (`ureq`): call from a blocking thread.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tributary_protocol::wire::{MAX_STORE_URL_LEN, PathStep};

/// Bytes read per call from a response body.
const READ_BYTES: usize = 1 << 20;

/// HTTP download failures (each one sends the miner to the relay).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The store URL is not an `http(s)://` URL a miner follows.
    #[error("store url `{0}`: expected http:// or https:// of at most {MAX_STORE_URL_LEN} bytes")]
    Url(String),
    /// The request failed (connection, TLS, timeout, malformed response).
    #[error("GET {url}: {source}")]
    Request {
        /// The object's URL.
        url: String,
        /// The cause.
        source: ureq::Error,
    },
    /// The server answered with a status other than 200 or 206.
    #[error("GET {url}: status {status}")]
    Status {
        /// The object's URL.
        url: String,
        /// The status.
        status: u16,
    },
    /// The body is longer than the payload the path announces.
    #[error("GET {url}: more than the {len} bytes announced")]
    TooLong {
        /// The object's URL.
        url: String,
        /// The announced length.
        len: u64,
    },
    /// The body ended before the announced length.
    #[error("GET {url}: {got} of {len} bytes")]
    Short {
        /// The object's URL.
        url: String,
        /// Bytes received in all (with what was already held).
        got: u64,
        /// The announced length.
        len: u64,
    },
    /// Reading the body, or writing the local file, failed.
    #[error("{what}: {source}")]
    Io {
        /// The file or URL.
        what: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// How long a download may wait before it is abandoned for the relay.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To open the connection (TCP and TLS).
    pub connect: Duration,
    /// From the request to the response's headers.
    pub response: Duration,
    /// Between two reads of the body: a stalled server, not a slow one.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(5), response: Duration::from_secs(15), stall: Duration::from_secs(30) }
    }
}

/// A client for one store's public base URL.
#[derive(Debug, Clone)]
pub struct StoreClient {
    agent: ureq::Agent,
    base: String,
}

impl StoreClient {
    /// A client for `base` (`http://` or `https://`; a trailing `/` is ignored).
    pub fn new(base: &str, t: Timeouts) -> Result<Self, HttpError> {
        let rest = base.strip_prefix("https://").or_else(|| base.strip_prefix("http://"));
        if base.len() > MAX_STORE_URL_LEN || rest.is_none_or(|r| r.is_empty() || r.chars().any(char::is_whitespace)) {
            return Err(HttpError::Url(base.to_owned()));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(t.connect))
            .timeout_recv_response(Some(t.response))
            .timeout_per_read(Some(t.stall))
            .build();
        Ok(Self { agent: ureq::Agent::new_with_config(config), base: base.trim_end_matches('/').to_owned() })
    }

    /// The URL of a step's object.
    pub fn url(&self, step: &PathStep) -> String {
        format!("{}/{}", self.base, step.store_key())
    }

    fn get(&self, url: &str, from: u64) -> Result<ureq::http::Response<ureq::Body>, HttpError> {
        let mut req = self.agent.get(url);
        if from > 0 {
            req = req.header("Range", format!("bytes={from}-"));
        }
        req.call().map_err(|source| HttpError::Request { url: url.to_owned(), source })
    }

    /// A step's payload, into memory (deltas): exactly `step.len` bytes or an
    /// error. Not verified here.
    pub fn get_bytes(&self, step: &PathStep, bar: Option<&indicatif::ProgressBar>) -> Result<Vec<u8>, HttpError> {
        let url = self.url(step);
        let resp = self.get(&url, 0)?;
        if resp.status().as_u16() != 200 {
            return Err(HttpError::Status { url, status: resp.status().as_u16() });
        }
        let mut out = Vec::with_capacity(usize::try_from(step.len).unwrap_or(0).min(64 << 20));
        copy_body(resp, &url, step.len, 0, bar, |b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    /// A step's payload into the file `part`, resuming from its first
    /// `offset` bytes (an HTTP range request; a server that answers with the
    /// whole object restarts the file). Returns the bytes received. Not
    /// verified here: the caller checks the whole file.
    pub fn get_to_file(
        &self,
        step: &PathStep,
        part: &Path,
        offset: u64,
        bar: Option<&indicatif::ProgressBar>,
    ) -> Result<u64, HttpError> {
        let url = self.url(step);
        let offset = if offset >= step.len { 0 } else { offset };
        let resp = self.get(&url, offset)?;
        let start = match resp.status().as_u16() {
            206 if offset > 0 && content_range_start(&resp) == Some(offset) => offset,
            200 => 0,
            status => return Err(HttpError::Status { url, status }),
        };
        let io = |source| HttpError::Io { what: part.to_owned(), source };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(start == 0)
            .append(start > 0)
            .open(part)
            .map_err(io)?;
        if let Some(b) = bar {
            b.set_position(start);
        }
        let got = copy_body(resp, &url, step.len, start, bar, |b| f.write_all(b).map_err(io))?;
        f.sync_all().map_err(io)?;
        Ok(got)
    }
}

/// The first byte of a 206 answer's `Content-Range: bytes FIRST-LAST/LEN`.
fn content_range_start(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    v.strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// Streams a body to `sink`: from `start`, to exactly `len` bytes in all.
/// Returns the bytes received.
fn copy_body(
    resp: ureq::http::Response<ureq::Body>,
    url: &str,
    len: u64,
    start: u64,
    bar: Option<&indicatif::ProgressBar>,
    mut sink: impl FnMut(&[u8]) -> Result<(), HttpError>,
) -> Result<u64, HttpError> {
    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; READ_BYTES];
    let mut at = start;
    loop {
        let n = reader.read(&mut buf).map_err(|source| HttpError::Io { what: url.into(), source })?;
        if n == 0 {
            break;
        }
        if at + n as u64 > len {
            return Err(HttpError::TooLong { url: url.to_owned(), len });
        }
        sink(&buf[..n])?;
        at += n as u64;
        if let Some(b) = bar {
            b.set_position(at);
        }
    }
    if at != len {
        return Err(HttpError::Short { url: url.to_owned(), got: at, len });
    }
    Ok(at - start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use tributary_protocol::checkpoint::ContentId;

    fn step(len: u64) -> PathStep {
        PathStep { id: ContentId([7; 32]), base: None, len, payload_hash: [0; 32] }
    }

    /// A one-shot HTTP server on loopback: answers the first request with
    /// `answer(request head)` and closes.
    fn serve_once(answer: impl FnOnce(&str) -> Vec<u8> + Send + 'static) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut s = s;
            let _ = s.write_all(&answer(&head));
            let _ = s.flush();
        });
        format!("http://{addr}")
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        let mut v =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn urls_a_miner_does_not_follow_are_refused() {
        for bad in ["", "ftp://x", "file:///etc", "https://", "http://a b", &format!("https://{}", "x".repeat(1100))] {
            assert!(matches!(StoreClient::new(bad, Timeouts::default()), Err(HttpError::Url(_))), "{bad}");
        }
        let c = StoreClient::new("https://cdn.example/net/", Timeouts::default()).unwrap();
        assert_eq!(c.url(&step(1)), format!("https://cdn.example/net/checkpoints/{}.gguf", ContentId([7; 32])));
    }

    #[test]
    fn a_body_is_exactly_the_announced_length() {
        let url = serve_once(|head| {
            assert!(head.starts_with(&format!("GET /checkpoints/{}.gguf ", ContentId([7; 32]))), "{head}");
            ok(b"0123456789")
        });
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert_eq!(c.get_bytes(&step(10), None).unwrap(), b"0123456789");
        let url = serve_once(|_| ok(b"0123456789"));
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert!(matches!(c.get_bytes(&step(9), None), Err(HttpError::TooLong { .. })));
        let url = serve_once(|_| ok(b"0123456789"));
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert!(matches!(c.get_bytes(&step(11), None), Err(HttpError::Short { got: 10, .. })));
        let url = serve_once(|_| b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec());
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert!(matches!(c.get_bytes(&step(10), None), Err(HttpError::Status { status: 404, .. })));
    }

    #[test]
    fn a_file_download_resumes_with_a_range_or_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("download.part");
        std::fs::write(&part, b"0123").unwrap();
        let url = serve_once(|head| {
            assert!(head.to_ascii_lowercase().contains("range: bytes=4-"), "{head}");
            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 4-9/10\r\nContent-Length: 6\r\nConnection: close\r\n\r\n456789".to_vec()
        });
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert_eq!(c.get_to_file(&step(10), &part, 4, None).unwrap(), 6);
        assert_eq!(std::fs::read(&part).unwrap(), b"0123456789");
        // A server without ranges sends the whole object: the file starts over.
        std::fs::write(&part, b"xxxx").unwrap();
        let url = serve_once(|_| ok(b"0123456789"));
        let c = StoreClient::new(&url, Timeouts::default()).unwrap();
        assert_eq!(c.get_to_file(&step(10), &part, 4, None).unwrap(), 10);
        assert_eq!(std::fs::read(&part).unwrap(), b"0123456789");
    }

    #[test]
    fn a_stalled_or_absent_server_is_an_error_not_a_hang() {
        let t = Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_millis(300),
            stall: Duration::from_millis(300),
        };
        // Headers and half the body, then nothing.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234");
            let _ = s.flush();
            // Longer than any test should wait: a miner without a stall
            // timeout would end on the disconnect, not on a timeout.
            std::thread::sleep(Duration::from_secs(60));
        });
        let c = StoreClient::new(&url, t).unwrap();
        let err = c.get_bytes(&step(10), None).unwrap_err();
        let timed_out = match &err {
            HttpError::Io { source, .. } => source
                .get_ref()
                .and_then(|e| e.downcast_ref::<ureq::Error>())
                .is_some_and(|e| matches!(e, ureq::Error::Timeout(_))),
            _ => false,
        };
        assert!(timed_out, "{err}");
        // Nobody listening.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = StoreClient::new(&format!("http://127.0.0.1:{port}"), t).unwrap();
        assert!(matches!(c.get_bytes(&step(10), None), Err(HttpError::Request { .. })));
    }
}
