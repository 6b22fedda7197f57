//! A small Redis client: RESP2 over one TCP connection, enough for the elector's scripts.
//!
//! One command at a time on one connection (the elector's calls are few: a renewal every
//! third of the owner lease, a coalesced state write), each bounded by a timeout; a
//! connection that failed or timed out is dropped and the next call dials again, so a
//! restarted server is used again without anyone noticing but the calls that failed.

use std::fmt;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// The largest bulk string a reply may hold (the state of a quota is far smaller).
const MAX_BULK: usize = 256 * 1024 * 1024;
/// The deepest a reply's arrays may nest (the scripts answer flat arrays).
const MAX_DEPTH: usize = 4;
/// The most elements a reply's array may hold.
const MAX_ELEMENTS: usize = 1 << 20;

/// Where the server is: from `redis://[[user]:password@]host[:port][/db]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or address.
    pub host: String,
    /// Port (default 6379).
    pub port: u16,
    /// ACL user, if given.
    pub user: Option<String>,
    /// Password, if given.
    pub password: Option<String>,
    /// Database number (default 0).
    pub db: u32,
}

impl fmt::Debug for Target {
    // The password is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("db", &self.db)
            .finish()
    }
}

impl Target {
    /// Reads a `redis://` URL; the error names what is wrong with it.
    pub fn parse(url: &str) -> Result<Target, String> {
        let Some(rest) = url.strip_prefix("redis://") else {
            return Err(if url.starts_with("rediss://") {
                "rediss:// (TLS) is not supported: reach Redis over loopback or a private network, or through a TLS tunnel (stunnel, spiped) on this machine".to_owned()
            } else {
                format!(
                    "a Redis URL starts with redis://, not {:?}",
                    url.split_once("://")
                        .map_or("(no scheme)", |(scheme, _)| scheme)
                )
            });
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (hostport, db) = match rest.split_once('/') {
            Some((h, d)) if !d.is_empty() => (
                h,
                d.parse::<u32>()
                    .map_err(|_| format!("the Redis URL's database must be a number, got {d:?}"))?,
            ),
            Some((h, _)) => (h, 0),
            None => (rest, 0),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("the Redis URL's port must be 1 to 65535, got {p:?}"))?,
            ),
            _ => (hostport, 6379),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 {
            return Err("the Redis URL names no host and port (redis://host:port)".to_owned());
        }
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (
                    (!u.is_empty()).then(|| unescape(u)).transpose()?,
                    (!p.is_empty()).then(|| unescape(p)).transpose()?,
                ),
                None => ((!a.is_empty()).then(|| unescape(a)).transpose()?, None),
            },
        };
        Ok(Target {
            host: host.to_owned(),
            port,
            user,
            password,
            db,
        })
    }
}

/// A URL's user or password with its `%XX` escapes decoded.
fn unescape(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(
                    "the Redis URL's user or password holds a % not followed by two hex digits",
                )?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| "the Redis URL's user or password is not UTF-8 once decoded".to_owned())
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A null bulk string or array.
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A simple string (`OK`, `PONG`).
    Simple(String),
    /// An array.
    Array(Vec<Reply>),
}

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The server could not be reached, or did not answer in time, or the connection broke.
    Unreachable(String),
    /// The server answered an error (`-ERR …`, `-NOAUTH …`, a script's error).
    Server(String),
    /// The server answered something that is not RESP.
    Protocol(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unreachable(m) => write!(f, "Redis is unreachable: {m}"),
            Error::Server(m) => write!(f, "Redis answered an error: {m}"),
            Error::Protocol(m) => write!(f, "Redis answered something unexpected: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// A client of one server.
#[derive(Debug)]
pub struct Client {
    target: Target,
    timeout: Duration,
    conn: Mutex<Option<BufStream<TcpStream>>>,
}

impl Client {
    /// A client of `target`; each call (dialling included) is given up after `timeout`.
    /// Dials on the first call.
    #[must_use]
    pub fn new(target: Target, timeout: Duration) -> Client {
        Client {
            target,
            timeout,
            conn: Mutex::new(None),
        }
    }

    /// Sends one command (its arguments as bytes) and reads its reply, within the timeout
    /// (waiting for the connection included). An error reply is `Err(Error::Server)`. The
    /// connection is taken out while the call runs and put back only once its reply was
    /// read whole, so a call that failed, timed out or was dropped half way leaves none
    /// out of step behind: the next call dials again.
    pub async fn call(&self, args: &[&[u8]]) -> Result<Reply, Error> {
        tokio::time::timeout(self.timeout, async {
            let mut slot = self.conn.lock().await;
            let mut c = match slot.take() {
                Some(c) => c,
                None => self.dial().await?,
            };
            send(&mut c, args).await?;
            let res = read(&mut c, 0).await;
            if matches!(res, Ok(_) | Err(Error::Server(_))) {
                *slot = Some(c);
            }
            res
        })
        .await
        .unwrap_or_else(|_| {
            Err(Error::Unreachable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            )))
        })
    }

    async fn dial(&self) -> Result<BufStream<TcpStream>, Error> {
        let t = &self.target;
        let stream = TcpStream::connect((t.host.as_str(), t.port))
            .await
            .map_err(|e| Error::Unreachable(format!("{}:{}: {e}", t.host, t.port)))?;
        let _ = stream.set_nodelay(true);
        let mut c = BufStream::new(stream);
        if let Some(p) = &t.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(u) = &t.user {
                args.push(u.as_bytes());
            }
            args.push(p.as_bytes());
            send(&mut c, &args).await?;
            read(&mut c, 0).await?;
        }
        if t.db != 0 {
            let db = t.db.to_string();
            send(&mut c, &[b"SELECT", db.as_bytes()]).await?;
            read(&mut c, 0).await?;
        }
        Ok(c)
    }
}

