//! The fleets configuration: which fleets (tenants) a gateway serves, their secrets, and
//! per fleet the quotas (one per provider API key) with the core's configuration, the
//! upstream and the upstream timeouts.
//!
//! ```text
//! { "<fleet>": { "secret": "…", "admin_secret"?: "…", "proxy_open"?: false | true | "credential",
//!                "quotas": { "<quota>": { "config": { …the core's configuration… },
//!                                         "upstream"?: "https://api.anthropic.com",
//!                                         "timeouts"?: { "firstByteMs"?: …, "idleMs"?: … } } } } }
//! ```
//!
//! Read strictly: a key that is not one of these is refused by name (a typo would otherwise
//! start a gateway that ignores it), as is a value out of its range; the error names the
//! place (`fleets.<fleet>.quotas.<quota>.config.pools[0].input_tokens_per_minute`). Each
//! quota's `config` is checked by the core ([`Config`]) as a coordinator would be created
//! from it.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;

use serde_json::{Map, Value};
use tokenwarden_core::{Config, ConfigError as CoreConfigError};

/// The longest secret a fleet may configure (and a caller may present): a longer bearer is
/// refused before any hashing.
pub const MAX_SECRET_CHARS: usize = 512;

/// The shortest secret a fleet may configure.
pub const MIN_SECRET_CHARS: usize = 16;

/// The longest upstream timeout, ms: what a JavaScript timer can wait (2^31 − 1).
pub const MAX_TIMEOUT_MS: u64 = 2_147_483_647;

/// Why a fleets configuration was refused: the place (`fleets.acme.quotas.main.upstream`,
/// empty for the whole text) and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Where, as a path from the top of the configuration.
    pub path: String,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

fn bad(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Who may use a fleet's `/proxy` without the fleet's secret.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyOpen {
    /// Only callers with the fleet's secret (`false`, the default).
    #[default]
    Closed,
    /// Anyone who can reach the gateway (`true`).
    Open,
    /// Callers presenting a provider credential, which is passed upstream (`"credential"`).
    Credential,
}

/// A quota's upstream: the provider's base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// The URL as configured.
    pub url: String,
    /// `https` or `http`.
    pub scheme: String,
    /// The host (an IPv6 address in brackets).
    pub host: String,
    /// The port, when the URL names one.
    pub port: Option<u16>,
}

/// A quota's upstream timeouts (the host's defaults where absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// No answer head within this long: the request is abandoned (`firstByteMs`).
    pub first_byte_ms: Option<u64>,
    /// No body bytes for this long while the answer is read (`idleMs`).
    pub idle_ms: Option<u64>,
}

/// One quota: one provider API key's limits.
#[derive(Clone, Debug)]
pub struct Quota {
    /// The core's configuration, checked.
    pub config: Config,
    /// The configuration as written (what a host hands the core to create a coordinator).
    pub config_json: Value,
    /// Where calls through the proxy go; `None`: the lease API only.
    pub upstream: Option<Upstream>,
    /// The upstream timeouts.
    pub timeouts: Timeouts,
}

/// One fleet: a tenant with its own secret and quotas.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// The bearer secret of its members.
    pub secret: String,
    /// The operator's secret (admin routes), if the fleet has one.
    pub admin_secret: Option<String>,
    /// Who may use the proxy without the secret.
    pub proxy_open: ProxyOpen,
    /// Its quotas, by name.
    pub quotas: BTreeMap<String, Quota>,
}

/// A whole fleets configuration, checked.
#[derive(Clone, Debug)]
pub struct Fleets {
    /// The fleets, by name.
    pub fleets: BTreeMap<String, Fleet>,
    /// The configuration as written, checked (what a host that reads it as JSON keeps).
    pub json: Value,
}

impl Fleets {
    /// The fleets configuration as the edge limiter takes it (`TOKENWARDEN_FLEETS`): an
    /// object of fleets by name.
    ///
    /// # Errors
    ///
    /// The first thing wrong, with its place.
    pub fn from_json(text: &str) -> Result<Fleets, ConfigError> {
        let v = parse(text)?;
        Fleets::from_value(v, "fleets")
    }

