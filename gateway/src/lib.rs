//! # tokenwarden-gateway
//!
//! tokenwarden's HTTP gateway written once, sans-IO, for every host that serves it (the edge
//! Worker on Cloudflare or workerd, `tokenwarden serve`): what it reads, what it refuses and
//! what it answers, decided here; a host moves bytes and stores state.
//!
//! This first part is the fleets configuration ([`config`]): the one JSON a deployment is
//! configured with (the Worker's `TOKENWARDEN_FLEETS` secret, `serve --config`'s file), read
//! strictly, so a typo or a value out of range is refused at start with the place named
//! (`fleets.acme.quotas.main.upstrem: unknown field`) instead of starting a gateway that
//! answers every call 404 or has no limit. The second is the proxy's first step
//! ([`proxy`]): from a proxied request what is sent to the provider and what names the
//! call, or why it is refused. The third is the members of a quota ([`members`]): what a
//! member of the fleet may send through the HTTP API, checked against who it is, and the
//! table of the leases and tickets members hold ([`names`]: the ids of their agents;
//! [`json`]: the camelCase JSON every host reads, with the field at fault named). Then who a
//! request is ([`auth`]: fleet secrets, agent credentials, the admin secret, lease handles;
//! [`mac`]: what they are made of) and which route of the API it is ([`routes`]).
//! And how a quota's metrics read in Prometheus's text format ([`prometheus`]), and what a
//! client of the API makes of an answer ([`limiter`]: read it, or ask again while an owner
//! moves, or lease locally when no limiter answered).
//!
//! ```
//! use tokenwarden_gateway::config::{Fleets, ProxyOpen};
//!
//! let fleets = Fleets::from_json(r#"{ "acme": { "secret": "a-fleet-secret-of-32-characters",
//!     "proxy_open": "credential",
//!     "quotas": { "main": { "config": { "pools": [{ "name": "default" }] },
//!                           "upstream": "https://api.anthropic.com" } } } }"#).unwrap();
//! assert_eq!(fleets.fleets["acme"].proxy_open, ProxyOpen::Credential);
//!
//! let typo = Fleets::from_json(r#"{ "acme": { "secret": "a-fleet-secret-of-32-characters",
//!     "quotas": { "main": { "config": { "pools": [{ "name": "default" }] },
//!                           "upstrem": "https://api.anthropic.com" } } } }"#).unwrap_err();
//! assert_eq!(typo.path, "fleets.acme.quotas.main.upstrem");
//! ```

#![no_std]

extern crate alloc;

use alloc::string::String;

pub mod answers;
pub mod auth;
pub mod config;
pub mod json;
pub mod limiter;
pub mod mac;
pub mod members;
pub mod names;
pub mod prometheus;
pub mod proxy;
pub mod routes;
pub mod timeline;
pub mod waitlog;

/// Why the gateway refuses a request: the HTTP status, a stable code, what was wrong and,
/// where one is at fault, the field (a header's name, a body's field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status (400, 403, 404, 409).
    pub status: u16,
    /// A stable code: `invalid_argument`, `forbidden`, `not_found`, `unknown_lease`, …
    pub code: &'static str,
    /// What was wrong, in words.
    pub message: String,
    /// The field at fault, if one is.
    pub field: Option<String>,
}

impl Refusal {
    /// A refusal with no field named.
    #[must_use]
    pub fn new(status: u16, code: &'static str, message: String) -> Refusal {
        Refusal {
            status,
            code,
            message,
            field: None,
        }
    }

    /// Names the field at fault.
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Refusal {
        self.field = Some(field.into());
        self
    }

    /// The HTTP status the API answers for an error of the engine's with stable `code` (the
    /// core's refusals, and `aborted`: the client went away, 499); `None` for a code that is
    /// not one (an internal error, 500).
    #[must_use]
    pub fn status_of(code: &str) -> Option<u16> {
        Some(match code {
            "unknown_lease" | "unknown_task" => 404,
            "not_granted" | "too_many_tasks" => 409,
            "forbidden" => 403,
            "unknown_pool" | "too_large" | "invalid_argument" => 400,
            "aborted" => 499,
            _ => return None,
        })
    }
}