fn broken(e: &std::io::Error) -> Error {
    Error::Unreachable(format!("the connection broke: {e}"))
}

async fn send(c: &mut BufStream<TcpStream>, args: &[&[u8]]) -> Result<(), Error> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    c.write_all(&out).await.map_err(|e| broken(&e))?;
    c.flush().await.map_err(|e| broken(&e))
}

async fn line(c: &mut BufStream<TcpStream>) -> Result<String, Error> {
    let mut buf = Vec::new();
    let n = (&mut *c)
        .take(64 * 1024)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| broken(&e))?;
    if n == 0 {
        return Err(Error::Unreachable(
            "the server closed the connection".into(),
        ));
    }
    if !buf.ends_with(b"\r\n") {
        return Err(Error::Protocol(
            "a reply line without CRLF within 64 KiB".into(),
        ));
    }
    buf.truncate(buf.len() - 2);
    String::from_utf8(buf).map_err(|_| Error::Protocol("a reply line that is not UTF-8".into()))
}

fn number(s: &str) -> Result<i64, Error> {
    s.parse()
        .map_err(|_| Error::Protocol(format!("{s:?} is not a number")))
}

fn read(
    c: &mut BufStream<TcpStream>,
    depth: usize,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Reply, Error>> + Send + '_>> {
    Box::pin(async move {
        let l = line(c).await?;
        let (kind, rest) = l.split_at(l.chars().next().map_or(0, char::len_utf8));
        match kind {
            "+" => Ok(Reply::Simple(rest.to_owned())),
            // An error inside an array leaves the rest unread: the connection is dropped.
            "-" if depth > 0 => Err(Error::Protocol(format!("an error inside an array: {rest}"))),
            "-" => Err(Error::Server(rest.to_owned())),
            ":" => Ok(Reply::Int(number(rest)?)),
            "$" => {
                let n = number(rest)?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n > MAX_BULK {
                    return Err(Error::Protocol(format!("a bulk string of {n} bytes")));
                }
                // Read as it comes: a length alone allocates nothing large.
                let mut buf = Vec::with_capacity(n.min(64 * 1024) + 2);
                (&mut *c)
                    .take(n as u64 + 2)
                    .read_to_end(&mut buf)
                    .await
                    .map_err(|e| broken(&e))?;
                if buf.len() != n + 2 || !buf.ends_with(b"\r\n") {
                    return Err(Error::Protocol(
                        "a bulk string cut short or without CRLF".into(),
                    ));
                }
                buf.truncate(n);
                Ok(Reply::Bulk(buf))
            }
            "*" => {
                let n = number(rest)?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n > MAX_ELEMENTS || depth >= MAX_DEPTH {
                    return Err(Error::Protocol(format!(
                        "an array of {n} elements at depth {depth}"
                    )));
                }
                let mut items = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    items.push(read(c, depth + 1).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(Error::Protocol(format!("a reply starting {kind:?}"))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Target::parse("redis://127.0.0.1:6390").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.db), ("127.0.0.1", 6390, 0));
        let t = Target::parse("redis://:s3cret@localhost/2").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.user, t.password.as_deref(), t.db),
            ("localhost", 6379, None, Some("s3cret"), 2)
        );
        let t = Target::parse("redis://ops:p%40ss@[::1]:7000").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 7000));
        assert_eq!(
            (t.user.as_deref(), t.password.as_deref()),
            (Some("ops"), Some("p@ss"))
        );
        assert!(
            !format!("{t:?}").contains("p@ss"),
            "the password is never printed"
        );
        for secretly in [
            "http://:hunter2@x",
            "redis://:hunter2@:0",
            "redis://:hunter2%zz@x",
        ] {
            let e = Target::parse(secretly).unwrap_err();
            assert!(!e.contains("hunter2"), "{e}");
        }
        for (bad, says) in [
            ("http://x", "starts with redis://, not \"http\""),
            ("rediss://x", "TLS"),
            ("redis://x:0", "no host and port"),
            ("redis://x:port", "port must be"),
            ("redis://x/db", "database must be a number"),
            ("redis://", "no host"),
        ] {
            let e = Target::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
