//! Who a request is: the fleet's secret, an agent credential derived from it, the operator's
//! admin secret, and unforgeable lease handles.
//!
//! A fleet is a tenant with its own secret; its members present it (`x-tokenwarden-token`,
//! or `Authorization: Bearer …` outside proxy mode, where `Authorization` is the
//! provider's), or an agent credential `twa1.<fleet>.<agent>.<MAC>` (HMAC-SHA-256 keyed by
//! the fleet's secret: nothing is stored, and a new fleet secret revokes them all), which
//! acts only for its agent. A lease handle `tw2.<fleet>.<quota>.<lease>.<epoch>.<MAC>` names
//! one lease of one epoch of one quota (the epoch changes at every reset of the quota).
//!
//! Every comparison of a presented secret or MAC takes the same time whatever it holds
//! (over SHA-256 digests, or MACs of equal length), and an unknown fleet is answered as a
//! wrong secret is, at the same cost: fleet names cannot be probed. Nothing is kept of what a
//! caller presents, and a presented secret longer than [`MAX_SECRET_CHARS`] is refused before
//! it is hashed.

use alloc::format;
use alloc::string::String;

use crate::Refusal;
use crate::config::{Fleet, ProxyOpen};
use crate::mac::{b64url, hmac_sha256, sha256};

/// The longest secret a caller may present, and a fleet may configure.
pub const MAX_SECRET_CHARS: usize = 512;

/// The agent credentials' prefix and version.
const CREDENTIAL: &str = "twa1";

/// Who an authenticated request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// An agent credential's agent; `None` for the fleet's secret (or an open proxy).
    pub agent: Option<String>,
    /// A proxied call the fleet takes with no secret (`proxy_open: true`).
    pub open: bool,
}

/// The secrets a request presents, as its host read them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Presented<'a> {
    /// `x-tokenwarden-token`.
    pub token: Option<&'a str>,
    /// `Authorization`.
    pub authorization: Option<&'a str>,
}

fn unauthorized(message: String) -> Refusal {
    Refusal::new(401, "unauthorized", message)
}

/// 401 for a presented secret longer than any the configuration can hold (in UTF-16 code
/// units, as the JavaScript hosts have always counted).
fn bounded(secret: &str) -> Result<&str, Refusal> {
    if secret.len() > MAX_SECRET_CHARS && secret.encode_utf16().count() > MAX_SECRET_CHARS {
        return Err(unauthorized(format!(
            "the presented secret is longer than {MAX_SECRET_CHARS} characters: no fleet secret or credential is"
        )));
    }
    Ok(secret)
}

/// The `Authorization: Bearer` value, bounded, or `None`.
fn bearer<'a>(p: &Presented<'a>) -> Result<Option<&'a str>, Refusal> {
    let auth = p.authorization.unwrap_or("");
    if auth.len() > MAX_SECRET_CHARS + 16 && auth.encode_utf16().count() > MAX_SECRET_CHARS + 16 {
        bounded(auth)?;
    }
    let Some((scheme, rest)) = auth.split_at_checked(6) else {
        return Ok(None);
    };
    // `Bearer`, whitespace, then at least one character (all of it whitespace, it is the
    // empty secret: a wrong one, not a missing one).
    if !scheme.eq_ignore_ascii_case("bearer")
        || !rest.starts_with(char::is_whitespace)
        || rest.chars().count() < 2
    {
        return Ok(None);
    }
    bounded(rest.trim()).map(Some)
}

/// The caller's secret: `x-tokenwarden-token`, or `Authorization: Bearer …` — except in
/// proxy mode, where `Authorization` belongs to the provider and the secret comes only in
/// `x-tokenwarden-token`.
pub fn presented_secret<'a>(p: &Presented<'a>, proxy: bool) -> Result<Option<&'a str>, Refusal> {
    if let Some(token) = p.token.filter(|t| !t.is_empty()) {
        return bounded(token).map(Some);
    }
    if proxy { Ok(None) } else { bearer(p) }
}

/// Whether a presented secret is shaped as an agent credential.
#[must_use]
pub fn is_credential(secret: &str) -> bool {
    secret
        .strip_prefix(CREDENTIAL)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// Whether a fleet, quota or agent name is well formed: 1 to 64 of `[A-Za-z0-9_-]`.
#[must_use]
pub fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A fleet or quota name from a URL; 404 `no such <kind>` otherwise.
pub fn check_name<'a>(kind: &str, name: &'a str) -> Result<&'a str, Refusal> {
    if is_name(name) {
        Ok(name)
    } else {
        Err(Refusal::new(404, "not_found", format!("no such {kind}")))
    }
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

