//! A minimal HTTP/1.1 client over a UNIX socket: one request per
//! connection, as the vgpud API serves them.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest response accepted.
const MAX_RESPONSE: u64 = 16 << 20;
/// Longest wait for the daemon (creating or destroying a vGPU takes a
/// moment).
const TIMEOUT: Duration = Duration::from_secs(60);

/// A response.
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: Vec<u8>,
}

/// Sends one request and reads the response; `Err` when there is no
/// well-formed response.
pub fn request(api: &Path, method: &str, path: &str, body: Option<&[u8]>) -> Result<Reply, String> {
    let mut s = UnixStream::connect(api).map_err(|e| {
        format!(
            "cannot connect to {}: {e} (is vgpud running? see --api)",
            api.display()
        )
    })?;
    let io = |e: std::io::Error| format!("{}: {e}", api.display());
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n"
    );
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    s.write_all(&bytes).map_err(io)?;
    let mut resp = Vec::new();
    s.take(MAX_RESPONSE).read_to_end(&mut resp).map_err(io)?;
    parse(&resp)
}

/// Splits a response into its status and body.
fn parse(resp: &[u8]) -> Result<Reply, String> {
    let bad = || "malformed response from the daemon".to_string();
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(bad)?;
    let head = std::str::from_utf8(&resp[..end]).map_err(|_| bad())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(bad)?;
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(bad());
    }
    let status: u16 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let mut body = resp[end + 4..].to_vec();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                let n: usize = value.trim().parse().map_err(|_| bad())?;
                if n > body.len() {
                    return Err("truncated response from the daemon".into());
                }
                body.truncate(n);
            }
        }
    }
    Ok(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse() {
        let r = parse(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}xx").unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.body, b"{}");
        let r = parse(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").unwrap();
        assert_eq!(r.status, 204);
        assert!(r.body.is_empty());
        assert!(parse(b"garbage").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc").is_err());
        assert!(parse(b"SMTP 200 OK\r\n\r\n").is_err());
    }
}