    /// `tokenwarden serve --config`'s file: `{ "fleets": { … } }` and nothing else.
    ///
    /// # Errors
    ///
    /// The first thing wrong, with its place (`port`: not a field of the file).
    pub fn from_serve_file(text: &str) -> Result<Fleets, ConfigError> {
        let v = parse(text)?;
        let Value::Object(mut top) = v else {
            return Err(bad(
                "",
                "must be an object: { \"fleets\": { \"<fleet>\": { \"secret\", \"quotas\" } } }",
            ));
        };
        only(&top, "", &["fleets"])?;
        let fleets = top
            .remove("fleets")
            .ok_or_else(|| bad("fleets", "is missing"))?;
        Fleets::from_value(fleets, "fleets")
    }

    fn from_value(v: Value, at: &str) -> Result<Fleets, ConfigError> {
        let map = object(&v, at, "an object of fleets by name")?;
        if map.is_empty() {
            return Err(bad(
                at,
                "holds no fleet: add one (a name, its secret and quotas)",
            ));
        }
        let mut fleets = BTreeMap::new();
        for (name, fleet) in map {
            let at = format!("{at}.{name}");
            check_name(&at, name, "fleet")?;
            fleets.insert(name.clone(), fleet_of(fleet, &at)?);
        }
        Ok(Fleets { fleets, json: v })
    }
}

fn parse(text: &str) -> Result<Value, ConfigError> {
    serde_json::from_str(text).map_err(|e| match out_of_range(text, &e) {
        Some((path, number)) => bad(
            &path,
            format!("{number} is a number out of range (past what a double holds): write the limit as an integer"),
        ),
        None => bad("", format!("not JSON: {e}")),
    })
}

/// Where in `text` a number past what a double holds is (serde_json's `e` at it): its path
/// (`fleets.a.quotas.q.config.pools[0].input_tokens_per_minute`) and its text. The number is
/// replaced by a marker string and the text read again to find the marker's place.
fn out_of_range(text: &str, e: &serde_json::Error) -> Option<(String, String)> {
    if !e.to_string().starts_with("number out of range") {
        return None;
    }
    let start: usize = text
        .split_inclusive('\n')
        .take(e.line().saturating_sub(1))
        .map(str::len)
        .sum();
    let end = (start + e.column()).min(text.len());
    let bytes = text.as_bytes();
    let numeric = |b: u8| b.is_ascii_digit() || matches!(b, b'e' | b'E' | b'+' | b'-' | b'.');
    let mut from = end;
    while from > 0 && numeric(bytes[from - 1]) {
        from -= 1;
    }
    let mut to = end;
    while to < bytes.len() && numeric(bytes[to]) {
        to += 1;
    }
    const MARK: &str = "\u{0}tokenwarden-out-of-range";
    let marked = format!(
        "{}{}{}",
        text.get(..from)?,
        serde_json::to_string(MARK).ok()?,
        text.get(to..)?
    );
    let v: Value = serde_json::from_str(&marked).ok()?;
    let path = path_of(&v, MARK, "")?;
    Some((path, text.get(from..to)?.to_owned()))
}

/// The path of the string `mark` in `v`.
fn path_of(v: &Value, mark: &str, at: &str) -> Option<String> {
    match v {
        Value::String(s) if s == mark => Some(at.to_owned()),
        Value::Object(m) => m.iter().find_map(|(k, c)| {
            let p = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            path_of(c, mark, &p)
        }),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, c)| path_of(c, mark, &format!("{at}[{i}]"))),
        _ => None,
    }
}

fn object<'a>(v: &'a Value, at: &str, what: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| bad(at, format!("must be {what}, got {}", kind(v))))
}

/// Refuses a key of `map` that is not in `known`, naming it.
fn only(map: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), ConfigError> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let path = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            Err(bad(
                &path,
                format!("unknown field (expected one of {})", known.join(", ")),
            ))
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn check_name(at: &str, name: &str, what: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(bad(
            at,
            format!("{what} name {name:?} must be 1 to 64 of A-Z, a-z, 0-9, _ and -"),
        ))
    }
}