/// Whether a presented secret is the configured one (`None`: none is), compared in constant
/// time over their SHA-256 digests.
#[must_use]
pub fn same_secret(given: &str, expected: Option<&str>) -> bool {
    let a = sha256(given.as_bytes());
    let b = sha256(expected.unwrap_or("").as_bytes());
    same_bytes(&a, &b) & expected.is_some()
}

/// The MAC of an agent credential's body: HMAC-SHA-256 keyed by the fleet's secret, as
/// base64url. For an unknown fleet (`None`) a key of no fleet's (so the cost is the same).
fn credential_mac(secret: Option<&str>, body: &str) -> String {
    let key = format!("tokenwarden agent credentials\0{}", secret.unwrap_or(""));
    b64url(&hmac_sha256(key.as_bytes(), body.as_bytes()))
}

/// The agent a credential names, once its MAC checks out for `fleet` (401 otherwise).
fn credential_agent<'a>(
    f: Option<&Fleet>,
    fleet: &str,
    secret: &'a str,
) -> Result<&'a str, Refusal> {
    let parts: alloc::vec::Vec<&str> = secret.split('.').collect();
    let agent = match parts.as_slice() {
        [_, f0, agent, _] if *f0 == fleet && is_name(agent) => Some(*agent),
        _ => None,
    };
    let expected = credential_mac(
        f.map(|f| f.secret.as_str()),
        &format!("{CREDENTIAL}.{fleet}.{}", agent.unwrap_or("")),
    );
    let given = parts.get(3).copied().unwrap_or("");
    let ok = same_bytes(expected.as_bytes(), given.as_bytes()) & agent.is_some() & f.is_some();
    match agent {
        Some(agent) if ok => Ok(agent),
        _ => Err(unauthorized("wrong agent credential for this fleet".into())),
    }
}

/// An agent credential for `agent` of fleet `fleet` whose secret is `secret`:
/// `twa1.<fleet>.<agent>.<MAC>`. 400 for a name that is not one.
pub fn agent_credential(secret: &str, fleet: &str, agent: &str) -> Result<String, Refusal> {
    if !is_name(agent) {
        return Err(Refusal::new(
            400,
            "invalid_argument",
            "an agent name for a credential must match /^[A-Za-z0-9_-]{1,64}$/".into(),
        ));
    }
    let body = format!("{CREDENTIAL}.{fleet}.{agent}");
    let mac = credential_mac(Some(secret), &body);
    Ok(format!("{body}.{mac}"))
}

/// Authenticates a request for fleet `fleet` (`f`, `None` when no fleet has the name): 401
/// without a secret or with a wrong one, the same for an unknown fleet. `credential` is one
/// given in place of the presented secret (the path's `/agents/<credential>/…`).
pub fn authenticate(
    f: Option<&Fleet>,
    fleet: &str,
    presented: &Presented<'_>,
    proxy: bool,
    credential: Option<&str>,
) -> Result<Caller, Refusal> {
    let secret = match credential {
        Some(c) => Some(c),
        None => presented_secret(presented, proxy)?,
    };
    let open = f.map(|f| f.proxy_open);
    // A fleet served on loopback for tools that can set only a base URL may take proxied
    // calls with no secret (`proxy_open: true`); everything else still needs it.
    if proxy && secret.is_none() && open == Some(ProxyOpen::Open) {
        return Ok(Caller {
            agent: None,
            open: true,
        });
    }
    if let Some(s) = secret.filter(|s| is_credential(s)) {
        let agent = credential_agent(f, fleet, s)?;
        return Ok(Caller {
            agent: Some(String::from(agent)),
            open: false,
        });
    }
    let Some(secret) = secret else {
        return Err(unauthorized(String::from(
            if proxy && open == Some(ProxyOpen::Credential) {
                "this fleet takes proxied calls without the fleet secret only from an agent credential: put it in place of the agent name (/agents/<credential>/<role>/…) or send it in x-tokenwarden-token"
            } else if proxy {
                "missing fleet secret: in proxy mode send it in x-tokenwarden-token (Authorization carries the provider key and is forwarded)"
            } else {
                "missing bearer secret: send Authorization: Bearer <fleet secret>"
            },
        )));
    };
    if same_secret(secret, f.map(|f| f.secret.as_str())) {
        Ok(Caller {
            agent: None,
            open: false,
        })
    } else {
        Err(unauthorized("wrong bearer secret for this fleet".into()))
    }
}

