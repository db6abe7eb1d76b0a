//! NBD URIs (`doc/uri.md` of the NBD project).
//!
//! Supported: `nbd://host[:port][/export]` and `nbd+unix:///export?socket=PATH`.
//! `nbds` and `nbds+unix` parse but are refused with [`Error::TlsNotSupported`].

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// TCP host (name, IPv4 or IPv6 without brackets) and port.
    Tcp { host: String, port: u16 },
    /// Unix domain socket path.
    Unix { path: PathBuf },
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// Export name (the path without its leading `/`, percent-decoded; may be empty).
    pub export: String,
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                if host.contains(':') {
                    write!(f, "nbd://[{host}]:{port}/{}", self.export)
                } else {
                    write!(f, "nbd://{host}:{port}/{}", self.export)
                }
            }
            Endpoint::Unix { path } => {
                write!(f, "nbd+unix:///{}?socket={}", self.export, path.display())
            }
        }
    }
}

fn bad(uri: &str, reason: impl Into<String>) -> Error {
    Error::Uri {
        uri: uri.to_string(),
        reason: reason.into(),
    }
}

fn percent_decode(uri: &str, s: &str) -> Result<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(uri, "bad percent-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn decode_string(uri: &str, s: &str, what: &str) -> Result<String> {
    let bytes = percent_decode(uri, s)?;
    let s = String::from_utf8(bytes).map_err(|_| bad(uri, format!("{what} is not UTF-8")))?;
    if s.contains('\0') {
        return Err(bad(uri, format!("{what} contains NUL")));
    }
    Ok(s)
}

impl NbdUri {
    /// Parses an NBD URI.
    pub fn parse(uri: &str) -> Result<NbdUri> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad(uri, "missing scheme (expected nbd:// or nbd+unix://)"))?;
        let scheme_lc = scheme.to_ascii_lowercase();
        let unix = match scheme_lc.as_str() {
            "nbd" => false,
            "nbd+unix" => true,
            "nbds" | "nbds+unix" => {
                return Err(Error::TlsNotSupported {
                    scheme: scheme.to_string(),
                })
            }
            _ => return Err(bad(uri, format!("unknown scheme {scheme:?}"))),
        };
        // Strip a fragment, then split off the query.
        let rest = rest.split_once('#').map_or(rest, |(a, _)| a);
        let (rest, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let export = decode_string(uri, path.strip_prefix('/').unwrap_or(path), "export name")?;
        if export.len() > 4096 {
            return Err(bad(uri, "export name longer than 4096 bytes"));
        }
        let mut socket = None;
        for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = param.split_once('=').unwrap_or((param, ""));
            match k {
                "socket" => socket = Some(percent_decode(uri, v)?),
                k if k.starts_with("tls-") => {
                    return Err(bad(
                        uri,
                        format!("TLS parameter {k:?} given but TLS not supported yet"),
                    ))
                }
                k if k.starts_with("x-") => {}
                k => return Err(bad(uri, format!("unknown query parameter {k:?}"))),
            }
        }
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    uri,
                    "nbd+unix URIs take no host (use nbd+unix:///export?socket=PATH)",
                ));
            }
            let sock = socket.ok_or_else(|| bad(uri, "nbd+unix URI needs ?socket=PATH"))?;
            if sock.is_empty() {
                return Err(bad(uri, "empty socket path"));
            }
            use std::os::unix::ffi::OsStringExt;
            Endpoint::Unix {
                path: PathBuf::from(std::ffi::OsString::from_vec(sock)),
            }
        } else {
            if socket.is_some() {
                return Err(bad(uri, "?socket= is only valid with nbd+unix://"));
            }
            // Drop userinfo (only used for TLS authentication).
            let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
                let (h, after) = r
                    .split_once(']')
                    .ok_or_else(|| bad(uri, "unterminated [IPv6] host"))?;
                let port = match after {
                    "" => None,
                    p => Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad(uri, "garbage after ]"))?,
                    ),
                };
                (h.to_string(), port)
            } else {
                match hostport.split_once(':') {
                    Some((h, p)) => (decode_string(uri, h, "host")?, Some(p)),
                    None => (decode_string(uri, hostport, "host")?, None),
                }
            };
            if host.is_empty() {
                return Err(bad(uri, "missing host"));
            }
            let port = match port {
                None | Some("") => DEFAULT_PORT,
                Some(p) => p
                    .parse::<u16>()
                    .map_err(|_| bad(uri, format!("bad port {p:?}")))?,
            };
            Endpoint::Tcp { host, port }
        };
        Ok(NbdUri { endpoint, export })
    }

    /// A `nbd+unix` URI for a socket path and export.
    pub fn unix(path: impl Into<PathBuf>, export: impl Into<String>) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Unix { path: path.into() },
            export: export.into(),
        }
    }
}

impl std::str::FromStr for NbdUri {
    type Err = Error;
    fn from_str(s: &str) -> Result<NbdUri> {
        NbdUri::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
        }
    }

    #[test]
    fn parses_spec_examples() {
        assert_eq!(
            NbdUri::parse("nbd://example.com/disk").unwrap(),
            tcp("example.com", 10809, "disk")
        );
        assert_eq!(
            NbdUri::parse("nbd://example.com/").unwrap(),
            tcp("example.com", 10809, "")
        );
        assert_eq!(
            NbdUri::parse("nbd://example.com").unwrap(),
            tcp("example.com", 10809, "")
        );
        assert_eq!(
            NbdUri::parse("nbd://example.com//disk").unwrap(),
            tcp("example.com", 10809, "/disk")
        );
        assert_eq!(
            NbdUri::parse("nbd://example.com/hello%20world").unwrap(),
            tcp("example.com", 10809, "hello world")
        );
        assert_eq!(
            NbdUri::parse("nbd://127.0.0.1:1234/x").unwrap(),
            tcp("127.0.0.1", 1234, "x")
        );
        assert_eq!(
            NbdUri::parse("nbd://[::1]:99/x").unwrap(),
            tcp("::1", 99, "x")
        );
        assert_eq!(
            NbdUri::parse("nbd://[::1]/x").unwrap(),
            tcp("::1", 10809, "x")
        );
        assert_eq!(
            NbdUri::parse("nbd+unix:///disk?socket=/tmp/s.sock").unwrap(),
            NbdUri::unix("/tmp/s.sock", "disk")
        );
        assert_eq!(
            NbdUri::parse("nbd+unix:///?socket=nbd.sock").unwrap(),
            NbdUri::unix("nbd.sock", "")
        );
    }

    #[test]
    fn refuses_bad_uris() {
        assert!(matches!(
            NbdUri::parse("nbds://h/x"),
            Err(Error::TlsNotSupported { .. })
        ));
        assert!(matches!(
            NbdUri::parse("nbds+unix:///x?socket=s"),
            Err(Error::TlsNotSupported { .. })
        ));
        for u in [
            "http://h/x",
            "nbd:/x",
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=s",
            "nbd://h:99999/x",
            "nbd://h/x?socket=s",
            "nbd://h/x?bogus=1",
            "nbd://h/%zz",
            "nbd:///x",
            "nbd://h/a%00b",
        ] {
            assert!(NbdUri::parse(u).is_err(), "{u} should fail");
        }
    }

    #[test]
    fn display_round_trips() {
        for u in ["nbd://h:7/e", "nbd+unix:///e?socket=/s", "nbd://[::1]:5/x"] {
            let p = NbdUri::parse(u).unwrap();
            assert_eq!(NbdUri::parse(&p.to_string()).unwrap(), p);
        }
    }
}
