//! tokenwarden on tokio: the coordinator in this process, and every model call governed the
//! way the npm package's `fetch` wrapper governs it — leased before it is sent (its input
//! estimated by the provider crate, its output reserved), waiting in the fair queue instead
//! of a retry storm, the lease renewed while the answer streams, settled from the usage the
//! answer reports, a 429 answered by the core (pause, wait, send again) — through a
//! [`reqwest-middleware`](https://docs.rs/reqwest-middleware) middleware
//! ([`middleware::TokenwardenMiddleware`]) or a [`tower`](https://docs.rs/tower) layer
//! ([`layer::TokenwardenLayer`]).
//!
//! This crate is a host: it moves bytes, runs timers and hands the core's answers to the
//! tasks that wait on them. Every decision — what a request costs, when it is sent, how long
//! it waits, whether a 429 is retried, when the lease is renewed, how it ends — is
//! `tokenwarden-core`'s and `tokenwarden-provider`'s, through the core's one protocol
//! ([`Tokenwarden::handle`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tokenwarden_tokio::{Agent, Tokenwarden};
//! use tokenwarden_tokio::middleware::TokenwardenMiddleware;
//!
//! // One coordinator for the key the agents share (its limits: a core config).
//! let tw = Tokenwarden::from_config_json(r#"{"pools":[{"name":"default",
//!     "requests_per_minute":50,"input_tokens_per_minute":30000,
//!     "output_tokens_per_minute":8000}]}"#)?;
//! // Each agent's own client: its calls lease under its name.
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(TokenwardenMiddleware::new(tw.clone(), Agent::named("planner")))
//!     .build();
//! let answer = client
//!     .post("https://api.anthropic.com/v1/messages")
//!     .header("x-api-key", "…")
//!     .header("anthropic-version", "2023-06-01")
//!     .body(r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hi"}]}"#)
//!     .send()
//!     .await?;
//! println!("{}", answer.text().await?);
//! # Ok(()) }
//! ```
//!
//! A request that is not a model call (`provider::model_call`: token counting, model lists,
//! a `GET`) passes through untouched; a model call whose body is not a JSON object is sent
//! unleased (the provider refuses it without generating anything). When tokenwarden itself
//! ends a call (a refusal the core says waiting does not cure, a call given up after the
//! provider's own refusals, a model with no pool) the answer is an error in the provider's
//! own format (`tokenwarden_provider::errors`), marked `x-tokenwarden-refusal: 1`, so the
//! official clients raise their usual error.

mod body;
mod call;
mod host;
#[cfg(feature = "tower")]
pub mod layer;
#[cfg(feature = "reqwest")]
pub mod middleware;
mod refusal;

pub use body::MeteredBody;
pub use call::{Agent, HeldCall, LongWait, LongWaitHook};
pub use host::{Builder, Error, EventHook, OutputHook, Tokenwarden};
pub use refusal::Refusal;
pub use tokenwarden_core as core;
pub use tokenwarden_provider as provider;
