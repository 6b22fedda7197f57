//! The simulated provider: one API key metered the way Anthropic meters it.
//!
//! Continuous token buckets for input tokens/min, output tokens/min and requests/min
//! (capacity = the limit, refilled at limit/minute, never reset at a boundary), a
//! concurrency limit, and a prompt cache per caller with a five-minute lifetime whose reads
//! do not count toward input tokens/min. Output tokens are charged as they are produced
//! (at completion); a request is admitted only while the output bucket is not in debt.
//! Refusals are 429s with `retry-after` and `anthropic-ratelimit-*` headers, remaining
//! figures rounded to the nearest thousand as the real API does.

use super::time::rfc3339;

/// Milliseconds in the provider's rate window.
pub const WINDOW_MS: u64 = 60_000;
/// Prompt-cache lifetime after the last use.
pub const CACHE_TTL_MS: u64 = 300_000;

/// A continuous bucket in token-milliseconds (exact, like the core's).
#[derive(Clone, Debug)]
pub struct SimBucket {
    /// Capacity per window.
    pub limit: u64,
    level: i128,
    updated: u64,
}

impl SimBucket {
    fn new(limit: u64) -> Self {
        SimBucket {
            limit,
            level: i128::from(limit) * i128::from(WINDOW_MS),
            updated: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        let full = i128::from(self.limit) * i128::from(WINDOW_MS);
        let add = i128::from(now.saturating_sub(self.updated)) * i128::from(self.limit);
        self.level = (self.level + add).min(full);
        self.updated = self.updated.max(now);
    }

    /// Whole tokens available (negative in debt).
    pub fn available(&self) -> i128 {
        self.level.div_euclid(i128::from(WINDOW_MS))
    }

    fn take(&mut self, n: u64) {
        self.level -= i128::from(n) * i128::from(WINDOW_MS);
    }

    /// Milliseconds until `n` tokens are available.
    fn ms_until(&self, n: u64) -> u64 {
        let need = i128::from(n) * i128::from(WINDOW_MS) - self.level;
        if need <= 0 {
            0
        } else {
            u64::try_from((need + i128::from(self.limit) - 1) / i128::from(self.limit.max(1)))
                .unwrap_or(u64::MAX)
        }
    }
}

/// The limits of one key.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Input tokens per minute.
    pub input_tpm: u64,
    /// Output tokens per minute.
    pub output_tpm: u64,
    /// Requests per minute.
    pub rpm: u64,
    /// Requests in flight at once.
    pub concurrent: u64,
}

/// What a caller sends.
#[derive(Clone, Copy, Debug)]
pub struct Send {
    /// Who sends (index into the provider's cache table).
    pub caller: usize,
    /// New prompt tokens (never cached).
    pub new_tokens: u64,
    /// Prompt tokens that the caller's cache covers when warm.
    pub prefix_tokens: u64,
}

/// An admitted request.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    /// Uncached input charged (new tokens, plus the prefix when the cache was cold).
    pub input_tokens: u64,
    /// Prefix tokens written to the cache (cold cache).
    pub cache_creation: u64,
    /// Prefix tokens read from the cache (warm).
    pub cache_read: u64,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// Input tokens/min.
    Input,
    /// Output tokens/min.
    Output,
    /// Requests/min.
    Requests,
    /// Concurrent requests.
    Concurrent,
}

/// A 429.
#[derive(Clone, Debug)]
pub struct Refused {
    /// The limit.
    pub exceeded: Exceeded,
    /// The response headers.
    pub headers: Vec<(String, String)>,
    /// Retry-After, seconds.
    pub retry_after_s: u64,
}

/// The key, as the provider sees it.
#[derive(Clone, Debug)]
pub struct Provider {
    /// Its limits.
    pub limits: Limits,
    input: SimBucket,
    output: SimBucket,
    requests: SimBucket,
    in_flight: u64,
    cache_warm_until: Vec<Option<u64>>,
    /// Wall-clock epoch of simulated time zero (Unix ms), for RFC 3339 resets.
    pub epoch_unix_ms: u64,
    /// Most requests seen in flight at once.
    pub max_in_flight_seen: u64,
    /// Lowest level (tokens) each bucket reached right after an admission: never below 0
    /// for input and requests (the provider refuses instead).
    pub min_input_after_admit: i128,
}