fn fleet_of(v: &Value, at: &str) -> Result<Fleet, ConfigError> {
    let map = object(v, at, "an object: { \"secret\", \"quotas\" }")?;
    only(map, at, &["secret", "admin_secret", "proxy_open", "quotas"])?;
    let secret = secret_of(map.get("secret"), &format!("{at}.secret"))?
        .ok_or_else(|| bad(&format!("{at}.secret"), "is missing"))?;
    let admin_secret = secret_of(map.get("admin_secret"), &format!("{at}.admin_secret"))?;
    if admin_secret.as_deref() == Some(secret.as_str()) {
        return Err(bad(
            &format!("{at}.admin_secret"),
            "must differ from the fleet's secret",
        ));
    }
    let proxy_open = match map.get("proxy_open") {
        None | Some(Value::Bool(false)) => ProxyOpen::Closed,
        Some(Value::Bool(true)) => ProxyOpen::Open,
        Some(Value::String(s)) if s == "credential" => ProxyOpen::Credential,
        Some(other) => {
            return Err(bad(
                &format!("{at}.proxy_open"),
                format!("must be true, false or \"credential\", got {other}"),
            ));
        }
    };
    let quotas_at = format!("{at}.quotas");
    let quotas_v = map
        .get("quotas")
        .ok_or_else(|| bad(&quotas_at, "is missing"))?;
    let quotas_map = object(quotas_v, &quotas_at, "an object of quotas by name")?;
    if quotas_map.is_empty() {
        return Err(bad(
            &quotas_at,
            "holds no quota: add one (a name and its core config)",
        ));
    }
    let mut quotas = BTreeMap::new();
    for (name, q) in quotas_map {
        let at = format!("{quotas_at}.{name}");
        check_name(&at, name, "quota")?;
        quotas.insert(name.clone(), quota_of(q, &at)?);
    }
    Ok(Fleet {
        secret,
        admin_secret,
        proxy_open,
        quotas,
    })
}

/// A secret: 16 to 512 characters, no control characters, not only spaces.
fn secret_of(v: Option<&Value>, at: &str) -> Result<Option<String>, ConfigError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let rule = format!(
        "must be a string of {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters, printable and not only spaces"
    );
    let Value::String(s) = v else {
        return Err(bad(at, format!("{rule}, got {}", kind(v))));
    };
    let n = s.chars().count();
    if !(MIN_SECRET_CHARS..=MAX_SECRET_CHARS).contains(&n) {
        return Err(bad(at, format!("{rule}, got {n} characters")));
    }
    if s.chars().any(char::is_control) {
        return Err(bad(at, format!("{rule}: it holds a control character")));
    }
    if s.trim().is_empty() {
        return Err(bad(at, format!("{rule}: it is only spaces")));
    }
    Ok(Some(s.clone()))
}

fn quota_of(v: &Value, at: &str) -> Result<Quota, ConfigError> {
    let map = object(
        v,
        at,
        "an object: { \"config\", \"upstream\"?, \"timeouts\"? }",
    )?;
    only(map, at, &["config", "upstream", "timeouts"])?;
    let config_at = format!("{at}.config");
    let config_json = map
        .get("config")
        .ok_or_else(|| bad(&config_at, "is missing: the core's configuration"))?;
    object(config_json, &config_at, "the core's configuration object")?;
    let config = core_config(config_json, &config_at)?;
    let upstream = map
        .get("upstream")
        .map(|u| upstream_of(u, &format!("{at}.upstream")))
        .transpose()?;
    let timeouts = map
        .get("timeouts")
        .map(|t| timeouts_of(t, &format!("{at}.timeouts")))
        .transpose()?
        .unwrap_or_default();
    Ok(Quota {
        config,
        config_json: config_json.clone(),
        upstream,
        timeouts,
    })
}

/// The core's configuration, checked as a coordinator would be created from it (by its
/// own reader, [`Config::from_json`]); a value the reader refuses is named by its path.
fn core_config(v: &Value, at: &str) -> Result<Config, ConfigError> {
    let text = v.to_string();
    Config::from_json(&text).map_err(|e| match e {
        CoreConfigError::Invalid { field, reason } => bad(&format!("{at}.{field}"), reason),
        CoreConfigError::Parse(e) => {
            // The reader's place is a column of `text` (one line): the innermost value of
            // `v` whose text spans it.
            let path = path_at(v, e.column().saturating_sub(1));
            let message = e.to_string();
            let message = match message.find(" at line ") {
                Some(i) => &message[..i],
                None => &message,
            };
            bad(&format!("{at}{path}"), message)
        }
        other => bad(at, other.to_string()),
    })
}

