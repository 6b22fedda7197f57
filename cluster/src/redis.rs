//! [`Elector`] on Redis or Valkey (7 or later): each call one Lua script, atomic on the
//! server.
//!
//! A quota's records, all under its [`QuotaKey`] (one hash slot):
//! - `…:owner`: `"<token> <owner id>"`, with the owner lease's expiry (`PX`);
//! - `…:token`: the last token given (`INCR`): a new owner's is one more (and more than
//!   the saved state's, should this key be lost on its own);
//! - `…:state`: a hash, `token` (the saver's) and `body` (the state);
//! - `…:members`: a sorted set, instance id → its last heartbeat, by the server's `TIME`.

use std::time::Duration;

use tokio::time::Instant;

use crate::resp::{Client, Reply, Target};
use crate::{Elector, Pending, QuotaKey, Saved, StoreError, Stored, Term, term_end};

/// Takes or renews the owner lease. KEYS: owner, token, state. ARGV: me, ttl ms.
/// Answers `{mine, token, owner, pttl}`. A new token is above the last given and above
/// the last saved state's (should the counter alone have been lost: evicted, deleted).
const CAMPAIGN: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, ' ', 1, true)
  local tok = tonumber(string.sub(cur, 1, sep - 1))
  local who = string.sub(cur, sep + 1)
  if who == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tok, who, tonumber(ARGV[2])}
  end
  return {0, tok, who, redis.call('PTTL', KEYS[1])}
end
local tok = redis.call('INCR', KEYS[2])
local saved = tonumber(redis.call('HGET', KEYS[3], 'token') or '0')
if saved >= tok then
  tok = saved + 1
  redis.call('SET', KEYS[2], tok)
end
redis.call('SET', KEYS[1], tok .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {1, tok, ARGV[1], tonumber(ARGV[2])}
";

/// Ends a term. KEYS: owner. ARGV: `"<token> <me>"`.
const RESIGN: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
";

/// Saves under a term. KEYS: owner, state. ARGV: token, me, body. Answers 1, or 0 fenced.
const SAVE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ' ' .. ARGV[2] then return 0 end
local held = redis.call('HGET', KEYS[2], 'token')
if held and tonumber(held) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], 'token', ARGV[1], 'body', ARGV[3])
return 1
";

/// A heartbeat. KEYS: members. ARGV: me, ttl ms. Answers how many are alive.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 4)
return redis.call('ZCARD', KEYS[1])
";

/// The elector on one Redis or Valkey server.
#[derive(Debug)]
pub struct RedisElector {
    client: Client,
}

impl RedisElector {
    /// The elector on the server at `url` (`redis://[[user]:password@]host[:port][/db]`),
    /// each call given up after `timeout`. Dials on the first call; the error names what
    /// is wrong with the URL.
    pub fn new(url: &str, timeout: Duration) -> Result<RedisElector, String> {
        Ok(RedisElector {
            client: Client::new(Target::parse(url)?, timeout),
        })
    }

    async fn eval(&self, script: &str, keys: &[&str], args: &[&[u8]]) -> Result<Reply, StoreError> {
        let n = keys.len().to_string();
        let mut all: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), n.as_bytes()];
        all.extend(keys.iter().map(|k| k.as_bytes()));
        all.extend_from_slice(args);
        self.client
            .call(&all)
            .await
            .map_err(|e| StoreError(e.to_string()))
    }
}