/// Authenticates an operator for a fleet's admin routes: its `admin_secret` as
/// `Authorization: Bearer …`. 401 for anything else — the fleet's own secret included —
/// and for a fleet with no admin secret.
pub fn authenticate_admin(f: Option<&Fleet>, presented: &Presented<'_>) -> Result<(), Refusal> {
    let given = bearer(presented)?.unwrap_or("");
    let expected = f.and_then(|f| f.admin_secret.as_deref());
    if same_secret(given, expected) {
        Ok(())
    } else {
        Err(unauthorized(
            "admin routes need the fleet's admin secret: Authorization: Bearer <admin_secret>"
                .into(),
        ))
    }
}

/// Whether an epoch is well formed: 1 to 24 of `[0-9a-z]`.
fn is_epoch(e: &str) -> bool {
    (1..=24).contains(&e.len())
        && e.bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// A handle's MAC: HMAC-SHA-256 keyed by the fleet's secret, base64url, 27 characters.
fn handle_mac(secret: &str, body: &str) -> String {
    let key = format!("tokenwarden lease handles\0{secret}");
    let mut mac = b64url(&hmac_sha256(key.as_bytes(), body.as_bytes()));
    mac.truncate(27);
    mac
}

/// A lease handle: `tw2.<fleet>.<quota>.<lease>.<epoch>.<MAC>`. 400 for an epoch that is
/// not 1 to 24 of `[0-9a-z]`.
pub fn sign_handle(
    secret: &str,
    fleet: &str,
    quota: &str,
    lease: u64,
    epoch: &str,
) -> Result<String, Refusal> {
    if !is_epoch(epoch) {
        return Err(Refusal::new(
            400,
            "invalid_argument",
            "a lease epoch must match /^[0-9a-z]{1,24}$/".into(),
        ));
    }
    let body = format!("tw2.{fleet}.{quota}.{lease}.{epoch}");
    let mac = handle_mac(secret, &body);
    Ok(format!("{body}.{mac}"))
}

/// A handle presented for (`fleet`, `quota`): its lease id and epoch. 403 when it names
/// another fleet or quota, 404 when it is malformed or its MAC is wrong. A handle of the
/// first format (`tw1.<fleet>.<quota>.<id>.<MAC>`, before epochs) is of epoch `0`.
pub fn open_handle(
    secret: &str,
    fleet: &str,
    quota: &str,
    handle: &str,
) -> Result<(u64, String), Refusal> {
    let unknown = || Refusal::new(404, "unknown_lease", "no such lease".into());
    if handle.len() > 256 {
        return Err(unknown());
    }
    let parts: alloc::vec::Vec<&str> = handle.split('.').collect();
    let v1 = parts.len() == 5 && parts[0] == "tw1";
    let v2 = parts.len() == 6 && parts[0] == "tw2" && is_epoch(parts[4]);
    let id = parts
        .get(3)
        .filter(|s| (1..=16).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok());
    let (true, Some(id)) = (v1 || v2, id) else {
        return Err(unknown());
    };
    if parts[1] != fleet || parts[2] != quota {
        return Err(Refusal::new(
            403,
            "forbidden",
            "this lease belongs to another fleet or quota".into(),
        ));
    }
    let (body, given) = handle.rsplit_once('.').unwrap_or((handle, ""));
    if !same_bytes(handle_mac(secret, body).as_bytes(), given.as_bytes()) {
        return Err(unknown());
    }
    Ok((id, String::from(if v1 { "0" } else { parts[4] })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    const SECRET: &str = "the-fleet-secret-0123456789";

    fn fleet(open: ProxyOpen) -> Fleet {
        Fleet {
            secret: SECRET.into(),
            admin_secret: Some("the-admin-secret-0123456789".into()),
            proxy_open: open,
            quotas: BTreeMap::new(),
        }
    }

    fn bearer_of(s: &str) -> String {
        format!("Bearer {s}")
    }

    #[test]
    fn credentials_and_handles_are_the_workers() {
        // Node's HMAC on the same keys and bodies (what the Worker's WebCrypto made before this
        // module: existing credentials and handles still open).
        assert_eq!(
            agent_credential(SECRET, "f", "alice").unwrap(),
            "twa1.f.alice.plImHwxqkNtk537kHnL-vDTuM2w6xhuPPe7FTIp8NS8"
        );
        assert_eq!(
            sign_handle(SECRET, "f", "q", 42, "abc").unwrap(),
            "tw2.f.q.42.abc.zDChbI00m2RNKbvDGFwgXmFx0b2"
        );
    }

    #[test]
    fn who_a_request_is() {
        let f = fleet(ProxyOpen::Closed);
        let auth = bearer_of(SECRET);
        fn by<'a>(token: Option<&'a str>, authorization: Option<&'a str>) -> Presented<'a> {
            Presented {
                token,
                authorization,
            }
        }
        assert_eq!(
            authenticate(Some(&f), "f", &by(None, Some(&auth)), false, None),
            Ok(Caller {
                agent: None,
                open: false
            })
        );
        // In proxy mode Authorization is the provider's.
        assert_eq!(
            authenticate(Some(&f), "f", &by(None, Some(&auth)), true, None)
                .unwrap_err()
                .status,
            401
        );
        assert!(authenticate(Some(&f), "f", &by(Some(SECRET), None), true, None).is_ok());
        // An unknown fleet is a wrong secret.
        let e = authenticate(None, "g", &by(None, Some(&auth)), false, None).unwrap_err();
        assert_eq!(e.message, "wrong bearer secret for this fleet");
        let cred = agent_credential(SECRET, "f", "alice").unwrap();
        assert_eq!(
            authenticate(Some(&f), "f", &by(Some(&cred), None), true, None)
                .unwrap()
                .agent
                .as_deref(),
            Some("alice")
        );
        // Another fleet's, a forged MAC, a credential for no fleet.
        for bad in [
            agent_credential(SECRET, "g", "alice").unwrap(),
            format!("{}x", &cred[..cred.len() - 1]),
        ] {
            assert_eq!(
                authenticate(Some(&f), "f", &by(Some(&bad), None), false, None)
                    .unwrap_err()
                    .message,
                "wrong agent credential for this fleet"
            );
        }
        assert!(authenticate(None, "f", &by(Some(&cred), None), false, None).is_err());
        // Open proxies.
        let open = fleet(ProxyOpen::Open);
        assert!(
            authenticate(Some(&open), "f", &by(None, None), true, None)
                .unwrap()
                .open
        );
        let by_credential = fleet(ProxyOpen::Credential);
        let e = authenticate(Some(&by_credential), "f", &by(None, None), true, None).unwrap_err();
        assert!(e.message.contains("only from an agent credential"));
        // Oversized: refused before hashing.
        let big = "x".repeat(MAX_SECRET_CHARS + 1);
        for p in [by(Some(&big), None), by(None, Some(&bearer_of(&big)))] {
            let e = authenticate(Some(&f), "f", &p, false, None).unwrap_err();
            assert!(e.message.contains("longer than 512"), "{}", e.message);
        }
        // The admin secret, and only it.
        let admin = bearer_of("the-admin-secret-0123456789");
        assert!(authenticate_admin(Some(&f), &by(None, Some(&admin))).is_ok());
        assert!(authenticate_admin(Some(&f), &by(None, Some(&auth))).is_err());
        assert!(authenticate_admin(Some(&fleet(ProxyOpen::Closed)), &by(None, None)).is_err());
    }

    #[test]
    fn handles_open_for_their_quota_only() {
        let h = sign_handle(SECRET, "f", "q", 42, "abc").unwrap();
        assert_eq!(open_handle(SECRET, "f", "q", &h), Ok((42, "abc".into())));
        assert_eq!(open_handle(SECRET, "f", "r", &h).unwrap_err().status, 403);
        assert_eq!(
            open_handle("another-secret-0123456", "f", "q", &h)
                .unwrap_err()
                .status,
            404
        );
        for bad in [
            "",
            "tw2.f.q.x.abc.m",
            "tw2.f.q.1.ABC.m",
            "tw3.f.q.1.a.m",
            &"a".repeat(300),
        ] {
            assert_eq!(
                open_handle(SECRET, "f", "q", bad).unwrap_err().status,
                404,
                "{bad}"
            );
        }
        assert!(sign_handle(SECRET, "f", "q", 1, "Bad").is_err());
        assert_eq!(check_name("fleet", "a b").unwrap_err().status, 404);
    }
}