impl Provider {
    /// A provider for `callers` callers.
    pub fn new(limits: Limits, callers: usize, epoch_unix_ms: u64) -> Self {
        Provider {
            limits,
            input: SimBucket::new(limits.input_tpm),
            output: SimBucket::new(limits.output_tpm),
            requests: SimBucket::new(limits.rpm),
            in_flight: 0,
            cache_warm_until: vec![None; callers],
            epoch_unix_ms,
            max_in_flight_seen: 0,
            min_input_after_admit: i128::MAX,
        }
    }

    fn refill(&mut self, now: u64) {
        self.input.refill(now);
        self.output.refill(now);
        self.requests.refill(now);
    }

    fn cache_warm(&self, caller: usize, now: u64) -> bool {
        self.cache_warm_until
            .get(caller)
            .copied()
            .flatten()
            .is_some_and(|w| now < w)
    }

    /// Admits or refuses a request at `now`.
    pub fn send(&mut self, now: u64, s: &Send) -> Result<Admitted, Refused> {
        self.refill(now);
        let warm = self.cache_warm(s.caller, now);
        let input = s.new_tokens + if warm { 0 } else { s.prefix_tokens };
        let refusal = if self.in_flight >= self.limits.concurrent {
            Some((Exceeded::Concurrent, 1_000))
        } else if self.requests.available() < 1 {
            Some((Exceeded::Requests, self.requests.ms_until(1)))
        } else if self.input.available() < i128::from(input) {
            let wait = if input > self.limits.input_tpm {
                WINDOW_MS
            } else {
                self.input.ms_until(input)
            };
            Some((Exceeded::Input, wait))
        } else if self.output.available() < 0 {
            Some((Exceeded::Output, self.output.ms_until(0)))
        } else {
            None
        };
        if let Some((exceeded, wait_ms)) = refusal {
            let retry_after_s = wait_ms.div_ceil(1000).clamp(1, 60);
            let mut headers = self.headers(now);
            headers.push(("retry-after".into(), retry_after_s.to_string()));
            // The gateway in front of the key names the limit that was exceeded.
            let kind = match exceeded {
                Exceeded::Input => "input_tokens_per_minute",
                Exceeded::Output => "output_tokens_per_minute",
                Exceeded::Requests => "requests_per_minute",
                Exceeded::Concurrent => "parallel_requests",
            };
            headers.push(("rate_limit_type".into(), kind.into()));
            return Err(Refused {
                exceeded,
                headers,
                retry_after_s,
            });
        }
        self.input.take(input);
        self.requests.take(1);
        self.in_flight += 1;
        self.max_in_flight_seen = self.max_in_flight_seen.max(self.in_flight);
        self.min_input_after_admit = self.min_input_after_admit.min(self.input.available());
        if s.prefix_tokens > 0 {
            if let Some(slot) = self.cache_warm_until.get_mut(s.caller) {
                *slot = Some(now + CACHE_TTL_MS);
            }
        }
        Ok(Admitted {
            input_tokens: input,
            cache_creation: if warm { 0 } else { s.prefix_tokens },
            cache_read: if warm { s.prefix_tokens } else { 0 },
        })
    }

    /// A response finished, having produced `output` tokens.
    pub fn complete(&mut self, now: u64, caller: usize, prefix_tokens: u64, output: u64) {
        self.refill(now);
        self.output.take(output);
        self.in_flight = self.in_flight.saturating_sub(1);
        if prefix_tokens > 0 {
            if let Some(slot) = self.cache_warm_until.get_mut(caller) {
                *slot = Some(now + CACHE_TTL_MS);
            }
        }
    }