/// The path (`.pools[0].name`; empty for `v` itself) of the innermost value of `v` whose
/// text in `v`'s compact JSON (`Value::to_string`) spans byte `offset`.
fn path_at(v: &Value, offset: usize) -> String {
    let mut path = String::new();
    let mut here = v;
    // Where `here`'s text starts in the whole text.
    let mut start = 0;
    loop {
        let mut pos = start + 1; // past `{` or `[`
        let mut inner = None;
        match here {
            Value::Object(map) => {
                for (k, child) in map {
                    pos += Value::String(k.clone()).to_string().len() + 1; // `"key":`
                    let len = child.to_string().len();
                    if (pos..pos + len).contains(&offset) {
                        inner = Some((format!(".{k}"), child, pos));
                        break;
                    }
                    pos += len + 1; // the value and `,`
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    let len = child.to_string().len();
                    if (pos..pos + len).contains(&offset) {
                        inner = Some((format!("[{i}]"), child, pos));
                        break;
                    }
                    pos += len + 1;
                }
            }
            _ => return path,
        }
        match inner {
            Some((step, child, at)) => {
                path.push_str(&step);
                here = child;
                start = at;
            }
            None => return path,
        }
    }
}

fn timeouts_of(v: &Value, at: &str) -> Result<Timeouts, ConfigError> {
    let map = object(v, at, "an object: { \"firstByteMs\"?, \"idleMs\"? }")?;
    only(map, at, &["firstByteMs", "idleMs"])?;
    let ms = |key: &str| -> Result<Option<u64>, ConfigError> {
        let Some(v) = map.get(key) else {
            return Ok(None);
        };
        match v.as_u64() {
            Some(n) if (1..=MAX_TIMEOUT_MS).contains(&n) => Ok(Some(n)),
            _ => Err(bad(
                &format!("{at}.{key}"),
                format!("must be whole milliseconds from 1 to {MAX_TIMEOUT_MS}, got {v}"),
            )),
        }
    };
    Ok(Timeouts {
        first_byte_ms: ms("firstByteMs")?,
        idle_ms: ms("idleMs")?,
    })
}

/// A provider's base URL: `https://host[:port][/path]`, or `http` to a loopback host (a
/// mock provider in tests); no credentials, query or fragment in it.
fn upstream_of(v: &Value, at: &str) -> Result<Upstream, ConfigError> {
    let shape = "a base URL: https://host[:port][/path]";
    let Value::String(url) = v else {
        return Err(bad(at, format!("must be {shape}, got {}", kind(v))));
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            at,
            format!("must be {shape}: it holds a space or a control character"),
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(at, format!("must be {shape}, got {url:?}")));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "https" && scheme != "http" {
        return Err(bad(
            at,
            format!("must be https (or http to a loopback host, for tests), got {scheme}://"),
        ));
    }
    if rest.contains(['?', '#']) {
        return Err(bad(at, format!("must be {shape}: no query or fragment")));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err(bad(
            at,
            "must not carry credentials (user:password@): each caller's own key is passed upstream",
        ));
    }
    let (host, port) = split_host_port(authority).ok_or_else(|| {
        bad(
            at,
            format!("must be {shape}: {authority:?} is not a host[:port]"),
        )
    })?;
    let loopback = matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]");
    if scheme == "http" && !loopback {
        return Err(bad(
            at,
            "must be https (http only to a loopback host: 127.0.0.1, localhost or [::1])",
        ));
    }
    Ok(Upstream {
        url: url.clone(),
        scheme,
        host,
        port,
    })
}

/// `host[:port]` with a host of letters, digits, `.` and `-` (or an IPv6 address in
/// brackets) and a port of 1 to 65535.
fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (addr, after) = inner.split_once(']')?;
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return None;
        }
        (
            format!("[{addr}]"),
            after.strip_prefix(':').map(str::to_string).or_else(|| {
                // Nothing after the bracket, or a port.
                after.is_empty().then(String::new)
            })?,
        )
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, p.to_string()),
            None => (authority, String::new()),
        };
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        if !host_ok {
            return None;
        }
        (host.to_ascii_lowercase(), port)
    };
    if port.is_empty() {
        return Some((host, None));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5 {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    Some((host, Some(port)))
}