fn int(r: &Reply) -> Option<i64> {
    match r {
        Reply::Int(n) => Some(*n),
        Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn unexpected(what: &str, r: &Reply) -> StoreError {
    StoreError(format!("Redis answered {what} with {r:?}"))
}

fn millis(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

impl Elector for RedisElector {
    fn campaign<'a>(
        &'a self,
        quota: &'a QuotaKey,
        me: &'a str,
        ttl: Duration,
    ) -> Pending<'a, Term> {
        Box::pin(async move {
            let sent = Instant::now();
            let ttl_ms = millis(ttl);
            let r = self
                .eval(
                    CAMPAIGN,
                    &[&quota.of("owner"), &quota.of("token"), &quota.of("state")],
                    &[me.as_bytes(), ttl_ms.as_bytes()],
                )
                .await?;
            let Reply::Array(items) = &r else {
                return Err(unexpected("a campaign", &r));
            };
            let (Some(mine), Some(token), Some(Reply::Bulk(owner)), Some(pttl)) = (
                items.first().and_then(int),
                items.get(1).and_then(int),
                items.get(2),
                items.get(3).and_then(int),
            ) else {
                return Err(unexpected("a campaign", &r));
            };
            let mine = mine == 1;
            Ok(Term {
                token: u64::try_from(token).map_err(|_| unexpected("a campaign", &r))?,
                owner: String::from_utf8_lossy(owner).into_owned(),
                mine,
                valid_until: if mine {
                    term_end(sent, ttl)
                } else {
                    // Another's: it ends no later than its remaining time from now.
                    Instant::now() + Duration::from_millis(u64::try_from(pttl).unwrap_or(0))
                },
            })
        })
    }

    fn resign<'a>(&'a self, quota: &'a QuotaKey, term: &'a Term) -> Pending<'a, ()> {
        Box::pin(async move {
            let held = format!("{} {}", term.token, term.owner);
            self.eval(RESIGN, &[&quota.of("owner")], &[held.as_bytes()])
                .await
                .map(|_| ())
        })
    }

    fn save<'a>(
        &'a self,
        quota: &'a QuotaKey,
        term: &'a Term,
        state: &'a [u8],
    ) -> Pending<'a, Saved> {
        Box::pin(async move {
            if !term.mine {
                return Ok(Saved::Fenced);
            }
            let token = term.token.to_string();
            let r = self
                .eval(
                    SAVE,
                    &[&quota.of("owner"), &quota.of("state")],
                    &[token.as_bytes(), term.owner.as_bytes(), state],
                )
                .await?;
            match int(&r) {
                Some(1) => Ok(Saved::Written),
                Some(0) => Ok(Saved::Fenced),
                _ => Err(unexpected("a save", &r)),
            }
        })
    }

    fn load<'a>(&'a self, quota: &'a QuotaKey) -> Pending<'a, Option<Stored>> {
        Box::pin(async move {
            let key = quota.of("state");
            let r = self
                .client
                .call(&[b"HMGET", key.as_bytes(), b"token", b"body"])
                .await
                .map_err(|e| StoreError(e.to_string()))?;
            match &r {
                Reply::Array(items) => match (items.first(), items.get(1)) {
                    (Some(Reply::Nil), _) | (_, Some(Reply::Nil)) => Ok(None),
                    (Some(t), Some(Reply::Bulk(body))) => Ok(Some(Stored {
                        token: int(t)
                            .and_then(|n| u64::try_from(n).ok())
                            .ok_or_else(|| unexpected("a load", &r))?,
                        state: body.clone(),
                    })),
                    _ => Err(unexpected("a load", &r)),
                },
                _ => Err(unexpected("a load", &r)),
            }
        })
    }

    fn heartbeat<'a>(
        &'a self,
        quota: &'a QuotaKey,
        me: &'a str,
        ttl: Duration,
    ) -> Pending<'a, u64> {
        Box::pin(async move {
            let ttl_ms = millis(ttl);
            let r = self
                .eval(
                    HEARTBEAT,
                    &[&quota.of("members")],
                    &[me.as_bytes(), ttl_ms.as_bytes()],
                )
                .await?;
            int(&r)
                .and_then(|n| u64::try_from(n).ok())
                .map(|n| n.max(1))
                .ok_or_else(|| unexpected("a heartbeat", &r))
        })
    }

    fn leave<'a>(&'a self, quota: &'a QuotaKey, me: &'a str) -> Pending<'a, ()> {
        Box::pin(async move {
            let key = quota.of("members");
            self.client
                .call(&[b"ZREM", key.as_bytes(), me.as_bytes()])
                .await
                .map(|_| ())
                .map_err(|e| StoreError(e.to_string()))
        })
    }
}
