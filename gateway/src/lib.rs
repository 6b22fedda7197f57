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
//! call, or why it is refused.
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

pub mod config;
pub mod proxy;