    /// Rate-limit headers as of `now` (Anthropic's names; remaining tokens rounded to the
    /// nearest thousand).
    pub fn headers(&mut self, now: u64) -> Vec<(String, String)> {
        self.refill(now);
        let round = |v: i128| ((v.max(0) + 500) / 1000 * 1000).to_string();
        let reset = |b: &SimBucket| rfc3339(self.epoch_unix_ms + now + b.ms_until(b.limit));
        vec![
            (
                "anthropic-ratelimit-input-tokens-limit".into(),
                self.limits.input_tpm.to_string(),
            ),
            (
                "anthropic-ratelimit-input-tokens-remaining".into(),
                round(self.input.available()),
            ),
            (
                "anthropic-ratelimit-input-tokens-reset".into(),
                reset(&self.input),
            ),
            (
                "anthropic-ratelimit-output-tokens-limit".into(),
                self.limits.output_tpm.to_string(),
            ),
            (
                "anthropic-ratelimit-output-tokens-remaining".into(),
                round(self.output.available()),
            ),
            (
                "anthropic-ratelimit-output-tokens-reset".into(),
                reset(&self.output),
            ),
            (
                "anthropic-ratelimit-requests-limit".into(),
                self.limits.rpm.to_string(),
            ),
            (
                "anthropic-ratelimit-requests-remaining".into(),
                self.requests.available().max(0).to_string(),
            ),
            (
                "anthropic-ratelimit-requests-reset".into(),
                reset(&self.requests),
            ),
            (
                "date".into(),
                super::time::http_date(self.epoch_unix_ms + now),
            ),
        ]
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            input_tpm: 60_000,
            output_tpm: 6_000,
            rpm: 60,
            concurrent: 2,
        }
    }

    #[test]
    fn never_admits_beyond_its_input_bucket() {
        let mut p = Provider::new(limits(), 1, 0);
        let s = Send {
            caller: 0,
            new_tokens: 20_000,
            prefix_tokens: 0,
        };
        let mut admitted = 0u64;
        for t in (0..120_000).step_by(100) {
            if let Ok(a) = p.send(t, &s) {
                admitted += a.input_tokens;
                p.complete(t, 0, 0, 10);
            }
        }
        // Capacity 60k at start plus 60k/min refill over 2 minutes.
        assert!(admitted <= 60_000 + 120_000, "{admitted}");
        assert!(p.min_input_after_admit >= 0);
    }

    #[test]
    fn warm_cache_reads_are_free_of_input_limit() {
        let mut p = Provider::new(limits(), 1, 0);
        let s = Send {
            caller: 0,
            new_tokens: 1_000,
            prefix_tokens: 50_000,
        };
        let a = p.send(0, &s).unwrap();
        assert_eq!((a.input_tokens, a.cache_creation), (51_000, 50_000));
        p.complete(10, 0, 50_000, 10);
        let a = p.send(20, &s).unwrap();
        assert_eq!((a.input_tokens, a.cache_read), (1_000, 50_000));
        p.complete(30, 0, 50_000, 10);
        // Five minutes after the last use the cache is gone.
        let a = p.send(30 + CACHE_TTL_MS, &s).unwrap();
        assert_eq!(a.cache_creation, 50_000);
    }

    #[test]
    fn refuses_with_headers_and_retry_after() {
        let mut p = Provider::new(limits(), 1, 1_795_000_000_000);
        let s = Send {
            caller: 0,
            new_tokens: 50_000,
            prefix_tokens: 0,
        };
        p.send(0, &s).unwrap();
        let r = p.send(0, &s).unwrap_err();
        assert_eq!(r.exceeded, Exceeded::Input);
        assert_eq!(r.retry_after_s, 40, "40k short at 1k/s");
        assert!(
            r.headers
                .iter()
                .any(|(n, v)| n == "anthropic-ratelimit-input-tokens-remaining" && v == "10000")
        );
    }

    #[test]
    fn enforces_concurrency() {
        let mut p = Provider::new(limits(), 1, 0);
        let s = Send {
            caller: 0,
            new_tokens: 1,
            prefix_tokens: 0,
        };
        p.send(0, &s).unwrap();
        p.send(0, &s).unwrap();
        assert_eq!(p.send(0, &s).unwrap_err().exceeded, Exceeded::Concurrent);
        p.complete(5, 0, 0, 1);
        assert!(p.send(5, &s).is_ok());
    }
}
